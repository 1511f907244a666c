"""One measurement at a time: UDP trials, the NDR/PDR searches, TCP, latency, cost.

(Over 450 lines as one piece: every measurement runs the same generator, sink and bounds, and
the searches are built of the trials, so they change together.)

Every trial runs the C generator on host A (CPU0) towards the C sink on host
B (CPU1), from 10.5.1.1 to 10.5.2.1 (with ``family=6``, an inner-IPv6 path's,
from fc00:5:0:1::1 to fc00:5:0:2::1), over whatever path is set up. Every
process is bounded twice: by its own count/duration/deadline arguments and
by the timeout of the call that waits for it.
"""
from __future__ import annotations

import json
import logging
import os
import random
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field

from dataplane.engine.api import OFFLOAD_STATS

from .paths import Path, cpu_ns
from .topo import ECHO_PORT, IPERF_PORT, SINK_PORT, BenchTopo

log = logging.getLogger(__name__)

# The two rates of RFC 2544 as FD.io CSIT names them: the NDR (non-drop rate) loses nothing,
# the PDR (partial drop rate) < 0.5 %. Before the NDR existed here, "no-drop" meant the PDR.
PDR_LOSS = 0.005
NDR_LOSS = 0.0
RATE_SLACK = 0.97           # the generator must reach 97 % of a paced target
FLOOD_COUNT = 50_000_000    # bound on a flood's packets (time bounds it first)
SINK_IDLE_MS = 150          # the sink drains until quiet this long after the send


class MeasureError(RuntimeError):
    pass


@dataclass
class Tools:
    udpgen: str
    iperf3: str


def app_ip(side, family: int = 4) -> str:
    """The host's application address of this family (on its lo: topo.py)."""
    return side.app_ip6 if family == 6 else side.app_ip


def hostport(ip: str, port: int) -> str:
    """``ip:port`` as udpgen reads it (an IPv6 address in brackets)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _json_line(text: str, what: str) -> dict:
    for line in reversed((text or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise MeasureError(f"{what}: no result in output {text!r}")


def _wait_ready(proc: subprocess.Popen, what: str, timeout: float = 10.0) -> None:
    """Wait for the "READY" line a udpgen sink/echo prints once bound."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([proc.stdout], [], [], 0.1)
        if r:
            line = proc.stdout.readline()
            if line.strip() == "READY":
                return
            if not line:
                break
        if proc.poll() is not None:
            break
    err = proc.stderr.read() if proc.poll() is not None else ""
    raise MeasureError(f"{what} did not start: {err.strip()}")


class Sink:
    """The C sink on host B, counting one tag's datagrams."""

    def __init__(self, topo: BenchTopo, tools: Tools, tag: int, deadline: float,
                 port: int = SINK_PORT, family: int = 4):
        self.topo = topo
        self.proc = topo.b.popen([tools.udpgen, "sink",
                                  "--bind", hostport(app_ip(topo.b, family), port),
                                  "--tag", str(tag), "--deadline", f"{deadline:.1f}",
                                  "--idle-ms", str(SINK_IDLE_MS), "--batch", "64"])
        try:
            _wait_ready(self.proc, "sink")
        except BaseException:
            topo.kill(self.proc)
            raise

    def finish(self, timeout: float = 10.0) -> dict:
        """Tell the sink the send is over; it drains and reports."""
        try:
            self.proc.send_signal(signal.SIGUSR1)
            out, err = self.proc.communicate(timeout=timeout)
            return _json_line(out, f"sink ({err.strip()})")
        finally:
            self.topo.kill(self.proc)


def send_argv(topo: BenchTopo, tools: Tools, *, size: int, rate: float, count: int,
              duration: float, tag: int, family: int = 4) -> list[str]:
    return [tools.udpgen, "send", "--dst", hostport(app_ip(topo.b, family), SINK_PORT),
            "--src", app_ip(topo.a, family), "--size", str(size), "--rate", f"{rate:.0f}",
            "--count", str(count), "--duration", f"{duration:.3f}", "--tag", str(tag),
            "--batch", "64" if rate == 0 else "32"]


