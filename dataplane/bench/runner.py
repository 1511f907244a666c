"""One bench run: setup, every path on one testbed, results.

Order, per path: set the path up, check that it carries traffic, then per
trial: idle latency, TCP (one stream, four streams, the reverse direction), and
per size a flood (with the forwarders' cost), the PDR and NDR searches and
latency under half the path's own PDR. An inner-IPv6 path's one TCP stream and
floods each run beside the same of inner IPv4 through its own forwarders. Paths run one after another on the
same two hosts. Then the common-load pass: every path that ran is set up
again and its latency measured at the same offered rate for all of them, the
highest rate every path carried whole (the lowest NDR of the run), so that
latencies compare at equal load rather than at each path's own.
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
from .families import IPV6_TWINS
from .path_choice import make_path
from .paths import PATHS, PathSkipped
from .topo import BenchTopo

log = logging.getLogger(__name__)

PINNING = ("sender, rr client, iperf3 client, host A forwarder: CPU0; "
           "sink, echo, iperf3 server, host B forwarder: CPU1; "
           "RPS of each veth (both ends) and overlay device to its host's CPU")
PINNING_TOGETHER = ("sender, rr client, iperf3 client: CPU0; "
                    "sink, echo, iperf3 server, both forwarders: CPU1 (--forwarders-together); "
                    "RPS of each veth (both ends) and overlay device to its host's CPU")

SIZES = (64, 1400)


@dataclass(frozen=True)
class Profile:
    name: str
    trials: int
    flood_s: float        # each flood trial
    probe_s: float        # each PDR/NDR search probe
    steps: int            # probes per PDR search
    ndr_steps: int        # probes per NDR search, below the PDR (its probes seed it)
    lat_count: int        # round trips per latency measurement
    lat_interval_us: int
    tcp_s: float          # iperf3 -t


QUICK = Profile("quick", trials=1, flood_s=0.4, probe_s=0.25, steps=3, ndr_steps=2,
                lat_count=300, lat_interval_us=500, tcp_s=1.0)
# Five trials: enough for a median that shrugs off one stalled trial and for an interval of
# each ratio (report.ratio_ci); shorter TCP runs pay for the two TCP variants.
FULL = Profile("full", trials=5, flood_s=1.5, probe_s=0.8, steps=6, ndr_steps=4,
               lat_count=2000, lat_interval_us=500, tcp_s=2.0)


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
        "pinning": PINNING,
        "loss_limit": measure.PDR_LOSS,
        "pdr_loss_limit": measure.PDR_LOSS,
        "ndr_loss_limit": measure.NDR_LOSS,
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
        flanneld: str | None = None, forwarders_together: bool = False) -> dict:
    """``flanneld``: the binary of the ``flanneld`` path (None: that path is skipped, with the
    reason in its rows and ``machine.skipped``, and the others run). ``forwarders_together``:
    both hosts' forwarders on host B's core (topo.py), said in ``machine.pinning``."""
    progress = progress or Progress()
    trials = trials or profile.trials
    tools_d = build.setup()
    tools = measure.Tools(**tools_d)
    machine = machine_info(profile, trials, paths, tools_d)
    machine["routes"] = routes + 1        # per engine: the peer's, and the fillers
    if forwarders_together:
        machine["pinning"] = PINNING_TOGETHER
    samples: dict = {}
    errors = []
    skipped: dict = {}
    progress(f"bench: {profile.name} run, paths {', '.join(paths)}, {trials} trial(s)"
             + (", both forwarders on host B's core (--forwarders-together)"
                if forwarders_together else ""))
    with BenchTopo(ipv6=any(p in IPV6_TWINS for p in paths),
                   forwarders_together=forwarders_together) as topo:
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
        rates = common_load(samples, SIZES)
        if rates:
            machine["common_load_pps"] = {str(k): v for k, v in rates.items()}
            _common_pass(topo, tools, samples, rates, profile, trials, batch, routes,
                         progress, flanneld, errors)
        else:
            progress("common load: skipped (it needs two paths with an NDR)")
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


def common_load(samples: dict, sizes) -> dict:
    """Per size, the highest rate every path of the run carried whole: the lowest of the
    paths' NDRs (median over trials). Only paths that ran count (a failed or skipped one has
    no samples); with fewer than two there is nothing to compare, and a size where some
    path's NDR is 0 or missing gets no common load."""
    if len(samples) < 2:
        return {}
    out = {}
    for size in sizes:
        meds = [report.summarize(per.get(size, {}).get("ndr_pps", [])) for per in samples.values()]
        if all(m and m["median"] > 0 for m in meds):
            out[size] = min(m["median"] for m in meds)
    return out


