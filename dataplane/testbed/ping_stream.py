"""A ping stream between two hosts for as long as a scenario runs: was anything lost meanwhile?

:class:`PingStream` runs ``ping -D`` in a host (through the testbed: tracked by PID, removed with
it), reads its replies as they come and, once stopped, says how many are missing: the gaps in
``icmp_seq`` from the first reply up to the last one. Echoes before the first reply are not
counted: the route may still be coming (a caller waits for a first reply, Overlay.first_reply,
before it starts the stream); nor is an echo still in flight when the stream stops. A late reply is not a lost one: ping waits for it (``-W``) and prints it.
"""
from __future__ import annotations

import re
import signal
import threading

_REPLY = re.compile(r"^\[(\d+\.\d+)\] .*icmp_seq=(\d+) .*time=([\d.]+) ms")
# iputils ping (Debian 12's 20221126) sends faster than every 10 ms by polling without sleeping:
# `ping -i 0.005` takes a whole core (3.0 s of CPU in 3 s; -i 0.01: 0.01 s), which the scene's
# daemons, etcd and askers then lack (perf/README.md#ping-spin).
MIN_INTERVAL_S = 0.01


class PingStream:
    """Pings ``dst`` from ``src`` on an :class:`~dataplane.testbed.overlay.Overlay` every
    ``interval`` s until :meth:`stop`, for at most ``seconds``."""

    def __init__(self, overlay, src, dst: str, interval: float, seconds: float):
        if interval < MIN_INTERVAL_S:
            raise ValueError(f"a ping stream every {interval:g} s: ping busy-polls a core below "
                             f"{MIN_INTERVAL_S:g} s; use at least that")
        self._tb = overlay.tb
        self.replies: list[tuple[float, int, float]] = []     # (wall-clock time, seq, RTT ms)
        self.proc = overlay.tb.popen(src, ["ping", "-n", "-D", "-i", str(interval), "-W", "1",
                                           "-w", str(int(seconds + 0.999)), dst])
        self._dropped = backlog_drops()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            m = _REPLY.match(line)
            if m:
                self.replies.append((float(m.group(1)), int(m.group(2)), float(m.group(3))))

    def stop(self) -> dict:
        """Stop the stream; {"replies", "lost", "max_rtt_ms"} (lost -1: no reply at all), and
        to tell a loss's cause: "gaps", the first lost icmp_seqs with the wall-clock times of
        the replies around each, and "backlog_drops", what every core's backlog dropped
        meanwhile, machine-wide (another workload's flood loses this stream's packets too)."""
        self._tb.kill(self.proc, sig=signal.SIGINT)
        self._reader.join(5)
        at = {seq: t for t, seq, _ in self.replies}
        seqs = set(at)
        lost = sorted(set(range(min(seqs), max(seqs) + 1)) - seqs) if seqs else []
        return {"replies": len(seqs),
                "lost": (max(seqs) - min(seqs) + 1 - len(seqs)) if seqs else -1,
                "first_seq": min(seqs, default=None),
                "max_rtt_ms": max((rtt for *_, rtt in self.replies), default=None),
                "gaps": [(q, round(at[max(s for s in seqs if s < q)], 3),
                          round(at[min(s for s in seqs if s > q)], 3)) for q in lost[:5]],
                "backlog_drops": backlog_drops() - self._dropped}


def backlog_drops(path: str = "/proc/net/softnet_stat") -> int:
    """The packets the cores' input backlogs dropped since boot (netdev_max_backlog full)."""
    with open(path) as f:
        return sum(int(line.split()[1], 16) for line in f)