def machine_busy_ns() -> int:
    """CPU time the whole machine spent working (every core: user, nice, system, irq, softirq;
    not idle, iowait or steal), from /proc/stat. Namespaces do not scope it: it counts the
    kernel's share of a path (softirqs, VXLAN) as well as the processes', which is what makes
    the kernel paths and the engines comparable per packet."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    return (user + nice + system + irq + softirq) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def udp_trial(topo: BenchTopo, tools: Tools, *, size: int, rate: float, duration: float,
              family: int = 4) -> dict:
    """Send ``size``-byte datagrams at ``rate`` pps (0: flood) for ``duration``
    seconds; returns offered and received rates, the loss, and the whole machine's CPU time
    while the sender ran."""
    tag = random.getrandbits(31)
    count = FLOOD_COUNT if rate == 0 else max(1, int(rate * duration))
    sink = Sink(topo, tools, tag, deadline=duration + 10, family=family)
    try:
        busy0 = machine_busy_ns()
        r = topo.a.run(send_argv(topo, tools, size=size, rate=rate, count=count,
                                 duration=duration, tag=tag, family=family),
                       pin=True, timeout=duration + 15)
        busy = machine_busy_ns() - busy0
        sent = _json_line(r.stdout, "sender")
    except BaseException:
        topo.kill(sink.proc)
        raise
    got = sink.finish()
    n_sent, n_recv = sent["sent"], got["received"]
    return {
        "rate_target": rate,
        "sent": n_sent,
        "received": n_recv,
        "tx_pps": sent["rate_pps"],
        "rx_pps": got["rate_pps"] if n_recv > 1 else 0.0,
        "loss": (1.0 - n_recv / n_sent) if n_sent else 1.0,
        "lost": n_sent - n_recv,
        "send_errors": sent["errors"],
        "machine_cpu_ns": busy,
    }


# The engines' packet counters shown beside the kernel path's programs' (path_counters).
ENGINE_PACKETS = ("udp_tx_packets", "udp_rx_packets", "tun_tx_packets", "tun_rx_packets")


@dataclass
class CostWindow:
    """CPU time and engine counters of the forwarders around one trial."""
    path: Path
    cpu0: dict = field(default_factory=dict)
    cnt0: dict = field(default_factory=dict)

    def start(self, quiet_since: float) -> None:
        if self.path.kernel:
            return
        # Counters only move with traffic: a stats file written after the
        # last trial ended is exact for this one's start.
        self.cnt0 = self.path.counters(after=quiet_since)
        self.cpu0 = {k: cpu_ns(p) for k, p in self.path.forwarder_pids().items()}

    def stop(self) -> dict | None:
        if self.path.kernel:
            return None
        pids = self.path.forwarder_pids()
        cpu1 = {k: cpu_ns(p) for k, p in pids.items()}
        cnt1 = self.path.counters(after=time.time())
        a, b = self.path.topo.a.name, self.path.topo.b.name
        try:
            # Send side: host A's forwarder, per packet it sent as UDP; receive
            # side: host B's, per packet it wrote into its TUN.
            sent = cnt1[a]["udp_tx_packets"] - self.cnt0[a]["udp_tx_packets"]
            written = cnt1[b]["tun_tx_packets"] - self.cnt0[b]["tun_tx_packets"]
        except KeyError:
            return None
        # A forwarder that counts no syscalls (flanneld: daemon_paths.py) still has its CPU.
        sys_a = _delta(cnt1[a].get("syscalls"), self.cnt0[a].get("syscalls"))
        sys_b = _delta(cnt1[b].get("syscalls"), self.cnt0[b].get("syscalls"))
        cpu_a = _delta(cpu1.get(a), self.cpu0.get(a))
        cpu_b = _delta(cpu1.get(b), self.cpu0.get(b))
        out = {
            "send_packets": sent, "recv_packets": written,
            "send_syscalls_per_packet": sys_a / sent if sent and sys_a is not None else None,
            "recv_syscalls_per_packet": sys_b / written if written and sys_b is not None else None,
            "send_cpu_ns_per_packet": cpu_a / sent if sent and cpu_a is not None else None,
            "recv_cpu_ns_per_packet": cpu_b / written if written and cpu_b is not None else None,
        }
        # The engines' own drop counters, per host, that moved.
        for side in (a, b):
            moved = {k: cnt1[side][k] - self.cnt0[side].get(k, 0) for k in cnt1[side]
                     if k.startswith("drop_") and cnt1[side][k] - self.cnt0[side].get(k, 0) > 0}
            if moved:
                out.setdefault("engine_drops", {})[f"{side} engine"] = moved
        # The offloads that carried this trial (C engine): big reads, trains
        # sent and received, coalesced writes, per host.
        for side in (a, b):
            moved = {k: cnt1[side].get(k, 0) - self.cnt0[side].get(k, 0) for k in OFFLOAD_STATS}
            moved = {k: v for k, v in sorted(moved.items()) if v > 0}
            if moved:
                out.setdefault("offload_ops", {})[side] = moved
        # The kernel path's (kernel_paths.py): its programs' counters and the engines' packets
        # beside them, per host, that moved: who carried the trial.
        for side in (a, b):
            moved = {k: cnt1[side].get(k, 0) - self.cnt0[side].get(k, 0) for k in cnt1[side]
                     if k.startswith("bpf_") or (any(n.startswith("bpf_") for n in cnt1[side])
                                                 and k in ENGINE_PACKETS)}
            moved = {k: v for k, v in sorted(moved.items()) if v > 0}
            if moved:
                out.setdefault("path_counters", {})[side] = moved
        out["syscalls_per_packet"] = _sum(out["send_syscalls_per_packet"],
                                          out["recv_syscalls_per_packet"])
        out["cpu_ns_per_packet"] = _sum(out["send_cpu_ns_per_packet"],
                                        out["recv_cpu_ns_per_packet"])
        return out


def _delta(x, y):
    return None if x is None or y is None else x - y


def _sum(x, y):
    return None if x is None or y is None else x + y


def drop_counters(topo: BenchTopo) -> dict:
    """Where packets can be dropped, as counters: per host, the UDP MIB
    (socket buffer overflows: the sink's or a forwarder's) and every device's
    rx/tx drops (a full TUN queue shows as flannel0 tx dropped); and the
    per-CPU backlog drops of /proc/net/softnet_stat (netdev_max_backlog)."""
    out = {}
    for side in topo.sides:
        c = {}
        snmp = side.run(["cat", "/proc/net/snmp"], check=False).stdout.splitlines()
        for head, vals in zip(snmp[::2], snmp[1::2]):
            if head.startswith("Udp:"):
                for k, v in zip(head.split()[1:], vals.split()[1:]):
                    if k in ("InErrors", "RcvbufErrors", "SndbufErrors", "NoPorts"):
                        c[f"udp_{k}"] = int(v)
        try:
            links = json.loads(side.run(["ip", "-s", "-j", "link", "show"], check=False).stdout)
        except ValueError:
            links = []
        for link in links:
            st = link.get("stats64") or link.get("stats") or {}
            for d in ("rx", "tx"):
                c[f"{link.get('ifname')}_{d}_dropped"] = int(st.get(d, {}).get("dropped", 0))
        out[side.name] = c
    try:
        with open("/proc/net/softnet_stat") as f:
            out["softnet"] = {f"cpu{i}_backlog_dropped": int(line.split()[1], 16)
                              for i, line in enumerate(f)}
    except OSError:
        pass
    return out


def drop_delta(before: dict, after: dict) -> dict:
    """Counters that moved, as {where: {counter: delta}}."""
    out = {}
    for where, counters in after.items():
        moved = {k: v - before.get(where, {}).get(k, 0) for k, v in counters.items()
                 if v - before.get(where, {}).get(k, 0) > 0}
        if moved:
            out[where] = moved
    return out


def flood(topo: BenchTopo, tools: Tools, path: Path, *, size: int, duration: float,
          quiet_since: float, family: int | None = None) -> dict:
    """A flood trial, with the forwarders' cost and the drop counters
    measured over it; of the path's inner family unless ``family`` says (4 through an
    inner-IPv6 path's dual-stack forwarders)."""
    cost = CostWindow(path)
    cost.start(quiet_since)
    drops0 = drop_counters(topo)
    res = udp_trial(topo, tools, size=size, rate=0, duration=duration,
                    family=family or path.family)
    drops1 = drop_counters(topo)
    res["cost"] = cost.stop()
    # Every path, the kernel's included: the machine's CPU time per packet delivered.
    res["machine_cpu_ns_per_packet"] = (res["machine_cpu_ns"] / res["received"]
                                        if res["received"] else None)
    res["drops"] = drop_delta(drops0, drops1)
    if res["cost"]:
        res["drops"].update(res["cost"].pop("engine_drops", {}))
    return res


