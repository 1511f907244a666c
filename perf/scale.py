"""16,000 hosts (issue 47): a daemon's start, a new host, a burst, idle cost, answer times and
DirectRouting, with N peer leases in a real etcd, each its own PublicIP; each figure over a few
runs (min / median / max) and checked against the issue's targets.

    python perf/scale.py [--engines c|kernel|python,...] [--peers 16000] [--burst 5000] [--runs 3]
                         [--timeout 120] [--no-direct] [--json perf/results/scale.json]

As root, on the project's testbed (dataplane/testbed). Each run, per engine:

1. etcd with N - burst peer leases (written straight into it, 100 per transaction); two real
   daemons h0 and h1 start and get READY (not measured: the scene). A ping stream h0 -> h1
   (every 10 ms) and, in every daemon's host, /metrics and the status socket asked every ~100 ms
   (dataplane/testbed/answer_times.py) run from here to the end.
2. **burst**: ``--burst`` leases put one by one (each its own revision and watch event, 32 in
   flight), from N - burst to N; until h0 and h1 count every new peer (/metrics, polled every
   50 ms from inside each host), from etcd's answer to the last put.
3. **fresh start**: a third daemon h2, a new process started alone while h0 and h1 idle, on a
   host whose previous subnet.env names a free subnet (so that pings can aim at it before it
   starts): from its process start to subnet.env rewritten (a new file), to READY=1 (sent once
   the routes to every listed peer are in), and until h0 and h1 reach it and it reaches h0
   (pings every 20 ms, from before its start). Then its ``flannel_udp_peers`` must be N + 2,
   and its engine must route every peer: one datagram to each of the N subnets, none dropped
   for want of a route (dataplane/testbed/route_sweep.py); on the kernel path (``kernel``:
   the daemons run ``--engine kernel``, the C engine behind the programs) the programs' maps
   must hold every one too (none handed to the engine for want of a route).
4. **idle**: h2's RSS and CPU (with its children) over 5 s, 2 s after READY.
5. answer times of /metrics and the status socket during the burst (h0, h1) and during h2's
   start (all three; h2's own from its first answer on): max and p99, and how many answers took
   over 50 ms by the daemons' own clock (flannel_udp_answer_seconds: what was the daemon's, not
   the asker's; with ``--gil-probe`` each one, for perf/answer_match.py); and the ping stream's
   lost replies (gaps in its sequence).
6. **DirectRouting** (unless ``--no-direct``): a new etcd with the config's Backend
   ``"DirectRouting": true`` and N leases that say so, their PublicIPs on the daemon's link (an
   address 172.31.255.254/12 on its veth covers them all): one daemon's start to READY, and
   the kernel's direct routes (``proto 153``) then, which must be N, and until they all are
   (counted every 0.1 s for at most ``--direct-wait`` s after READY; the rate they came at).
   Then the last ``--burst`` of those leases deleted (one revision each) until their routes are
   gone, and put again until they are back (N - burst -> N): seconds after etcd's last answer.

Every wait is bounded by --timeout (a figure that did not finish is None, and over its target; a
run whose scene broke, a daemon that exited or was not READY in time, is noted as its "error" and
every figure it lacks is over);
everything is started through the testbed, tracked by PID and removed with it, also on a failure,
Ctrl-C or SIGTERM. The issue's targets hold for the C engine and the kernel path; the Python
engine's figures are given without one.

(Over 450 lines as one piece: the scene's phases share its hosts, etcd and the questions asked
throughout, and the table's rows are read against them.)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lease_burst import (CONFIG, DIRECT_CONFIG, NEW_HOST_SUBNET, burst_phase, compiled,  # noqa: E402
                         cpu_s, children, first_replies, pss_kb, rss_kb)
from dataplane.testbed import cpu_weight  # noqa: E402
from dataplane.testbed.answer_times import AnswerTimes, daemon_answers, daemon_over, summary  # noqa: E402
from dataplane.testbed.lease_writer import FAKE_PUBLIC_IPS_ON_LINK, fake_leases  # noqa: E402
from dataplane.testbed.overlay import Overlay, OverlayError  # noqa: E402
from dataplane.testbed.ping_stream import MIN_INTERVAL_S, PingStream  # noqa: E402
from dataplane.testbed.route_sweep import sweep  # noqa: E402
from perf.answer_cost import arenas, rollup_mb  # noqa: E402

PRELOAD_BASE, BURST_BASE = "10.1.0.0", "10.128.0.0"
BURST_FIRST_IP = 100_000            # the burst's PublicIPs after the preload's
NO_LEASE = "10.249.0.1"             # an address no lease covers: the sweep's control
STREAM_INTERVAL = MIN_INTERVAL_S       # the densest stream ping sends without spinning a core
GIL_PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gil_probe")
# the daemons run at this unit's CPUWeight, as a host runs them (--cpu-weight)
UNIT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "packaging",
                    "flannel-udp.service")
ASKER_WEIGHT = 10000                # the instrument: its own turn on a core is not the answer's
IDLE_SETTLE_S, IDLE_S = 2.0, 5.0
# the engines the targets are checked for: the C engine, and the kernel path (its maps
# held to the same figures); the Python engine's are for information
TARGETED = ("c", "kernel")

# figure: (its name, target, unit); a target None is given for information
# figure | target (- : for information) | unit | its name in the table
_TARGETS = """
start_to_subnet_env_s        | 1   | s  | fresh start -> subnet.env
start_to_ready_s             | 1   | s  | fresh start -> READY (every peer routed)
new_host_reached_s           | 1   | s  | new host: the others reach it (slowest)
new_host_reaches_s           | 1   | s  | new host: it reaches h0
burst_writes_s               | -   | s  | burst: etcd's puts, first to last
burst_after_last_put_s       | 1   | s  | burst: every daemon routes every new peer, after the last put
burst_cpu_max_s              | -   | s  | burst: a daemon's CPU, first put to its last peer (the busier)
burst_timeslices_max         | -   |    | burst: a daemon's threads' times on a core, likewise
idle_rss_mb                  | 100 | MB | idle RSS of a daemon with N peers
idle_cpu_pct                 | 1   | %  | idle CPU over 5 s
metrics_max_ms               | 50  | ms | /metrics answer, max (start + burst)
metrics_p99_ms               | 50  | ms | /metrics answer, p99
status_max_ms                | 50  | ms | status answer, max (start + burst)
status_p99_ms                | 50  | ms | status answer, p99
answers_failed               | 0   |    | questions unanswered (5 s bound)
daemon_metrics_over_50ms     | -   |    | /metrics answers over 50 ms by the daemon's own clock (arrival -> sent; the harness's peer counts too)
daemon_status_over_50ms      | -   |    | status answers over 50 ms by the daemon's own clock
stream_lost                  | 0   |    | ping stream h0 -> h1: replies lost
routes_missing               | 0   |    | peers the fresh engine does not route
kernel_routes_missing        | 0   |    | kernel path: peers the fresh daemon's maps lack
direct_start_to_ready_s      | 1   | s  | DirectRouting: fresh start -> READY
direct_routes_missing        | 0   |    | DirectRouting: N less the kernel's direct routes at READY
direct_start_to_all_routes_s | 1   | s  | DirectRouting: fresh start -> every direct route in
direct_routes_per_s          | -   | /s | DirectRouting: direct routes added per second after READY
direct_removed_s             | 1   | s  | DirectRouting: burst leases deleted -> their routes gone, after the last delete
direct_burst_s               | 1   | s  | DirectRouting: burst leases put again -> their routes in, after the last put
gil_held_max_ms              | -   | ms | --gil-probe: the longest a report waited for the interpreter (a daemon's busy thread)
gil_held_over_10ms           | -   |    | --gil-probe: waits over 10 ms (the three daemons)
gc_max_ms                    | -   | ms | --gil-probe: the longest garbage collection (the three daemons)
gil_starved_over_10ms        | -   |    | --gil-probe: waits over 10 ms with the daemon off the cores (under 1 ms of its CPU)
"""
# {figure: (its name, target or None, unit)}
TARGETS = {key: (name, None if target == "-" else float(target), unit)
           for key, target, unit, name in (
               [part.strip() for part in line.split("|", 3)] for line in _TARGETS.strip().splitlines())}


def new_file(path: str, old_ino, timeout: float):
    """monotonic time at which ``path`` is a new file (another inode than ``old_ino``), or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.stat(path).st_ino != old_ino:
                return time.monotonic()
        except FileNotFoundError:
            pass
        time.sleep(0.002)
    return None


def later(ts, t0):
    """Seconds from ``t0`` to the latest of ``ts``; None if any is missing."""
    if t0 is None or any(t is None for t in ts):
        return None
    return round(max(ts) - t0, 3)


def gil_probe(out_dir: str | None) -> None:
    """The daemons started from now on count their waits for the interpreter into ``out_dir``
    (perf/gil_probe/sitecustomize.py); None: no more."""
    os.environ.pop("FLANNEL_UDP_GIL_PROBE", None)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != GIL_PROBE]
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        os.environ["FLANNEL_UDP_GIL_PROBE"] = out_dir
        paths.insert(0, GIL_PROBE)
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)