def _common_pass(topo, tools, samples: dict, rates: dict, profile: Profile, trials: int,
                 batch, routes, progress, flanneld, errors: list) -> None:
    progress("common load: every path again, latency at "
             + ", ".join(f"{r / 1e3:.1f} kpps ({s} B)" for s, r in rates.items())
             + ", the lowest NDR of the run")
    for name in list(samples):
        try:
            got = _run_common(topo, tools, name, profile, trials, batch, routes, progress,
                              flanneld, rates)
        except Exception as e:
            log.error("path %s failed in the common-load pass: %s", name, e)
            errors.append(f"{name} (common load): {e}")
            progress(f"{name}: common load FAILED: {e}")
            continue
        for size, figs in got.items():
            for key, vals in figs.items():
                samples[name].setdefault(size, {}).setdefault(key, []).extend(vals)


def _run_common(topo, tools, name, profile: Profile, trials: int, batch, routes, progress,
                flanneld, rates: dict) -> dict:
    """The latency of path ``name`` under each size's common load, ``trials`` times."""
    path = make_path(topo, name, batch=batch, routes=routes, flanneld=flanneld)
    out: dict = {}
    progress(f"{name}: setting up (common load)")
    path.setup()
    try:
        for t in range(1, trials + 1):
            for size, rate in rates.items():
                load = measure.latency(topo, tools, count=profile.lat_count,
                                       interval_us=profile.lat_interval_us,
                                       bg_rate=rate, bg_size=size, family=path.family)
                _add(out, size, "common_load_pps", load.get("bg_offered_pps"))
                _add(out, size, "common_bg_loss", load.get("bg_loss"))
                for key, v in measure.rtt_figures(load, "common_rtt_").items():
                    _add(out, size, key, v)
                progress(f"{name} trial {t}/{trials} {size} B: rtt under common "
                         f"{rate / 1e3:.1f} kpps: {_rtt_text(load)}")
    finally:
        path.teardown()
    return out


def _rtt_text(rr: dict) -> str:
    return (f"p50 {rr['p50_us']:.0f} p90 {rr.get('p90_us', 0):.0f} p99 {rr['p99_us']:.0f} "
            f"p99.9 {rr.get('p999_us', 0):.0f} max {rr['max_us']:.0f} us "
            f"(n={rr['received']})")


def _add_rtt(out: dict, size, rr: dict) -> None:
    for key, v in measure.rtt_figures(rr).items():
        _add(out, size, key, v)
    _add(out, size, "rtt_lost", rr["lost"])


TCP_VARIANTS = (("tcp", 1, False, "one stream"), ("tcp4", 4, False, "4 streams"),
                ("tcp_rev", 1, True, "reverse"))


def _idle_and_tcp(topo, tools, profile: Profile, out: dict, tag: str, progress,
                  family: int = 4, trial: int = 1) -> None:
    idle = measure.latency(topo, tools, count=profile.lat_count,
                           interval_us=profile.lat_interval_us, family=family)
    _add_rtt(out, None, idle)
    parts = []
    for key, streams, reverse, what in TCP_VARIANTS:
        beside = ""
        if key == "tcp" and family == 6:
            res, v4 = _tcp_beside_ipv4(topo, tools, profile, out, ipv4_first=trial % 2 == 1)
            beside = f"; IPv4 through the same forwarders {v4:.2f} Gbit/s"
        else:
            res = measure.tcp(topo, tools, seconds=profile.tcp_s, streams=streams,
                              reverse=reverse, family=family)
        _add(out, None, f"{key}_gbps", res["gbps"])
        _add(out, None, f"{key}_retransmits", res["retransmits"])
        parts.append(f"{what} {res['gbps']:.2f} Gbit/s ({res['retransmits']} retr{beside})")
    progress(f"{tag}: idle rtt {_rtt_text(idle)}; TCP " + ", ".join(parts))


