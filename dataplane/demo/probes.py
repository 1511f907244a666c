"""What the demo sends through the overlay, and what it reads around each sending.

Each probe runs inside a *window*: on both hosts the engine counters (the daemons'
``/metrics``), the trace cursors (``/debug/trace``) and, on the direct path, flannel0's kernel
counters are read before and after it, so a step shows what that one probe cost. The probes
themselves (ping, one UDP datagram, a burst for the batching measurement) run in the workload
namespaces, each bounded in packets and time (``lab.py`` holds their scripts).
"""
from __future__ import annotations

import json
import os
import time

from . import lab, readings
from . import trace as tr
from .errors import DemoError

PING_SIZE = 56                       # ping's default: 56 data + 8 ICMP + 20 IP = 84 bytes
IPV6_HEADER = 40                     # a ping6 of PING_SIZE: 56 + 8 ICMPv6 + 40 = 104 bytes
UDP_TEXT = "hello from a workload on host A"
BURST_COUNT = 3000                   # datagrams per engine in the batching measurement
BURST_SIZE = 36                      # UDP payload: 36 + 8 + 20 = a 64-byte IP packet
BURST_CHUNK = 100                    # sent back to back, then a short pause: real traffic is bursty
BURST_GAP_S = 0.002
SETTLE_S = 0.15                      # the loops finish their EAGAIN reads and polls after a probe


class Meter:
    """Reads both hosts' engine counters, trace rings and flannel0 counters."""

    def __init__(self, ov, direct: bool):
        self.ov, self.direct = ov, direct
        self.hosts = dict(zip("AB", ov.hosts))

    def stats(self, raw: dict | None = None) -> dict:
        """The engine counters by role, as the daemons export them on GET /metrics; ``raw``
        (by role) also gets the flannel_udp_* samples as read."""
        out = {}
        for role, h in self.hosts.items():
            m = self.ov.metrics(h)
            if raw is not None:
                raw[role] = {k: v for k, v in m.items() if k.startswith("flannel_udp_")}
            out[role] = tr.stats_from_metrics(m)
        return out

    def cursors(self) -> dict:
        """The last trace seq of each host (the daemon's GET /debug/trace, the engine's ring)."""
        out = {}
        for role, h in self.hosts.items():
            ev = self.ov.trace_events(h)
            out[role] = ev[-1]["seq"] if ev else 0
        return out

    def events(self, after: dict) -> dict:
        return {role: self.ov.trace_events(h, after=after[role]) for role, h in self.hosts.items()}

    def flannel0(self) -> dict:
        return {role: tr.link_counters(self.ov.exec(h, ["ip", "-s", "-j", "link", "show",
                                                         "flannel0"]).stdout)
                for role, h in self.hosts.items()}

    def window(self, send) -> dict:
        """Counters and trace cursors before and after ``send()`` on both hosts."""
        cur = self.cursors()
        raw_before, raw_after = {}, {}
        before = self.stats(raw_before)
        if self.direct:
            f0_before = self.flannel0()
        t0 = time.monotonic()
        out = send()
        time.sleep(SETTLE_S)
        after = self.stats(raw_after)
        win = {"result": out, "stats_before": before, "stats_after": after,
               "metrics_before": raw_before, "metrics_after": raw_after,
               "counters": {k: tr.delta(before[k], after[k]) for k in before},
               "events": self.events(cur), "cursor": cur, "t0": t0, "t1": time.monotonic()}
        if self.direct:
            # The kernel's own counters of flannel0: what entered or left the TUN device.
            f0_after = self.flannel0()
            win["flannel0"] = {k: tr.delta(f0_before[k], f0_after[k]) for k in f0_before}
        return win


def ping(meter: Meter, wa, wb) -> dict:
    """One ping from A's workload to B's, in a window."""
    def send():
        r = wa.run(["ping", "-n", "-c", "1", "-W", "2", "-s", str(PING_SIZE), wb.ip], timeout=10)
        return readings.parse_ping(r.stdout, r.returncode)
    win = meter.window(send)
    win["result"].update(size=PING_SIZE, expected_len=PING_SIZE + 8 + 20)
    if not win["result"].get("received"):
        raise DemoError(f"the ping from {wa.ip} to {wb.ip} got no reply: {win['result']}")
    return win