def passes(res: dict, loss_limit: float) -> bool:
    """A probe passes when something arrived and the loss is under the limit; a limit of 0
    (the NDR) asks for every datagram: counts, not a float ratio, decide."""
    if res["received"] <= 0:
        return False
    if loss_limit <= 0:
        return res["received"] >= res["sent"]
    return res["loss"] < loss_limit


def _probe_record(rate: float, res: dict, ok: bool) -> dict:
    cpu = res["machine_cpu_ns"] / res["received"] if res["received"] else None
    return {"target": round(rate), "offered": round(res["tx_pps"]), "loss": res["loss"],
            "lost": res.get("lost"), "ok": ok, "machine_cpu_ns_per_packet": cpu}


def search_rate(trial, *, hi: float, start: float, loss_limit: float, steps: int,
                lo: float = 0.0, best: float | None = None, best_cpu: float | None = None,
                label: str = "rate", progress=None) -> dict:
    """Highest offered rate whose probe passes ``loss_limit`` (see ``passes``), by bisection
    in [lo, hi] starting at ``start``; ``trial(rate)`` runs one probe. ``best`` is a rate
    already known to pass (then ``lo`` is its target): the search refines it. At most
    ``steps`` probes, a few more (halving) while none passed so that a path that forwards
    at all gets a rate rather than zero; none once the bracket is within 1 %, where more
    probes only measure noise. A probe's rate is what the generator actually offered: when
    it fell short of the target, the generator is the limit and that target caps the search."""
    rate = min(max(start, lo), hi)
    probes = []
    for i in range(steps + 4):
        if best is not None and (i >= steps or hi - lo <= 0.01 * hi):
            break
        res = trial(rate)
        ok = passes(res, loss_limit)
        probes.append(_probe_record(rate, res, ok))
        if progress:
            progress(f"  {label} probe {i + 1}/{steps}: {rate / 1e3:.1f} kpps offered "
                     f"{res['tx_pps'] / 1e3:.1f}, lost {res.get('lost', '?')} "
                     f"({res['loss'] * 100:.2f}%) {'ok' if ok else 'FAIL'}")
        if ok:
            offered = min(res["tx_pps"], rate * 1.01)
            if best is None or offered > best:
                best, best_cpu = offered, probes[-1]["machine_cpu_ns_per_packet"]
            lo = rate
            if res["tx_pps"] < RATE_SLACK * rate:
                hi = rate
        else:
            hi = rate
        rate = (lo + hi) / 2
    return {"pps": best if best is not None else 0.0, "probes": probes,
            "machine_cpu_ns_per_packet": best_cpu}


