"""Traffic across a daemon restart: paced UDP and TCP, both ways between two testbed hosts, and
what each stream saw (tests/integration/paced_streams.py does the sending and receiving).

    a (the host whose daemon restarts) <=== overlay ===> b
      UDP a -> b and b -> a: UDP_RATE datagrams/s each, numbered: lost = sent - distinct received
      TCP a -> b and b -> a: TCP_CHUNK bytes TCP_RATE times/s each: the longest silence at the
                             receiver, whether it reset, whether every byte arrived

The streams span the action whatever it takes: they start, run WARMUP_S, the action runs, and
they run SETTLE_S more after it returns, so that what comes after the action is measured too (a
daemon that forwards nothing once it is back loses SETTLE_S worth of datagrams). Every process
runs inside its host, is bounded in packets and time (MAX_S at most), and is killed by PID when
the measurement ends, also when it fails.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paced_streams.py")
UDP_RATE = 1000              # datagrams/s each way
TCP_RATE = 250               # writes/s each way
TCP_CHUNK = 8192             # bytes a write: 2 MB/s each way
UDP_PORT, TCP_PORT = 7801, 7802
WARMUP_S = 0.5               # traffic before the action: 500 datagrams and 125 writes each way
SETTLE_S = 1.0               # and after it: a daemon back but not forwarding loses 1000
MAX_S = 120.0                # the streams' own bound, should the action never return


@dataclass
class Outcome:
    """What the streams saw; ``udp``/``tcp`` keyed by direction ("a->b", "b->a")."""
    udp: dict = field(default_factory=dict)      # {"sent", "received", "distinct", "lost", ...}
    tcp: dict = field(default_factory=dict)      # {"sent": {...}, "received": {...}}
    action_s: float = 0.0                        # how long the restart itself took
    streamed_s: float = 0.0                      # from the senders' start to their stop
    counters: dict = field(default_factory=dict)  # per host: the kernel's drop counters, deltas

    def udp_lost(self) -> dict:
        return {d: r["lost"] for d, r in self.udp.items()}

    def tcp_max_gap_ms(self) -> dict:
        return {d: r["received"]["max_gap_ms"] for d, r in self.tcp.items()}

    def tcp_problems(self) -> list[str]:
        """Resets, errors, bytes that did not arrive intact."""
        out = []
        for d, r in self.tcp.items():
            s, rcv = r["sent"], r["received"]
            if s.get("error") or rcv.get("error"):
                out.append(f"{d}: sender {s.get('error')}, receiver {rcv.get('error')}")
            elif (s["bytes"], s["sha256"]) != (rcv["bytes"], rcv["sha256"]):
                out.append(f"{d}: sent {s['bytes']} bytes, received {rcv['bytes']} "
                           f"(hashes {'equal' if s['sha256'] == rcv['sha256'] else 'differ'})")
        return out

    def summary(self) -> str:
        return (f"UDP lost {self.udp_lost()} of {UDP_RATE}/s each way; TCP longest silence (ms) "
                f"{self.tcp_max_gap_ms()}; UDP longest silence (ms) "
                f"{ {d: r['max_gap_ms'] for d, r in self.udp.items()} }; restart took "
                f"{self.action_s:.2f} s of the streams' {self.streamed_s:.1f} s")

    def assert_lost_only_what_the_kernel_dropped(self) -> None:
        """As after a crash: what was lost did not fit in a kernel queue on its way (the sending
        host's full flannel0 queue; on the receiving host a full socket buffer, its engine's or
        the stream's sink, or a full flannel0 write: the burst a restarted engine drains can
        overflow them) or was in the killed engine's hands (a batch per queue, two queues)."""
        from dataplane.engine.api import DEFAULT_BATCH
        in_hands = 2 * DEFAULT_BATCH
        for direction, (src, dst) in (("a->b", ("a", "b")), ("b->a", ("b", "a"))):
            s, d = self.counters.get(src, {}), self.counters.get(dst, {})
            queued = (s.get("flannel0_tx_dropped", 0) + d.get("udp_RcvbufErrors", 0)
                      + d.get("flannel0_rx_dropped", 0))
            assert self.udp_lost()[direction] <= queued + in_hands, self.details()

    def details(self) -> str:
        """For a failure: the streams' own reports and where the kernel counted drops."""
        return f"{self.summary()}\nUDP: {self.udp}\nkernel drop counters: {self.counters}"


