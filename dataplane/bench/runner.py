"""One bench run: setup, every path on one testbed, results.

Order, per path: set the path up, check that it carries traffic, then per
trial: idle latency, one TCP stream, and per size a flood (with the
forwarders' cost), the no-drop search and latency under half the no-drop
load. Paths run one after another on the same two hosts.
"""
from __future__ import annotations

import logging
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass

from . import build, measure, report
from .path_choice import make_path
from .paths import PATHS, PathSkipped
from .topo import BenchTopo

log = logging.getLogger(__name__)

SIZES = (64, 1400)


@dataclass(frozen=True)
class Profile:
    name: str
    trials: int
    flood_s: float        # each flood trial
    probe_s: float        # each no-drop search probe
    steps: int            # probes per no-drop search
    lat_count: int        # round trips per latency measurement
    lat_interval_us: int
    tcp_s: float          # iperf3 -t


QUICK = Profile("quick", trials=1, flood_s=0.4, probe_s=0.25, steps=3, lat_count=300,
                lat_interval_us=500, tcp_s=1.0)
FULL = Profile("full", trials=3, flood_s=1.5, probe_s=0.8, steps=6, lat_count=2000,
               lat_interval_us=500, tcp_s=3.0)


class Progress:
    """Plain progress lines on stderr, with the elapsed time."""

    def __init__(self, stream=None, quiet: bool = False):
        self.t0 = time.monotonic()
        self.stream = stream or sys.stderr
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", file=self.stream, flush=True)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0