def _tcp_beside_ipv4(topo, tools, profile: Profile, out: dict,
                     ipv4_first: bool) -> tuple[dict, float]:
    """An inner-IPv6 path's one stream, and right beside it one stream of inner IPv4 through
    the same forwarders (the path's dual-stack config carries both), the order alternating
    between trials. Their ratio, per trial, is IPv6 against IPv4 with nothing else changed:
    the twin path's figure ran minutes apart, and one TCP stream through a Python forwarder
    moves +-15 % between such runs, more than the difference the ratio is after."""
    got = {}
    for fam in ((4, 6) if ipv4_first else (6, 4)):
        got[fam] = measure.tcp(topo, tools, seconds=profile.tcp_s, family=fam)
    v4 = got[4]["gbps"]
    _add(out, None, "tcp_ipv4_same_gbps", v4)
    _add(out, None, report.PAIRED_TCP_KEY, got[6]["gbps"] / v4 if v4 else None)
    return got[6], v4


# The forwarders' cost keys of a flood (CostWindow.stop), per packet.
COST_KEYS = ("send_cpu_ns_per_packet", "recv_cpu_ns_per_packet",
             "send_syscalls_per_packet", "recv_syscalls_per_packet")


def _flood(topo, tools, path, profile: Profile, out: dict, size: int, tag: str, progress,
           trial: int = 1):
    beside = path.family == 6
    if beside:
        fl, v4, paired = _flood_beside_ipv4(topo, tools, path, profile, out, size,
                                            ipv4_first=trial % 2 == 1)
        v4_cost = v4["cost"] or {}
    else:
        fl = measure.flood(topo, tools, path, size=size, duration=profile.flood_s,
                           quiet_since=time.time())
    cost = fl["cost"] or {}
    _add(out, size, "flood_rx_pps", fl["rx_pps"])
    _add(out, size, "flood_loss", fl["loss"])
    _add(out, size, "flood_tx_pps", fl["tx_pps"])
    # The flood lost < 0.5 %: the generator, not the path, was the limit, and the PDR is a
    # lower bound.
    _add(out, size, "generator_limited", fl["loss"] < measure.PDR_LOSS)
    _add(out, size, "flood_drops", fl["drops"])
    _add(out, size, "cpu_ns_per_packet", cost.get("cpu_ns_per_packet"))
    _add(out, size, "flood_machine_cpu_ns_per_packet", fl["machine_cpu_ns_per_packet"])
    _add(out, size, "syscalls_per_packet", cost.get("syscalls_per_packet"))
    if cost:
        for k in COST_KEYS:
            _add(out, size, k, cost.get(k))
    # flanneld's forwarders count no syscalls: its CPU alone (daemon_paths.py)
    per_packet = [f"{cost[k]:{fmt}} {what}" for k, fmt, what in (
        ("cpu_ns_per_packet", ".0f", "ns CPU"),
        ("syscalls_per_packet", ".2f", "syscalls")) if cost.get(k) is not None]
    progress(f"{tag} {size} B: flood offered {fl['tx_pps'] / 1e3:.1f} kpps, "
             f"received {fl['rx_pps'] / 1e3:.1f} kpps, loss {fl['loss'] * 100:.1f}%"
             + (f", machine {fl['machine_cpu_ns_per_packet']:.0f} ns CPU per packet"
                if fl["machine_cpu_ns_per_packet"] is not None else "")
             + (f", {' and '.join(per_packet)} per packet" if per_packet else "")
             + (f"; IPv4 through the same forwarders: offered {v4['tx_pps'] / 1e3:.1f}, "
                f"received {v4['rx_pps'] / 1e3:.1f} kpps"
                + (f", {v4_cost['cpu_ns_per_packet']:.0f} ns CPU per packet"
                   if v4_cost.get("cpu_ns_per_packet") is not None else "")
                + paired if beside else ""))
    if fl["drops"]:
        progress(f"  drops: {_top_drops(fl['drops'])}")
    if cost.get("offload_ops"):
        _add(out, size, "flood_offload_ops", cost["offload_ops"])
        progress("  offloads: " + "; ".join(
            f"{h} " + ", ".join(f"{k} {v}" for k, v in ops.items())
            for h, ops in cost["offload_ops"].items()))
    if cost.get("path_counters"):
        _add(out, size, "flood_path_counters", cost["path_counters"])
        progress("  counters: " + "; ".join(
            f"{h} " + ", ".join(f"{k} {v}" for k, v in c.items())
            for h, c in cost["path_counters"].items()))
    return fl