def ndr_seed(pdr: dict) -> dict:
    """Where the NDR search starts from the PDR search's probes: a probe that lost nothing
    already passes the NDR (lo, best), one that lost anything fails it (hi). The NDR cannot
    exceed the PDR, so the PDR caps hi."""
    clean = [p for p in pdr["probes"] if p["ok"] and p["loss"] <= 0]
    lossy = [p["target"] for p in pdr["probes"] if p["loss"] > 0]
    hi = min([pdr["pps"], *lossy])
    seed = {"lo": 0.0, "hi": hi, "best": None, "best_cpu": None}
    if clean:
        top = max(clean, key=lambda p: p["target"])
        seed.update(lo=min(float(top["target"]), hi), best=min(float(top["offered"]), hi),
                    best_cpu=top["machine_cpu_ns_per_packet"])
    return seed


def find_rate(trial, *, flood_res: dict, steps: int, loss_limit: float, progress=None,
               label: str = "rate", seed: dict | None = None) -> dict:
    """One search for the highest rate that passes ``loss_limit``: in [0, the flood's offered
    rate] from the flood's receive rate, or from ``seed`` (``ndr_seed``) when given. A flood
    that passes is the answer: its offered rate, with the flood as the one probe."""
    if seed is None:
        hi = max(flood_res["tx_pps"], 1.0)
        if "sent" in flood_res and passes(flood_res, loss_limit):
            # The flood is a probe at the highest rate the generator offers: when it passed,
            # a paced probe can only offer less (pacing costs the generator: an inner-IPv6
            # flood lost nothing at 355 kpps, and the paced probe at that target offered 254).
            flood = _probe_record(flood_res["tx_pps"], flood_res, True)
            if progress:
                progress(f"  {label}: the flood passed at {flood_res['tx_pps'] / 1e3:.1f} kpps "
                         "offered, lost " f"{flood_res.get('lost', '?')}: no paced probe")
            return {"pps": flood_res["tx_pps"], "probes": [flood],
                    "machine_cpu_ns_per_packet": flood["machine_cpu_ns_per_packet"]}
        return search_rate(trial, hi=hi, start=min(max(flood_res["rx_pps"], hi * 0.05), hi),
                           loss_limit=loss_limit, steps=steps, label=label, progress=progress)
    if seed["hi"] <= 0:
        return {"pps": 0.0, "probes": [], "machine_cpu_ns_per_packet": None}
    return search_rate(trial, hi=seed["hi"], start=(seed["lo"] + seed["hi"]) / 2,
                       lo=seed["lo"], best=seed["best"], best_cpu=seed["best_cpu"],
                       loss_limit=loss_limit, steps=steps, label=label, progress=progress)