def machine_info(profile: Profile, trials: int, paths, tools: dict) -> dict:
    def first_line(path, prefix):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(prefix):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return None

    try:
        from dataplane.engine import c_available
        c_ok = c_available()
    except Exception:
        c_ok = False
    return {
        "git": _git_rev(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(shlex.quote(a) for a in ["flannel-udp"] + sys.argv[1:])
        if os.path.basename(sys.argv[0]) in ("flannel-udp", "__main__.py", "-m")
        else " ".join(shlex.quote(a) for a in sys.argv),
        "mode": profile.name,
        "trials": trials,
        "paths": list(paths),
        "sizes": list(SIZES),
        "hostname": platform.node(),
        "cpu_model": first_line("/proc/cpuinfo", "model name"),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "c_engine_built": c_ok,
        "loadavg_start": os.getloadavg()[0],
        "pinning": "sender, rr client, iperf3 client, host A forwarder: CPU0; "
                   "sink, echo, iperf3 server, host B forwarder: CPU1; "
                   "RPS of each veth (both ends) and overlay device to its host's CPU",
        "loss_limit": measure.LOSS_LIMIT,
        "profile": asdict(profile),
        "tools": tools,
    }


def _git_rev() -> str | None:
    """The checkout's commit (with "+dirty" for local changes), if any."""
    import subprocess
    root = build.PERF_DIR.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (rev + ("+dirty" if dirty else "")) or None


def run(paths=PATHS, profile: Profile = FULL, trials: int | None = None,
        batch: int | None = None, routes: int = 0, progress: Progress | None = None,
        flanneld: str | None = None) -> dict:
    """``flanneld``: the binary of the ``flanneld`` path (None: that path is skipped, with the
    reason in its rows and ``machine.skipped``, and the others run)."""
    progress = progress or Progress()
    trials = trials or profile.trials
    tools_d = build.setup()
    tools = measure.Tools(**tools_d)
    machine = machine_info(profile, trials, paths, tools_d)
    machine["routes"] = routes + 1        # per engine: the peer's, and the fillers
    samples: dict = {}
    errors = []
    skipped: dict = {}
    progress(f"bench: {profile.name} run, paths {', '.join(paths)}, {trials} trial(s)")
    with BenchTopo() as topo:
        for name in paths:
            try:
                samples[name] = _run_path(topo, tools, name, profile, trials, batch, routes,
                                          progress, flanneld)
            except PathSkipped as e:
                skipped[name] = str(e)
                progress(f"{name}: skipped: {e}")
            except Exception as e:
                log.error("path %s failed: %s", name, e)
                errors.append(f"{name}: {e}")
                progress(f"{name}: FAILED: {e}")
    machine["loadavg_end"] = os.getloadavg()[0]
    machine["duration_s"] = round(progress.elapsed, 1)
    if errors:
        machine["errors"] = errors
    if skipped:
        machine["skipped"] = skipped
    return report.build(samples, paths, SIZES, machine, skipped=skipped)


def _top_drops(drops: dict, n: int = 4) -> str:
    flat = [(v, f"{where} {k}") for where, d in drops.items() for k, v in d.items()]
    return ", ".join(f"{name} {v}" for v, name in sorted(flat, reverse=True)[:n])


def _add(store: dict, size, key: str, value) -> None:
    store.setdefault(size, {}).setdefault(key, []).append(value)


def _run_path(topo, tools, name, profile: Profile, trials: int, batch, routes,
              progress, flanneld=None) -> dict:
    path = make_path(topo, name, batch=batch, routes=routes, flanneld=flanneld)
    out: dict = {}
    progress(f"{name}: setting up")
    path.setup()
    try:
        check = measure.udp_trial(topo, tools, size=64, rate=2000, duration=0.1)
        if check["received"] == 0:
            raise measure.MeasureError(f"{name} path carries no traffic ({check})")
        for t in range(1, trials + 1):
            tag = f"{name} trial {t}/{trials}"
            idle = measure.latency(topo, tools, count=profile.lat_count,
                                   interval_us=profile.lat_interval_us)
            _add(out, None, "rtt_p50_us", idle["p50_us"])
            _add(out, None, "rtt_p99_us", idle["p99_us"])
            _add(out, None, "rtt_lost", idle["lost"])
            tcp = measure.tcp(topo, tools, seconds=profile.tcp_s)
            _add(out, None, "tcp_gbps", tcp["gbps"])
            _add(out, None, "tcp_retransmits", tcp["retransmits"])
            progress(f"{tag}: idle rtt p50 {idle['p50_us']:.0f} us p99 {idle['p99_us']:.0f} us; "
                     f"TCP {tcp['gbps']:.2f} Gbit/s, {tcp['retransmits']} retransmits")
            for size in SIZES:
                fl = measure.flood(topo, tools, path, size=size, duration=profile.flood_s,
                                   quiet_since=time.time())
                cost = fl["cost"] or {}
                _add(out, size, "flood_rx_pps", fl["rx_pps"])
                _add(out, size, "flood_loss", fl["loss"])
                _add(out, size, "flood_tx_pps", fl["tx_pps"])
                # The flood lost nothing: the generator, not the path, was the
                # limit, and the no-drop rate is a lower bound.
                _add(out, size, "generator_limited", fl["loss"] < measure.LOSS_LIMIT)
                _add(out, size, "flood_drops", fl["drops"])
                _add(out, size, "cpu_ns_per_packet", cost.get("cpu_ns_per_packet"))
                _add(out, size, "flood_machine_cpu_ns_per_packet",
                     fl["machine_cpu_ns_per_packet"])
                _add(out, size, "syscalls_per_packet", cost.get("syscalls_per_packet"))
                for k in ("send_cpu_ns_per_packet", "recv_cpu_ns_per_packet",
                          "send_syscalls_per_packet", "recv_syscalls_per_packet"):
                    if cost:
                        _add(out, size, k, cost.get(k))
                # flanneld's forwarders count no syscalls: its CPU alone (daemon_paths.py)
                per_packet = [f"{cost[k]:{fmt}} {what}" for k, fmt, what in (
                    ("cpu_ns_per_packet", ".0f", "ns CPU"),
                    ("syscalls_per_packet", ".2f", "syscalls")) if cost.get(k) is not None]
                progress(f"{tag} {size} B: flood offered {fl['tx_pps'] / 1e3:.1f} kpps, "
                         f"received {fl['rx_pps'] / 1e3:.1f} kpps, loss {fl['loss'] * 100:.1f}%"
                         + (f", machine {fl['machine_cpu_ns_per_packet']:.0f} ns CPU per packet"
                            if fl["machine_cpu_ns_per_packet"] is not None else "")
                         + (f", {' and '.join(per_packet)} per packet" if per_packet else ""))
                if fl["drops"]:
                    progress(f"  drops: {_top_drops(fl['drops'])}")
                if cost.get("offload_ops"):
                    _add(out, size, "flood_offload_ops", cost["offload_ops"])
                    progress("  offloads: " + "; ".join(
                        f"{h} " + ", ".join(f"{k} {v}" for k, v in ops.items())
                        for h, ops in cost["offload_ops"].items()))
                nd = measure.ndr_search(topo, tools, size=size, flood_res=fl, steps=profile.steps,
                                        duration=profile.probe_s, progress=progress)
                _add(out, size, "ndr_pps", nd["ndr_pps"])
                _add(out, size, "ndr_probes", nd["probes"])
                _add(out, size, "machine_cpu_ns_per_packet", nd["machine_cpu_ns_per_packet"])
                load = measure.latency(topo, tools, count=profile.lat_count,
                                       interval_us=profile.lat_interval_us,
                                       bg_rate=nd["ndr_pps"] / 2, bg_size=size)
                _add(out, size, "rtt_p50_us", load["p50_us"])
                _add(out, size, "rtt_p99_us", load["p99_us"])
                _add(out, size, "rtt_lost", load["lost"])
                _add(out, size, "rtt_bg_pps", load.get("bg_offered_pps"))
                progress(f"{tag} {size} B: no-drop {nd['ndr_pps'] / 1e3:.1f} kpps"
                         + (f" (machine {nd['machine_cpu_ns_per_packet']:.0f} ns CPU per packet)"
                            if nd["machine_cpu_ns_per_packet"] is not None else "")
                         + "; rtt under "
                         f"{nd['ndr_pps'] / 2e3:.1f} kpps: p50 {load['p50_us']:.0f} us "
                         f"p99 {load['p99_us']:.0f} us")
    finally:
        path.teardown()
    return out