def gil_figures(out_dir: str, pids) -> dict:
    """What the probes of the daemons ``pids`` counted (the waits of their whole run)."""
    docs = []
    for pid in pids:
        try:
            with open(os.path.join(out_dir, f"{pid}.json")) as f:
                docs.append(json.load(f))
        except (OSError, ValueError):
            pass
    if not docs:
        return {}
    return {"gil_held_max_ms": max((w[0] for d in docs for w in d["waits"]), default=0.0),
            "gil_held_over_10ms": sum(d["counts"]["held_over_10ms"] for d in docs),
            "gc_max_ms": max((c[0] for d in docs for c in d["gc"]), default=0.0),
            # late while the process hardly ran: the machine's cores, not a thread of ours
            "gil_starved_over_10ms": sum(1 for d in docs for held, late, _ in d["all_waits_over_2ms"]
                                         if late > 10 and held < 1),
            "gil_probe": {d["pid"]: {"counts": d["counts"], "held_late_ms": d["waits"][:5],
                                     "answers": d.get("answers", []),
                                     "gc_ms": d["gc"][:5], "gc_total_ms": d["gc_total_ms"]}
                          for d in docs}}


def run_main(engine: str, n: int, burst: int, timeout: float, verbose: int, ask: bool = True,
             probe_dir: str | None = None, weights: tuple = (None, None)) -> dict:
    args = (f"-v={verbose}",) if verbose else ()
    out: dict = {}
    gil_probe(probe_dir)
    daemon_weight, asker_weight = weights
    with Overlay(hosts=0, engine=engine, config=CONFIG, daemon_args=args,
                 cpu_weight=daemon_weight) as ov:
        writer = ov.lease_writer()
        writer.put(fake_leases(PRELOAD_BASE, n - burst), txn=100)
        h0, h1 = ov.add_host(wait=False), ov.add_host(wait=False)
        for h in (h0, h1):
            ov.wait_ready(h, timeout=timeout)
        daemons = [ov.daemon(h0), ov.daemon(h1)]
        h2 = ov.add_host(start=False)
        ov.prefer_subnet(h2, NEW_HOST_SUBNET)
        asks = ({h.name: AnswerTimes(ov, h, cpu_weight=asker_weight) for h in (h0, h1, h2)}
                if ask else {})
        # the stream counts from its first reply: both hosts route each other first
        for src, dst in ((h0, h1), (h1, h0)):
            assert ov.first_reply(src, ov.flannel_ip(dst), timeout) is not None, (src.name, dst.name)
        stream = PingStream(ov, h0, ov.flannel_ip(h1), STREAM_INTERVAL, 4 * timeout + 120)
        time.sleep(1.0)

        # the daemons' own clocks of their answers (arrival -> sent), read around each window
        clocks = {"burst": [[daemon_answers(ov, h) for h in (h0, h1)]]}
        # the burst: N - burst -> N
        res, put = burst_phase(ov, daemons, "ge", n + 1, lambda: writer.put(
            fake_leases(BURST_BASE, burst, BURST_FIRST_IP)), timeout)
        out["burst_writes_s"] = put["writes_s"]
        out["burst_cpu_s"] = put["cpu_s"]            # h0's and h1's, from the first put to the last peer
        out["burst_runnable_wait_s"] = put["runnable_wait_s"]    # ... and their waits for a core
        out["burst_timeslices"] = put["timeslices"]                # ... and their threads' wake-ups
        out["burst_cpu_max_s"] = max(put["cpu_s"])
        out["burst_timeslices_max"] = max(put["timeslices"])
        out["burst_after_last_put_s"] = later([None if a is None else res["t_first"] + a
                                               for a in put["absorbed_s"]], res["t_last"])
        burst_window = (put["window"][0], put["window"][1] + 1.0)

        # the fresh start, beside h0 and h1 at rest
        ip2 = str(NEW_HOST_SUBNET.network_address)
        reach: dict = {}
        pingers = threading.Thread(target=lambda: reach.update(first_replies(ov, {
            "h0->h2": (h0, ip2), "h1->h2": (h1, ip2), "h2->h0": (h2, ov.flannel_ip(h0))}, timeout)))
        old_env = os.stat(ov.subnet_file(h2)).st_ino
        clocks["burst"].append([daemon_answers(ov, h) for h in (h0, h1)])
        clocks["start"] = [clocks["burst"][1] + [{}]]
        pingers.start()
        time.sleep(0.2)                     # the pings go before h2 starts
        t_wall = time.time()
        d2 = ov.start_daemon(h2, wait=False)
        env_at = new_file(d2.subnet_file, old_env, timeout)
        ov.wait_ready(h2, timeout=timeout)
        ready_wall = t_wall + (d2.ready_at - d2.started)
        out["start_to_subnet_env_s"] = None if env_at is None else round(env_at - d2.started, 3)
        out["start_to_ready_s"] = round(d2.ready_at - d2.started, 3)
        pingers.join()
        out["new_host_reach_s"] = {k: None if t is None else round(t - t_wall, 3)
                                   for k, t in sorted(reach.items())}
        out["new_host_reached_s"] = later([reach.get("h0->h2"), reach.get("h1->h2")], t_wall)
        out["new_host_reaches_s"] = later([reach.get("h2->h0")], t_wall)
        start_window = (t_wall, max(ready_wall, *(t for t in reach.values() if t)) + 1.0)

        time.sleep(max(0.0, start_window[1] - time.time()))
        asked = {"burst": [q for h in (h0, h1) if ask for q in asks[h.name].asked(*burst_window)],
                 "start": [q for a in asks.values() for q in a.asked(*start_window)]}
        windows = {k: summary(v) for k, v in asked.items()}
        clocks["start"].append([daemon_answers(ov, h) for h in (h0, h1, h2)])
        out["daemon_answers"] = {w: {e: daemon_over(*clocks[w], e) for e in ("metrics", "status")}
                                 for w in clocks}
        for e in ("metrics", "status"):
            out[f"daemon_{e}_over_50ms"] = sum(out["daemon_answers"][w][e]["over"] for w in clocks)
        for a in asks.values():             # the questions cost the daemons CPU: not when idle
            a.close()
        if probe_dir is not None:           # each question, to match with the daemons' clocks
            out["asked_each"] = {h: a.seen for h, a in asks.items()}
            out["windows"] = {"burst": burst_window, "start": start_window}
        out["answers"] = windows
        answers = summary(asked["burst"] + asked["start"]) if ask else {}

        time.sleep(IDLE_SETTLE_S)
        pid = d2.pid
        c0 = cpu_s(pid)
        time.sleep(IDLE_S)
        out["idle_cpu_pct"] = round((cpu_s(pid) - c0) / IDLE_S * 100, 2)
        out["idle_rss_mb"] = round(rss_kb(pid) / 1024, 1)
        out["idle_thread_arenas"], arena_kb = arenas(pid)     # glibc's, and what they hold
        out["idle_thread_arenas_mb"] = round(arena_kb / 1024, 1)
        out["idle_rss_parts_mb"] = rollup_mb(pid)
        out["idle_pss_children_mb"] = round(sum(pss_kb(c) for c in children(pid)) / 1024, 1)

        out["stream"] = stream.stop()
        out["stream_lost"] = out["stream"]["lost"]
        for kind in answers:                # none with --no-ask
            out[f"{kind}_max_ms"] = answers[kind]["max_ms"]
            out[f"{kind}_p99_ms"] = answers[kind]["p99_ms"]
            out["answers_failed"] = out.get("answers_failed", 0) + answers[kind]["failed"]

        out["peers_metric"] = int(ov.metrics(h2).get("flannel_udp_peers", -1))
        swept = sweep(ov, h2, fake_leases(PRELOAD_BASE, n - burst)
                      | fake_leases(BURST_BASE, burst, BURST_FIRST_IP), NO_LEASE, timeout)
        out["sweep"] = swept
        # a sweep that saw too little, or a metric that disagrees, counts as all missing
        ok = swept["read"] >= swept["sent"] and out["peers_metric"] == n + 2
        out["routes_missing"] = swept["missing"] if ok else n
        if engine == "kernel":              # the programs' maps too: what they lacked
            out["kernel_routes_missing"] = swept["kernel_missing"] if ok and \
                swept["kernel_missing"] is not None else n
        errors = [line for d in ov.daemons.values() for line in d.log_text().splitlines()
                  if " ERROR " in line or "Traceback" in line]
        out["daemon_errors"] = errors[:5]
        pids = [d.pid for d in ov.daemons.values()]
        out["daemon_pids"] = {name: d.pid for name, d in ov.daemons.items()}
    gil_probe(None)
    if probe_dir is not None:               # the daemons wrote theirs as they exited
        out.update(gil_figures(probe_dir, pids))
    return out


