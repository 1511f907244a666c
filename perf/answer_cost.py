"""What one /metrics or status answer costs an idle daemon beside many leases, and what asking
leaves behind in its memory.

    python perf/answer_cost.py --peers 16000                 # as root; about 30 s
    OTHER/.venv/bin/python perf/answer_cost.py --tree OTHER  # another checkout's code, in turns
    python perf/answer_cost.py --peers 16000 --engine kernel --ask-for 30

A real etcd holds ``--peers`` leases (perf/lease_burst.py's), one daemon starts on a new host and
goes idle (``IDLE_SETTLE_S`` after READY=1). Then, from inside its host, ``--questions`` of each
kind back to back (one small child asks, as dataplane/testbed/answer_times.py does): the
daemon's CPU per answer (every thread's run time, /proc/PID/task/*/schedstat, in nanoseconds)
and the client's wall time per answer (median and max: idle, so the machine's noise only). Then
the harness's pattern, /metrics and status in turn every 100 ms for ``--ask-for`` seconds, and
the daemon's RSS before it and ``IDLE_SETTLE_S`` after it: what answering leaves resident.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import os
import signal
import statistics
import subprocess
import sys
import time

_TREE = (sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv
         else os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.abspath(_TREE))

from dataplane.testbed.overlay import Overlay  # noqa: E402
from perf import lease_start  # noqa: E402
from perf.lease_burst import CONFIG, PRELOAD_BASE, compiled, leases, rss_kb  # noqa: E402

IDLE_SETTLE_S = 2.0

# --profile: each render of /metrics and each status document under one cProfile, dumped after
# each (the questions come one at a time)
_PROFILED = """
import cProfile, sys
sys.argv[0] = 'flannel-udp'
_prof = cProfile.Profile()
from dataplane.daemon import metrics_text as _mt, status as _st
def _profiled(f):
    def run(*a, **kw):
        _prof.enable()
        try:
            return f(*a, **kw)
        finally:
            _prof.disable()
            _prof.dump_stats({out!r})
    return run
_mt.MetricsText.render = _profiled(_mt.MetricsText.render)
_st.StatusServer.answer = _profiled(_st.StatusServer.answer)
"""

# Asks one kind ``count`` times back to back (``period`` apart), prints one wall time (ms) a line.
_ASKER = r"""
import socket, sys, time, urllib.request
kind, url, status_path, count, period = sys.argv[1:6]
def metrics():
    return urllib.request.urlopen(url, timeout=5).read()
def status():
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(status_path)
        return s.makefile("rb").read()
kinds = [metrics, status] if kind == "both" else [metrics if kind == "metrics" else status]
for _ in range(int(count)):
    for ask in kinds:
        t0 = time.perf_counter()
        try:
            body = ask()
        except OSError:             # nothing listens yet (a daemon starting)
            continue
        print(ask.__name__, round((time.perf_counter() - t0) * 1e3, 3), len(body), flush=True)
    time.sleep(float(period))
"""


def cpu_ns(pid: int) -> int:
    """Every thread's run time so far (the kernel's scheduler accounting, nanoseconds)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        with contextlib.suppress(OSError):
            with open(path) as f:
                total += int(f.read().split()[0])
    return total


def arenas(pid: int) -> tuple[int, float]:
    """(glibc's thread arenas, the KB they hold resident): each a 64 MB reservation of its own
    (an rw-p part and the ---p rest), told apart by that size."""
    regions, cur = [], None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                cur = [lo, hi, head[1], len(head) == 5, 0]
                regions.append(cur)
            elif head[0] == "Rss:" and cur is not None:
                cur[4] = int(head[1])
    count, rss = 0, 0
    for a, b in zip(regions, regions[1:]):
        if (a[3] and b[3] and a[2] == "rw-p" and b[2] == "---p" and a[1] == b[0]
                and b[1] - a[0] == 64 << 20):
            count, rss = count + 1, rss + a[4]
    return count, rss