def _flood_beside_ipv4(topo, tools, path, profile: Profile, out: dict, size: int,
                       ipv4_first: bool) -> tuple[dict, dict, str]:
    """An inner-IPv6 path's flood, and right beside it the same flood of inner IPv4 through
    the same forwarders, the order alternating between trials (as ``_tcp_beside_ipv4``).
    Keeps the IPv4 flood's rate and the forwarders' cost of it (CPU and syscalls per packet,
    each side's: what would set the two families apart), and their ratio when the IPv4 flood
    was the forwarders' limit. A flood that lost < 0.5 % shows its generator's rate, which is
    at most what the forwarders carry, and the generator sends IPv6 more slowly than IPv4: an
    IPv4 flood so limited leaves no ratio; an IPv6 one leaves a lower bound. Returns both
    floods and what the progress line says of the ratio."""
    got = {}
    for fam in ((4, 6) if ipv4_first else (6, 4)):
        got[fam] = measure.flood(topo, tools, path, size=size, duration=profile.flood_s,
                                 quiet_since=time.time(), family=fam)
    fl, v4 = got[6], got[4]
    _add(out, size, "flood_ipv4_same_rx_pps", v4["rx_pps"])
    v4_cost = v4["cost"] or {}
    if v4_cost:
        for k in ("cpu_ns_per_packet", "syscalls_per_packet") + COST_KEYS:
            _add(out, size, f"ipv4_same_{k}", v4_cost.get(k))
    counts = v4["loss"] >= measure.PDR_LOSS and v4["rx_pps"] > 0
    lower = counts and fl["loss"] < measure.PDR_LOSS
    _add(out, size, report.PAIRED_FLOOD_KEY, fl["rx_pps"] / v4["rx_pps"] if counts else None)
    _add(out, size, report.PAIRED_FLOOD_LOWER_KEY, lower if counts else None)
    if not counts:
        said = " (the IPv4 flood lost < 0.5 %: its generator's rate, no ratio)"
    elif lower:
        said = (f" (IPv6 / IPv4 >= {fl['rx_pps'] / v4['rx_pps']:.2f}: the IPv6 flood lost "
                "< 0.5 %, its generator's rate)")
    else:
        said = f" (IPv6 / IPv4 {fl['rx_pps'] / v4['rx_pps']:.2f})"
    return fl, v4, said


def _rates_and_load(topo, tools, profile: Profile, out: dict, size: int, fl: dict, tag: str,
                    progress, family: int = 4) -> None:
    trial = measure.udp_prober(topo, tools, size=size, duration=profile.probe_s, family=family)
    nd = measure.pdr_ndr(trial, flood_res=fl, steps=profile.steps,
                         ndr_steps=profile.ndr_steps, progress=progress)
    for key in ("pdr_pps", "ndr_pps", "pdr_probes", "ndr_probes", "machine_cpu_ns_per_packet"):
        _add(out, size, key, nd[key])
    load = measure.latency(topo, tools, count=profile.lat_count,
                           interval_us=profile.lat_interval_us,
                           bg_rate=nd["pdr_pps"] / 2, bg_size=size, family=family)
    _add_rtt(out, size, load)
    _add(out, size, "rtt_bg_pps", load.get("bg_offered_pps"))
    progress(f"{tag} {size} B: PDR {nd['pdr_pps'] / 1e3:.1f} kpps, NDR "
             f"{nd['ndr_pps'] / 1e3:.1f} kpps"
             + (f" (machine {nd['machine_cpu_ns_per_packet']:.0f} ns CPU per packet at the PDR)"
                if nd["machine_cpu_ns_per_packet"] is not None else "")
             + f"; rtt under {nd['pdr_pps'] / 2e3:.1f} kpps (half the PDR): {_rtt_text(load)}")


def _run_path(topo, tools, name, profile: Profile, trials: int, batch, routes,
              progress, flanneld=None) -> dict:
    path = make_path(topo, name, batch=batch, routes=routes, flanneld=flanneld)
    out: dict = {}
    progress(f"{name}: setting up")
    path.setup()
    try:
        check = measure.udp_trial(topo, tools, size=64, rate=2000, duration=0.1,
                                  family=path.family)
        if check["received"] == 0:
            raise measure.MeasureError(f"{name} path carries no traffic ({check})")
        for t in range(1, trials + 1):
            tag = f"{name} trial {t}/{trials}"
            _idle_and_tcp(topo, tools, profile, out, tag, progress, family=path.family,
                          trial=t)
            for size in SIZES:
                fl = _flood(topo, tools, path, profile, out, size, tag, progress, trial=t)
                _rates_and_load(topo, tools, profile, out, size, fl, tag, progress,
                                family=path.family)
    finally:
        path.teardown()
    return out
