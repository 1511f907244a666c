"""A fresh daemon's start beside many leases: from its exec to subnet.env, and to READY=1.

    python perf/lease_start.py --peers 16000 --runs 3 --engine c
    python perf/lease_start.py --peers 16000 --runs 1 --profile /tmp/start.prof
    python perf/lease_start.py --peers 16000 --runs 1 --tracemalloc /tmp/start.snap
    python perf/lease_start.py --peers 16000 --runs 1 --timeline
    python perf/lease_start.py --peers 16000 --runs 4 --engine kernel --ask
    OTHER/.venv/bin/python perf/lease_start.py --tree OTHER     # another checkout OTHER of the code
    python -c "import pstats; pstats.Stats('/tmp/start.prof').sort_stats('cumulative').print_stats(40)"

A real etcd holds ``--peers`` leases (each its own PublicIP, as perf/lease_burst.py writes them);
then one daemon at a time starts on a new host (a new process, no handover), is timed to its
subnet.env and to READY=1 (sent once the routes to every listed peer are in), and goes again
with its host and its lease, so that every run sees the same leases. The kernel path's pins go
with the host (a new host of the same name would adopt its maps, a restart's work), unless
``--keep-pins``. ``--profile FILE`` runs
the daemon under cProfile from its first line to READY=1 and writes the stats there (the
start's work, not its wall time: the profiler slows it down; the main thread only), and prints
the etcd client's calls it saw. Each run says how many Range requests etcd answered until READY and how many
bytes it sent (its /metrics): the listings a start makes, and the daemon's resident memory
``IDLE_SETTLE_S`` after READY (its idle RSS; the same with ``--peers 0`` is what a lease adds to).
``--tracemalloc FILE`` traces the daemon's Python allocations from its first line and writes
the snapshot of what is still held ``IDLE_SETTLE_S`` after READY=1 (less the tracer's own), and
prints its largest lines and files. ``--timeline`` prints when each start step began and
ended (the daemon's own monotonic clock, from the harness's exec), the imports included.
``--ask`` asks the starting daemon's /metrics and status every ``ASK_PERIOD_S`` from before its
exec to a second after READY=1 (dataplane/testbed/answer_times.py, the asker at CPU weight
10,000 as perf/scale.py has it) and prints each answer over ``ASK_SLOW_MS``, with when it was
asked: the start's own answers without the rest of perf/scale.py's scene. As root; the testbed
is removed on exit.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

# --tree DIR: measure the code of another checkout (e.g. main's, for a before/after in turns)
_TREE = (sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv
         else os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.abspath(_TREE))

from dataplane.host.child import cli_argv  # noqa: E402
from dataplane.testbed.answer_times import AnswerTimes  # noqa: E402
from dataplane.testbed.overlay import Overlay  # noqa: E402
from dataplane.testbed.lease_writer import FAKE_PUBLIC_IPS_ON_LINK  # noqa: E402
from perf.lease_burst import (CONFIG, DIRECT_CONFIG, PRELOAD_BASE, compiled, leases,  # noqa: E402
                              rss_kb, wait_file)

IDLE_SETTLE_S = 2.0     # READY=1 to the idle RSS, as perf/scale.py
ASK_PERIOD_S = 0.05     # --ask: a question of each kind this often (perf/scale.py's askers)
ASK_SLOW_MS = 10.0      # --ask: the answers printed

# Run in the daemon's process: cProfile from the start, dumped when READY=1 goes out.
_PROFILED = """
import cProfile, sys
sys.argv[0] = 'flannel-udp'
_prof = cProfile.Profile()
_prof.enable()
from dataplane.daemon import systemd as _sd, main as _main
_notify = _sd.sd_notify
def _at_ready(text, *a, **kw):
    if text.startswith('READY=1'):
        _prof.disable()
        _prof.dump_stats({out!r})
    return _notify(text, *a, **kw)
_main.sd_notify = _at_ready
"""

# The same for --tracemalloc: the snapshot of what is held IDLE_SETTLE_S after READY=1.
_TRACED = """
import sys, threading, tracemalloc
sys.argv[0] = 'flannel-udp'
tracemalloc.start()
from dataplane.daemon import systemd as _sd, main as _main
_notify = _sd.sd_notify
def _dump():
    tracemalloc.take_snapshot().dump({out!r} + '.tmp')
    import os
    os.rename({out!r} + '.tmp', {out!r})
def _at_ready(text, *a, **kw):
    if text.startswith('READY=1'):
        t = threading.Timer({settle!r}, _dump)
        t.daemon = True
        t.start()
    return _notify(text, *a, **kw)
_main.sd_notify = _at_ready
"""

# The same for --timeline: each start step's (name, begin, end) on the monotonic clock, the
# harness's own, written when READY=1 goes out.
_TIMED = """
import sys, time
_t0 = time.monotonic()
sys.argv[0] = 'flannel-udp'
_steps = [('python up to the first line', None, _t0)]
from dataplane.daemon import systemd as _sd, startup as _su, subnet_env as _se
from dataplane.daemon import early_load as _el
def _timed(owner, name, label):
    f = getattr(owner, name)
    def timed(*a, **kw):
        t = time.monotonic()
        try:
            return f(*a, **kw)
        finally:
            _steps.append((label, t, time.monotonic()))
    setattr(owner, name, timed)