def rollup_mb(pid: int) -> dict:
    """/proc/PID/smaps_rollup's Rss, and of it the anonymous pages and the files' (the
    libraries' pages this process has mapped, shared with every process that maps them)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        kb = {line.split(":")[0]: int(line.split()[1]) for line in f if line.endswith("kB\n")}
    heap, in_heap = 0, False
    with open(f"/proc/{pid}/smaps") as f:            # glibc's main heap: the brk area
        for line in f:
            if not line[0].isupper():
                in_heap = line.rstrip().endswith("[heap]")
            elif in_heap and line.startswith("Rss:"):
                heap += int(line.split()[1])
    return {"rss": round(kb["Rss"] / 1024, 1), "anon": round(kb["Anonymous"] / 1024, 1),
            "heap": round(heap / 1024, 1), "file": round((kb["Rss"] - kb["Anonymous"]) / 1024, 1)}


def ask(ov, host, kind: str, count: int, period: float) -> list[tuple[str, float, int]]:
    url = f"http://127.0.0.1:{ov.healthz_port}/metrics"
    out = ov.exec(host, [sys.executable, "-c", _ASKER, kind, url, ov.status_socket(host),
                         str(count), str(period)], timeout=count * (period + 5) + 30, check=True)
    rows = []
    for line in out.stdout.split("\n"):
        if line.strip():
            name, ms, size = line.split()
            rows.append((name, float(ms), int(size)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=16000)
    ap.add_argument("--engine", default="c", choices=("c", "kernel", "python"))
    ap.add_argument("--questions", type=int, default=200, help="of each kind, back to back")
    ap.add_argument("--ask-for", type=float, default=20.0,
                    help="seconds of the harness's pattern (both kinds every 100 ms)")
    ap.add_argument("--ask-during-start", action="store_true",
                    help="ask both every 100 ms from before the start until 1 s after READY")
    ap.add_argument("--tree", metavar="DIR", help="the checkout whose code runs (default: this one)")
    for flag, what in (
            ("--profile", "cProfile the daemon's /metrics renders and status documents"),
            ("--syscalls", "count the daemon's syscalls (strace -c) while it answers each kind "
                           "(FILE.metrics, FILE.status)"),
            ("--perf", "`perf record -g` the daemon while it answers /metrics")):
        ap.add_argument(flag, metavar="FILE", help=f"{what}, into FILE")
    a = ap.parse_args()
    compiled()
    with Overlay(hosts=0, engine=a.engine, config=CONFIG) as ov:
        ov.lease_writer().put(leases(PRELOAD_BASE, 0, a.peers), txn=100)
        if a.profile:
            lease_start.host_cmd = ov.daemon_command
            ov.daemon_argv = lease_start.profiled_argv(a.profile, _PROFILED)
        h = ov.add_host(start=False)
        asker = None
        if a.ask_during_start:          # as perf/scale.py's questions: from before the start
            asker = ov.tb.popen(h, [sys.executable, "-c", _ASKER, "both",
                                    f"http://127.0.0.1:{ov.healthz_port}/metrics",
                                    ov.status_socket(h), "1000000", "0.1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        d = ov.start_daemon(h, wait=False)
        ov.wait_ready(h, timeout=120)
        if asker is not None:
            time.sleep(1.0)
            ov.tb.kill(asker)
        time.sleep(max(0.0, d.ready_at + IDLE_SETTLE_S - time.time()))
        rss0 = rss_kb(d.pid) / 1024
        if a.ask_during_start:
            print(f"RSS {IDLE_SETTLE_S:g} s after READY, asked every 100 ms from before the "
                  f"start until 1 s after READY: {rss0:.1f} MB", flush=True)
        for kind in ("metrics", "status"):
            ask(ov, h, kind, 5, 0.0)                     # the first answers' one-off work
            rec = None
            if a.perf and kind == "metrics":
                rec = subprocess.Popen(["perf", "record", "-q", "-g", "-p", str(d.pid), "-o",
                                        a.perf], stdout=subprocess.DEVNULL)
            elif a.syscalls:            # every thread's syscalls while it answers this kind
                rec = subprocess.Popen(["strace", "-f", "-c", "-p", str(d.pid), "-o",
                                        f"{a.syscalls}.{kind}"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
            if rec is not None:
                time.sleep(0.5)
            c0 = cpu_ns(d.pid)
            t0 = time.monotonic()
            rows = ask(ov, h, kind, a.questions, 0.0)
            c1, t1 = cpu_ns(d.pid), time.monotonic()
            if rec is not None:
                rec.send_signal(signal.SIGINT)
                rec.wait(30)
            walls = sorted(ms for _, ms, _ in rows)
            print(f"{kind}: {len(rows)} answers of {rows[-1][2]} bytes; the daemon's CPU "
                  f"{(c1 - c0) / 1e6 / len(rows):.2f} ms an answer ({(c1 - c0) / 1e9:.2f} s "
                  f"in {t1 - t0:.1f} s); the client's wall median "
                  f"{statistics.median(walls):.2f} ms, p99 {walls[int(len(walls) * .99)]:.2f},"
                  f" max {walls[-1]:.2f} ms", flush=True)
        rss1 = rss_kb(d.pid) / 1024
        n = int(a.ask_for / 0.1)
        c0 = cpu_ns(d.pid)
        ask(ov, h, "both", n, 0.1)
        c1 = cpu_ns(d.pid)
        time.sleep(IDLE_SETTLE_S)
        rss2 = rss_kb(d.pid) / 1024
        print(f"smaps_rollup: {rollup_mb(d.pid)}", flush=True)
        n_arenas, arena_kb = arenas(d.pid)
        print(f"glibc thread arenas: {n_arenas}, {arena_kb / 1024:.1f} MB resident", flush=True)
        print(f"RSS idle {rss0:.1f} MB; after {2 * a.questions + 10} answers {rss1:.1f} MB; "
              f"after {a.ask_for:g} s of both every 100 ms ({c1 - c0 and (c1 - c0) / 1e6 / n:.2f}"
              f" ms of CPU a pair) and {IDLE_SETTLE_S:g} s idle {rss2:.1f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