def pdr_ndr(trial, *, flood_res: dict, steps: int, ndr_steps: int, progress=None) -> dict:
    """The PDR (< 0.5 % loss) and then the NDR (nothing lost) at or below it. The machine's
    CPU per packet is the PDR's: every path at a load it carries (almost) whole."""
    pdr = find_rate(trial, flood_res=flood_res, steps=steps, loss_limit=PDR_LOSS,
                     label="pdr", progress=progress)
    ndr = find_rate(trial, flood_res=flood_res, steps=ndr_steps, loss_limit=NDR_LOSS,
                     label="ndr", progress=progress, seed=ndr_seed(pdr))
    return {"pdr_pps": pdr["pps"], "ndr_pps": min(ndr["pps"], pdr["pps"]),
            "pdr_probes": pdr["probes"], "ndr_probes": ndr["probes"],
            "machine_cpu_ns_per_packet": pdr["machine_cpu_ns_per_packet"]}


def udp_prober(topo: BenchTopo, tools: Tools, *, size: int, duration: float, family: int = 4):
    """The trial function of a search: one paced UDP trial at a rate."""
    return lambda rate: udp_trial(topo, tools, size=size, rate=rate, duration=duration,
                                  family=family)


RTT_KEYS = (("p50_us", "p50_us"), ("p90_us", "p90_us"), ("p99_us", "p99_us"),
            ("p999_us", "p999_us"), ("max_us", "max_us"), ("samples", "received"))


def rtt_figures(rr: dict, prefix: str = "rtt_") -> dict:
    """``udpgen rr``'s result as the bench's keys (``rtt_p50_us`` ... ``rtt_samples``); a
    figure the probe did not print is None."""
    return {prefix + key: rr.get(src) for key, src in RTT_KEYS}