def run_direct(engine: str, n: int, timeout: float, wait: float, verbose: int,
               burst: int = 0, daemon_weight: int | None = None) -> dict:
    args = (f"-v={verbose}",) if verbose else ()
    with Overlay(hosts=0, engine=engine, config=DIRECT_CONFIG, daemon_args=args,
                 cpu_weight=daemon_weight) as ov:
        leases = fake_leases(PRELOAD_BASE, n)
        ov.lease_writer().put(leases, txn=100, direct_routing=True)
        h = ov.add_host(start=False)
        ov.exec(h, ["ip", "addr", "add", FAKE_PUBLIC_IPS_ON_LINK, "dev", h.iface], check=True)
        d = ov.start_daemon(h, wait=False)
        ov.wait_ready(h, timeout=timeout)
        at_ready = direct_routes(ov, h)
        deadline, kernel, all_at = d.ready_at + min(wait, timeout), at_ready, None
        while kernel < n and time.monotonic() < deadline:
            time.sleep(0.1)
            kernel = direct_routes(ov, h)
        if kernel >= n:
            all_at = time.monotonic()
        m = ov.metrics(h)
        out = direct_burst(ov, h, leases, burst, timeout) if burst and kernel >= n else {}
        return {**out, "direct_start_to_ready_s": round(d.ready_at - d.started, 3),
                "direct_kernel_routes_at_ready": at_ready,
                "direct_start_to_all_routes_s": None if all_at is None else round(all_at - d.started, 3),
                "direct_kernel_routes": kernel,
                "direct_routes_per_s": round((kernel - at_ready) / max(1e-3, time.monotonic() - d.ready_at)),
                "direct_peers_by_mode": {k: v for k, v in m.items() if k.startswith("flannel_udp_peers_by_mode")},
                "direct_routes_missing": n - at_ready}