for _n in ('receive_inherited', 'select_interface', 'make_registry', 'start_http_servers',
           'wait_for_config', 'choose_engine', 'acquire_lease', 'open_dataplane',
           'install_rules', 'start_watches', 'wait_for_peers'):
    _timed(_su, _n, _n)
_timed(_se.SubnetEnv, 'want', 'subnet.env written')
_timed(_el.EarlyLoad, '_run', 'kernel path: early load (its thread)')
def _at_ready(text, *a, **kw):
    if text.startswith('READY=1'):
        import os
        _c = os.times()
        _steps.append(('READY=1 (process CPU %.0f ms)' % ((_c.user + _c.system) * 1e3), None,
                       time.monotonic()))
        with open({out!r} + '.tmp', 'w') as f:
            f.write(repr(_steps))
        os.rename({out!r} + '.tmp', {out!r})
    return _sd.sd_notify(text, *a, **kw)
_early_start = _el.start
def _step0(*a, **kw):
    # the daemon's imports are done (its run has begun): its methods timed from here on
    _main = sys.modules.get('dataplane.daemon.main')
    if _main is None or _main.sd_notify is _at_ready:     # run.py's early_load.begin()
        return _early_start(*a, **kw)
    _steps.append(('imports, the flags, the daemon made', _t0, time.monotonic()))
    _timed(_main.Daemon, '_make_engine', 'make the engine')
    _timed(_main.Daemon, '_start_engine', 'start the engine')
    _timed(_main.Daemon, '_select_engine', 'select the engine (joins the early load)')
    _main.sd_notify = _at_ready
    return _early_start(*a, **kw)
_el.start = _step0
"""


def timeline(path: str, started: float) -> None:
    """The steps ``_TIMED`` wrote at ``path``, in ms from the daemon's exec."""
    import ast
    with open(path) as f:
        steps = ast.literal_eval(f.read())
    for name, begin, end in sorted(steps, key=lambda s: s[2] if s[1] is None else s[1]):
        b = "" if begin is None else f"{(begin - started) * 1e3:7.0f}"
        print(f"  {b:>7} -> {(end - started) * 1e3:5.0f} ms"
              f"{'' if begin is None else f' ({(end - begin) * 1e3:5.0f})'}  {name}")


def profiled_argv(out: str, prologue_of: str = _PROFILED):
    """Overlay.daemon_argv's command, the daemon under cProfile (imports included), or
    under ``prologue_of``'s code."""
    def argv(host, engine, args=()):
        plain = cli_argv("x")
        code = plain[2]
        prologue, _, _ = code.partition("sys.argv[0] = 'flannel-udp'")
        body = (prologue_of.format(out=out, settle=IDLE_SETTLE_S) + "import dataplane.cli as _cli\n"
                "sys.exit(_cli.main())\n")
        return [plain[0], "-c", prologue + body] + [str(a) for a in host_cmd(host, engine, args)]
    return argv