def latency(topo: BenchTopo, tools: Tools, *, count: int, interval_us: int,
            bg_rate: float = 0.0, bg_size: int = 64, family: int = 4) -> dict:
    """UDP request/response round trips (C rr client on A, echo on B), idle
    or under a background load of ``bg_rate`` pps of ``bg_size`` bytes."""
    probe_s = count * interval_us / 1e6
    echo = topo.b.popen([tools.udpgen, "echo",
                         "--bind", hostport(app_ip(topo.b, family), ECHO_PORT),
                         "--deadline", f"{probe_s + 15:.1f}"])
    sink = bg = None
    try:
        _wait_ready(echo, "echo")
        if bg_rate > 0:
            tag = random.getrandbits(31)
            bg_s = probe_s + 0.6
            sink = Sink(topo, tools, tag, deadline=bg_s + 10, family=family)
            bg = topo.a.popen(send_argv(topo, tools, size=bg_size, rate=bg_rate,
                                        count=int(bg_rate * bg_s) + 1, duration=bg_s, tag=tag,
                                        family=family))
            time.sleep(0.3)    # let the load settle before probing
        r = topo.a.run([tools.udpgen, "rr", "--dst", hostport(app_ip(topo.b, family), ECHO_PORT),
                        "--src", app_ip(topo.a, family), "--count", str(count),
                        "--interval-us", str(interval_us), "--timeout-ms", "200",
                        "--deadline", f"{probe_s + 10:.1f}"],
                       pin=True, timeout=probe_s + 20)
        res = _json_line(r.stdout, "rr")
        if bg is not None:
            out, _ = bg.communicate(timeout=probe_s + 15)
            sent = _json_line(out, "background sender")
            got = sink.finish()
            res["bg_offered_pps"] = sent["rate_pps"]
            res["bg_loss"] = 1.0 - got["received"] / sent["sent"] if sent["sent"] else 1.0
            sink = None
        return res
    finally:
        for p in (bg, echo, sink.proc if sink else None):
            if p is not None:
                topo.kill(p)


def tcp(topo: BenchTopo, tools: Tools, *, seconds: float, streams: int = 1,
        reverse: bool = False, family: int = 4) -> dict:
    """TCP with iperf3 between A and B: ``streams`` parallel streams (-P), from A to B or,
    with ``reverse`` (-R), from B to A; throughput and retransmits."""
    server = topo.b.popen([tools.iperf3, "-s", "-1", "-B", app_ip(topo.b, family),
                           "-p", str(IPERF_PORT)])
    try:
        deadline = time.monotonic() + 10
        while True:
            r = topo.b.run(["ss", "-Hltn", f"sport = :{IPERF_PORT}"], check=False)
            if r.stdout.strip():
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise MeasureError(f"iperf3 server did not start: {server.stderr.read()}")
            time.sleep(0.05)
        r = topo.a.run(iperf3_client_argv(topo, tools, seconds=seconds, streams=streams,
                                          reverse=reverse, family=family),
                       pin=True, check=False, timeout=seconds + 30)
        return iperf3_result(r.stdout, r.stderr)
    finally:
        topo.kill(server)


def iperf3_client_argv(topo: BenchTopo, tools: Tools, *, seconds: float, streams: int = 1,
                       reverse: bool = False, family: int = 4) -> list[str]:
    argv = [tools.iperf3, "-c", app_ip(topo.b, family), "-B", app_ip(topo.a, family),
            "-p", str(IPERF_PORT),
            "-t", f"{seconds:g}", "-J"]
    if streams > 1:
        argv += ["-P", str(streams)]
    if reverse:
        argv.append("-R")
    return argv


def iperf3_result(stdout: str, stderr: str = "") -> dict:
    """Throughput as the receiver counted it; retransmits are the sender's, whichever host
    sent (with -R iperf3 reports the server's in ``sum_sent``)."""
    try:
        data = json.loads(stdout)
    except ValueError:
        raise MeasureError(f"iperf3 client: {stderr.strip() or stdout[-300:]}")
    if "error" in data:
        raise MeasureError(f"iperf3: {data['error']}")
    end = data["end"]
    return {"gbps": end["sum_received"]["bits_per_second"] / 1e9,
            "retransmits": end["sum_sent"].get("retransmits"),
            "sender_cpu": end.get("cpu_utilization_percent", {}).get("host_total")}