def ping6(meter: Meter, wa, wb) -> dict:
    """One IPv6 ping from A's workload to B's (demo --ipv6), in a window."""
    def send():
        r = wa.run(["ping", "-6", "-n", "-c", "1", "-W", "2", "-s", str(PING_SIZE), wb.ip6],
                   timeout=10)
        return readings.parse_ping(r.stdout, r.returncode)
    win = meter.window(send)
    win["result"].update(size=PING_SIZE, expected_len=PING_SIZE + 8 + IPV6_HEADER)
    if not win["result"].get("received"):
        raise DemoError(f"the IPv6 ping from {wa.ip6} to {wb.ip6} got no reply: {win['result']}")
    return win


def ping_ttl(meter: Meter, wa, wb, ttl: int) -> dict:
    """One ping with a small TTL from A's workload to B's, in a window: whoever answers it
    (``answer``: ping's "From <address> ... Time to live exceeded" line)."""
    def send():
        r = wa.run(["ping", "-n", "-c", "1", "-W", "2", "-t", str(ttl), wb.ip], timeout=10)
        res = readings.parse_ping(r.stdout, r.returncode)
        res.update(ttl_sent=ttl, answer=next((ln.strip() for ln in r.stdout.splitlines()
                                              if ln.startswith("From ")), None))
        return res
    return meter.window(send)


def udp(meter: Meter, wa, wb, echo_log: str) -> dict:
    """One UDP datagram from A's workload to the echo service in B's, in a window."""
    def send():
        r = wa.run([lab.PY, "-c", lab.UDP_CLIENT, wb.ip, str(lab.ECHO_PORT), UDP_TEXT], timeout=10)
        try:
            return json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise DemoError(f"UDP probe failed: {r.stdout} {r.stderr}") from None
    win = meter.window(send)
    win["result"].update(payload=UDP_TEXT, expected_len=len(UDP_TEXT.encode()) + 8 + 20,
                         dport=lab.ECHO_PORT)
    # What B's application saw: the echo service logs each datagram it answers.
    with open(echo_log) as f:
        seen = readings.echo_seen(f.read())
    if seen:
        win["result"]["app_received"] = seen
    if not win["result"].get("received"):
        raise DemoError(f"the UDP packet from {wa.ip} to {wb.ip}:{lab.ECHO_PORT} got no echo")
    return win


def burst(meter: Meter, wa, wb, workdir: str, kind: str) -> dict:
    """BURST_COUNT small datagrams from A's workload to a sink in B's, with the ``kind`` engine
    running: syscalls per packet on each side, from the counters around it."""
    sink_log = os.path.join(workdir, f"sink-{kind}.jsonl")
    sink = wb.popen([lab.PY, "-c", lab.SINK, str(lab.SINK_PORT), "20"], sink_log)
    if not lab.wait_file_line(sink_log, '"ready"', proc=sink):
        raise DemoError("the burst sink did not start")
    before = meter.stats()
    sent = _send_burst(wa, wb)
    received = _sink_settled(sink_log)
    after = meter.stats()
    lab.stop_procs(wb)
    d = {k: tr.delta(before[k], after[k]) for k in before}
    return {"engine": kind, "sent": sent["sent"], "received": received,
            "ip_len": BURST_SIZE + 28, "seconds": round(sent["seconds"], 3),
            "send_side": tr.per_packet(d["A"], "send"),
            "receive_side": tr.per_packet(d["B"], "receive"),
            "counters": d, "stats_before": before, "stats_after": after}


def _send_burst(wa, wb) -> dict:
    r = wa.run([lab.PY, "-c", lab.BURST, wb.ip, str(lab.SINK_PORT), str(BURST_COUNT),
                str(BURST_SIZE), str(BURST_CHUNK), str(BURST_GAP_S)], timeout=30)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DemoError(f"burst sender failed: {r.stdout} {r.stderr}") from None


def _sink_settled(sink_log: str, timeout: float = 5.0) -> int:
    # The counters are read once B's sink stops counting: the last batch is through.
    last, still = -1, 0
    end = time.monotonic() + timeout
    while time.monotonic() < end and still < 3:
        lines = lab.json_lines(sink_log)
        n = lines[-1].get("received", 0) if lines else 0
        still = still + 1 if n == last else 0
        last = n
        time.sleep(0.1)
    return max(last, 0)