def direct_burst(ov, host, leases: dict, burst: int, timeout: float) -> dict:
    """The last ``burst`` leases deleted (one revision each), until the kernel has N - burst
    direct routes; then put again, until it has N: seconds after etcd's last answer."""
    n, back = len(leases), dict(list(leases.items())[-burst:])
    writer, out = ov.lease_writer(), {}
    for key, write, want in (("direct_removed_s", lambda: writer.delete(back), n - burst),
                             ("direct_burst_s", lambda: writer.put(back, direct_routing=True), n)):
        last, seen = write()["t_last"], None
        deadline = time.monotonic() + timeout
        while seen is None and time.monotonic() < deadline:
            if direct_routes(ov, host) == want:
                seen = time.time()      # after the listing that showed it (~0.05 s at 16,000)
            else:
                time.sleep(0.05)
        out[key] = None if seen is None else round(seen - last, 3)
    return out


def direct_routes(ov, host) -> int:
    """The kernel's direct routes in the host (``proto 153``, host/direct_routes.py)."""
    routes = ov.exec(host, ["ip", "-4", "route", "show", "proto", "153"], check=True).stdout
    return sum(1 for line in routes.splitlines() if " via " in line)


def one_run(engine: str, a) -> dict:
    """One run's figures; a scene that broke (a daemon that exited, or not READY within
    --timeout) is noted as the run's "error" and counts as over in every figure it lacks."""
    r: dict = {}
    try:
        probe = (None if a.gil_probe is None
                 else os.path.join(a.gil_probe, f"{engine}-{time.strftime('%H%M%S')}"))
        weights = (group_weight(a.cpu_weight), group_weight(a.asker_weight))
        r.update(run_main(engine, a.peers, a.burst, a.timeout, a.v, ask=not a.no_ask,
                          probe_dir=probe, weights=weights))
        if not a.no_direct:
            r.update(run_direct(engine, a.peers, a.timeout, a.direct_wait, a.v, a.burst,
                                weights[0]))
    except (OverlayError, RuntimeError, OSError, subprocess.SubprocessError) as e:
        r["error"] = f"{type(e).__name__}: {e}"[-3000:]
        print(f"{engine}: the run broke: {r['error']}", file=sys.stderr, flush=True)
    return r