def etcd_counts(etcd) -> tuple[int, int]:
    """(Range requests etcd has answered, bytes it has sent to clients) so far."""
    import subprocess
    text = subprocess.run(etcd._wrap(["curl", "-s", etcd.client_url + "/metrics"]),
                          capture_output=True, text=True, timeout=10, check=True).stdout
    ranges = sent = 0
    for line in text.splitlines():
        if line.startswith("grpc_server_handled_total") and 'grpc_method="Range"' in line:
            ranges += int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("etcd_network_client_grpc_sent_bytes_total"):
            sent += int(float(line.rsplit(" ", 1)[1]))
    return ranges, sent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=16000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--engine", default="c", choices=("c", "kernel", "python"))
    ap.add_argument("--profile", metavar="FILE", help="cProfile the daemon until READY=1")
    ap.add_argument("--tracemalloc", metavar="FILE",
                    help="trace the daemon's allocations; the snapshot 2 s after READY=1")
    ap.add_argument("--timeline", action="store_true", help="each start step's times")
    ap.add_argument("--tree", metavar="DIR", help="the checkout whose code runs (default: this one)")
    ap.add_argument("--direct", action="store_true",
                    help="DirectRouting: the config and every lease say so, and every PublicIP is "
                         "on the host's link (perf/scale.py's DirectRouting scene): READY comes "
                         "with the kernel's 16,000 direct routes")
    ap.add_argument("--ask", action="store_true",
                    help="ask /metrics and status during the start; print the answers over "
                         f"{ASK_SLOW_MS:g} ms")
    ap.add_argument("--keep-pins", action="store_true",
                    help="kernel path: leave a run's pins to the next run's daemon (which then "
                         "adopts the maps of the one before: a restart's work, not a fresh start's)")
    a = ap.parse_args()
    global host_cmd
    compiled()                          # the daemon as installed: with its byte code
    env_s, ready_s, rss_mb = [], [], []
    config = DIRECT_CONFIG if a.direct else CONFIG
    with Overlay(hosts=0, engine=a.engine, config=config) as ov:
        ov.lease_writer().put(leases(PRELOAD_BASE, 0, a.peers), txn=100,
                              direct_routing=a.direct)
        if a.profile:
            host_cmd = ov.daemon_command
            ov.daemon_argv = profiled_argv(a.profile)
        elif a.tracemalloc:
            host_cmd = ov.daemon_command
            ov.daemon_argv = profiled_argv(a.tracemalloc, _TRACED)
        elif a.timeline:
            host_cmd = ov.daemon_command
            steps_file = os.path.join(ov.tb.workdir, "timeline")
            ov.daemon_argv = profiled_argv(steps_file, _TIMED)
        for _ in range(a.runs):
            h = ov.add_host(start=False)
            with contextlib.suppress(FileNotFoundError):     # a fresh host: no previous subnet
                os.unlink(ov.subnet_file(h))
            if a.tracemalloc:                                 # this run's snapshot, not the last's
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(a.tracemalloc)
            if a.direct:                        # every fake PublicIP on its link
                ov.exec(h, ["ip", "addr", "add", FAKE_PUBLIC_IPS_ON_LINK, "dev", h.iface],
                        check=True)
            before = etcd_counts(ov.etcd)
            asker = AnswerTimes(ov, h, period=ASK_PERIOD_S, cpu_weight=10000) if a.ask else None
            if asker is not None:
                time.sleep(0.3)                 # its first questions go before the exec
            t_exec = time.time()
            d = ov.start_daemon(h, wait=False)
            t_env = wait_file(d.subnet_file, 60)
            ov.wait_ready(h, timeout=120)
            after = etcd_counts(ov.etcd)
            env_s.append(round(t_env - d.started, 3))
            ready_s.append(round(d.ready_at - d.started, 3))
            time.sleep(max(0.0, d.ready_at + IDLE_SETTLE_S - time.monotonic()))   # ready_at: monotonic
            if asker is not None:
                until = t_exec + (d.ready_at - d.started) + 1.0
                seen = [(t - t_exec, kind, ms) for t, kind, ms in asker.seen if t_exec <= t <= until]
                slow = ", ".join(f"{kind} {ms:.1f} ms at {t:.3f} s" for t, kind, ms in seen
                                 if ms > ASK_SLOW_MS or ms < 0)
                asker.close()
                print(f"asked {len(seen)} questions until READY + 1 s; over {ASK_SLOW_MS:g} ms "
                      f"(or failed: -1): {slow or 'none'}", flush=True)
            rss_mb.append(round(rss_kb(d.pid) / 1024, 1))
            if a.tracemalloc:
                wait_file(a.tracemalloc, 60)
            if a.timeline:
                timeline(steps_file, d.started)
                os.unlink(steps_file)
            print(f"start to subnet.env {env_s[-1]:.3f} s, to READY {ready_s[-1]:.3f} s; etcd "
                  f"until READY: {after[0] - before[0]} Range requests, "
                  f"{(after[1] - before[1]) / 1e6:.2f} MB sent; RSS {IDLE_SETTLE_S:g} s after "
                  f"READY {rss_mb[-1]:.1f} MB", flush=True)
            pins = ov.tb.bpf_pins(h) if a.engine == "kernel" else None
            ov.remove_host(h)
            if pins and not a.keep_pins:        # the next run's host (the same name) is a fresh one
                from dataplane.engine import bpf_pins
                for d in bpf_pins.directories(pins):
                    bpf_pins.unpin_all(d)
            time.sleep(0.5)
    if len(env_s) > 1:
        print(f"median of {len(env_s)}: subnet.env {statistics.median(env_s):.3f} s, "
              f"READY {statistics.median(ready_s):.3f} s, RSS {statistics.median(rss_mb):.1f} MB")
    if a.tracemalloc:
        traced(a.tracemalloc)
    if a.profile:
        import pstats
        st = pstats.Stats(a.profile)
        calls = {f[2]: v[1] for f, v in st.stats.items()
                 if f[0].endswith("control/etcd.py") and f[2] in ("get", "get_raw", "put", "put_if",
                                                                   "grant", "revoke", "txn",
                                                                   "_call", "time_to_live")}
        print("etcd calls until READY:", calls)
    return 0


def traced(path: str, top: int = 25) -> None:
    """What the snapshot at ``path`` holds: in all, by file, and its largest lines."""
    import tracemalloc
    snap = tracemalloc.Snapshot.load(path).filter_traces(
        (tracemalloc.Filter(False, tracemalloc.__file__),))
    lines = snap.statistics("lineno")
    print(f"traced, held {IDLE_SETTLE_S:g} s after READY: "
          f"{sum(s.size for s in lines) / 1e6:.2f} MB in {sum(s.count for s in lines)} blocks")
    for kind in ("filename", "lineno"):
        for st in snap.statistics(kind)[:top]:
            frame = st.traceback[0]
            where = frame.filename if kind == "filename" else f"{frame.filename}:{frame.lineno}"
            print(f"  {st.size / 1e6:8.3f} MB {st.count:8d}  {where}")


host_cmd = None

if __name__ == "__main__":
    sys.exit(main())
