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


class PingStream:
    """Pings ``dst`` from ``src`` on an :class:`~dataplane.testbed.overlay.Overlay` every
    ``interval`` s until :meth:`stop`, for at most ``seconds``."""

    def __init__(self, overlay, src, dst: str, interval: float, seconds: float):
        self._tb = overlay.tb
        self.replies: list[tuple[float, int, float]] = []     # (wall-clock time, seq, RTT ms)
        self.proc = overlay.tb.popen(src, ["ping", "-n", "-D", "-i", str(interval), "-W", "1",
                                           "-w", str(int(seconds + 0.999)), dst])
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            m = _REPLY.match(line)
            if m:
                self.replies.append((float(m.group(1)), int(m.group(2)), float(m.group(3))))

    def stop(self) -> dict:
        """Stop the stream; {"replies", "lost", "max_rtt_ms"} (lost -1: no reply at all)."""
        self._tb.kill(self.proc, sig=signal.SIGINT)
        self._reader.join(5)
        seqs = {seq for _, seq, _ in self.replies}
        return {"replies": len(seqs),
                "lost": (max(seqs) - min(seqs) + 1 - len(seqs)) if seqs else -1,
                "first_seq": min(seqs, default=None),
                "max_rtt_ms": max((rtt for *_, rtt in self.replies), default=None)}