def group_weight(weight: int) -> int | None:
    """A cgroup's weight for the testbed; None for the default (the process's own autogroup
    shares the cores alike: no group needed)."""
    return None if weight == cpu_weight.DEFAULT_WEIGHT else weight


def spread(values) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals),
            "unfinished": len(values) - len(vals)}


def summarise(engine: str, runs: list[dict]) -> dict:
    out = {}
    for key, (_, target, _) in TARGETS.items():
        if not any(key in r for r in runs if "error" not in r) and any("error" not in r for r in runs):
            continue                        # not measured (--no-direct, --no-ask)
        values = [r.get(key) for r in runs if key in r or "error" in r]
        s = spread(values)
        if engine not in TARGETED or target is None:
            verdict = "-"
        elif s is None or s["unfinished"]:
            verdict = "over"
        else:
            verdict = "pass" if s["max"] <= target else "over"
        out[key] = {"spread": s, "target": target, "verdict": verdict}
    return out


def fmt(v) -> str:
    return "-" if v is None else f"{v:g}"


def table(summaries: dict, timeout: float) -> str:
    engines = list(summaries)
    lines = ["| figure | target | " + " | ".join(f"{e}: min / median / max | {e}" for e in engines) + " |",
             "|---|---|" + "---|---|" * len(engines)]
    for key, (name, target, unit) in TARGETS.items():
        cells = []
        for e in engines:
            f = summaries[e].get(key)
            if f is None:
                cells += ["not measured", ""]
                continue
            s = f["spread"]
            if s is None:
                cells += [f"none within its wait (--timeout {timeout:g} s)", f["verdict"]]
                continue
            late = f" ({s['unfinished']} run(s) not within its wait)" if s["unfinished"] else ""
            cells += [f"{fmt(s['min'])} / {fmt(s['median'])} / {fmt(s['max'])} {unit}{late}", f["verdict"]]
        tgt = "info" if target is None else f"<= {target:g} {unit}".rstrip()
        lines.append(f"| {name} | {tgt} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _interrupted(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    scene = ap.add_argument_group("the scene")
    scene.add_argument("--engines", default="c",
                       help="c, kernel (the kernel path, the C engine behind it), python, or a "
                            "list: kernel,c")
    scene.add_argument("--peers", type=int, default=16000, help="N: peer leases present")
    scene.add_argument("--burst", type=int, default=5000, help="the burst goes from N - burst to N")
    scene.add_argument("-v", type=int, default=0, help="the daemons' -v")
    how = ap.add_argument_group("how long, how often")
    how.add_argument("--runs", type=int, default=3)
    how.add_argument("--timeout", type=float, default=120.0, help="bound of every wait, seconds")
    how.add_argument("--no-direct", action="store_true", help="skip the DirectRouting start")
    how.add_argument("--no-ask", action="store_true",
                     help="ask no /metrics nor status (what the questions cost the start: A/B)")
    how.add_argument("--direct-wait", type=float, default=20.0,
                     help="how long after READY to wait for every direct route (default 20 s)")
    how.add_argument("--gil-probe", default=None, metavar="DIR",
                     help="count each daemon's waits for the interpreter and its garbage "
                          "collections into DIR (perf/gil_probe; its thread costs ~1%% of CPU: "
                          "the idle CPU figure is not the daemon's then)")
    share = ap.add_argument_group("the CPU shares (perf/README.md#cpu-weight)")
    with open(UNIT) as f:
        unit_weight = cpu_weight.unit_weight(f.read())
    share.add_argument("--cpu-weight", type=cpu_weight.check_weight, default=unit_weight,
                       help="each daemon in a cgroup of its own at this CPUWeight (default "
                            f"{unit_weight}: the shipped unit's, packaging/flannel-udp.service); "
                            f"{cpu_weight.DEFAULT_WEIGHT}: a program like any other")
    share.add_argument("--asker-weight", type=cpu_weight.check_weight, default=ASKER_WEIGHT,
                       help="the askers of /metrics and status likewise (default "
                            f"{ASKER_WEIGHT}: a measuring tool that waits for no core; "
                            f"{cpu_weight.DEFAULT_WEIGHT}: their own waits count in the answers)")
    ap.add_argument("--json", default=None, help="write the runs and the table's figures here")
    ap.add_argument("--table", default=None, metavar="JSON", help="only print the table of a saved run")
    a = ap.parse_args()
    if a.table:
        with open(a.table) as f:
            print(table(json.load(f)["summary"], a.timeout))
        return 0
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    if not 0 < a.burst <= a.peers:
        print("--burst must be within 1..--peers", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupted)     # the overlays' teardown runs on the way out
    compiled()                                      # as installed: with its byte code
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[:3]
    t_all = time.monotonic()
    runs: dict = {}
    for i in range(a.runs):
        for engine in a.engines.split(","):
            t = time.monotonic()
            r = one_run(engine, a)
            r["run_s"] = round(time.monotonic() - t, 1)
            print(json.dumps(dict(r, engine=engine, run=i + 1)), flush=True)
            runs.setdefault(engine, []).append(r)
    summaries = {e: summarise(e, rs) for e, rs in runs.items()}
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[:3]
    print()
    print(f"N={a.peers}, burst {a.burst}, {a.runs} run(s), {time.monotonic() - t_all:.0f} s; "
          f"load average before {' '.join(load_before)}, after {' '.join(load_after)}; "
          f"CPU weight of the daemons {a.cpu_weight}, of the askers {a.asker_weight}")
    print(table(summaries, a.timeout))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "argv": sys.argv[1:], "cpu_weight": a.cpu_weight,
                       "asker_weight": a.asker_weight, "load_before": load_before,
                       "load_after": load_after,
                       "runs": runs, "summary": summaries}, f, indent=1)
    over = [k for s in summaries.values() for k, f in s.items() if f["verdict"] == "over"]
    return 1 if over else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:      # the overlays were closed on the way out
        print(f"interrupted ({str(e) or 'Ctrl-C'}): what was started is removed", file=sys.stderr)
        sys.exit(130)