def kernel_counters(tb, host) -> dict:
    """flannel0's dropped packets (a queue that overflowed) and UDP's receive errors."""
    out = {}
    r = tb.exec(host, ["ip", "-s", "-j", "link", "show", "flannel0"])
    if r.returncode == 0:
        s = json.loads(r.stdout)[0]["stats64"]
        out.update(flannel0_tx_dropped=s["tx"]["dropped"], flannel0_rx_dropped=s["rx"]["dropped"])
    r = tb.exec(host, ["cat", "/proc/net/snmp"])
    rows = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("Udp:")]
    if len(rows) == 2:
        udp = dict(zip(rows[0], rows[1]))
        out.update({f"udp_{k}": int(udp[k]) for k in ("RcvbufErrors", "InErrors", "NoPorts")
                    if k in udp})
    return out


def _json_line(proc, timeout: float) -> dict:
    out, err = proc.communicate(timeout=timeout)
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if not lines:
        raise AssertionError(f"no result from a stream process (rc {proc.returncode}): "
                             f"{out[-500:]} {err[-1000:]}")
    return json.loads(lines[-1])


def across(tb, a, b, ip_a: str, ip_b: str, action) -> Outcome:
    """Run the streams WARMUP_S, then ``action()``, then SETTLE_S more; the addresses may be
    of either family."""
    py = sys.executable
    sink_s = MAX_S + 30
    procs = []

    def start(host, *args):
        p = tb.popen(host, [py, SCRIPT, *map(str, args)])
        procs.append(p)
        return p

    def first_line(key, p, want: str) -> None:
        line = p.stdout.readline()
        assert line.startswith(want), f"{key}: {line!r} {'' if line else p.stderr.read()[-1000:]}"

    hosts = {"a": a, "b": b}
    before = {n: kernel_counters(tb, h) for n, h in hosts.items()}
    try:
        sinks = {
            ("udp", "a->b"): start(b, "udp-sink", ip_b, UDP_PORT, sink_s),
            ("udp", "b->a"): start(a, "udp-sink", ip_a, UDP_PORT, sink_s),
            ("tcp", "a->b"): start(b, "tcp-sink", ip_b, TCP_PORT, sink_s),
            ("tcp", "b->a"): start(a, "tcp-sink", ip_a, TCP_PORT, sink_s),
        }
        for key, p in sinks.items():
            first_line(key, p, "ready")
        udp_count = int(UDP_RATE * MAX_S)
        senders = {
            ("udp", "a->b"): start(a, "udp-send", ip_b, UDP_PORT, UDP_RATE, udp_count),
            ("udp", "b->a"): start(b, "udp-send", ip_a, UDP_PORT, UDP_RATE, udp_count),
            ("tcp", "a->b"): start(a, "tcp-send", ip_b, TCP_PORT, TCP_RATE, TCP_CHUNK, MAX_S),
            ("tcp", "b->a"): start(b, "tcp-send", ip_a, TCP_PORT, TCP_RATE, TCP_CHUNK, MAX_S),
        }
        for key, p in senders.items():
            first_line(key, p, "sending")
        streaming = time.monotonic()
        time.sleep(WARMUP_S)
        t0 = time.monotonic()
        action()
        out = Outcome(action_s=time.monotonic() - t0)
        time.sleep(SETTLE_S)
        for p in senders.values():
            p.send_signal(signal.SIGUSR1)
        out.streamed_s = time.monotonic() - streaming
        assert out.streamed_s < MAX_S, f"the action took {out.action_s:.0f} s: the streams ended"
        for key, p in senders.items():
            sent = _json_line(p, 60)
            got = _json_line(sinks[key], 60)
            kind, direction = key
            if kind == "udp":
                out.udp[direction] = dict(got, sent=sent["sent"], send_errors=sent["send_errors"],
                                          lost=sent["sent"] - got["distinct"])
            else:
                out.tcp[direction] = {"sent": sent, "received": got}
        for n, h in hosts.items():
            after = kernel_counters(tb, h)
            out.counters[n] = {k: v - before[n].get(k, 0) for k, v in after.items()}
        return out
    finally:
        for p in procs:
            tb.kill(p)
