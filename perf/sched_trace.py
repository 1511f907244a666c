"""Latency under load with the scheduler watched: who waited for a core, how long, and why.

    python perf/sched_trace.py --path c --rate 150000 --perf /tmp/c.data
    python perf/sched_trace.py --path c --nice -19 --slice-us 100        # EEVDF knobs, no trace
    python perf/sched_trace.py --path c-rt-coalesce50 --rate 150000 --perf /tmp/rt50.data
    perf sched timehist -i /tmp/c.data | less                           # the whole timeline

Sets up the bench's two-host testbed and one path (perf/README.md: The testbed), then runs
the bench's loaded latency measurement once: `udpgen rr` round trips (host A's CPU0 to host B's
CPU1 and back) beside a paced background stream of `--rate` pps. With `--perf FILE`, `perf sched
record -a` covers the round trips, and the summary lists, per task, the wake-ups that waited longer
than `--late-ms` for a core (`perf sched timehist`'s "sch delay": woken, runnable, not yet running)
and, for the longest wait of the forwarders' threads, what ran on that CPU meanwhile.

`--nice N` and `--slice-us US` set every thread of the engine forwarders after they started, with
sched_setattr(2) (SCHED_OTHER; a custom EEVDF slice needs Linux >= 6.12): the experiments of
perf/README.md#latency-under-load. As root; the load is bounded by --count round trips, and the
testbed is removed on exit.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataplane.bench import build, measure  # noqa: E402
from dataplane.bench.path_choice import make_path  # noqa: E402
from dataplane.bench.paths import ALL_PATHS  # noqa: E402
from dataplane.bench.topo import BenchTopo  # noqa: E402

SYS_SCHED_SETATTR = 314          # x86_64
INTERVAL_US = 500                # the bench's probe interval


class SchedAttr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32),
                ("flags", ctypes.c_uint64), ("nice", ctypes.c_int32),
                ("priority", ctypes.c_uint32), ("runtime", ctypes.c_uint64),
                ("deadline", ctypes.c_uint64), ("period", ctypes.c_uint64),
                ("util_min", ctypes.c_uint32), ("util_max", ctypes.c_uint32)]


def set_fair(tid: int, nice: int, slice_us: int) -> None:
    """SCHED_OTHER at ``nice`` with a slice of ``slice_us`` (0: the default) for one thread:
    os.setpriority and os.sched_setscheduler have no slice."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = SchedAttr(size=ctypes.sizeof(SchedAttr), policy=0, nice=nice,
                     runtime=slice_us * 1000)
    if libc.syscall(SYS_SCHED_SETATTR, tid, ctypes.byref(attr), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sched_setattr({tid}): {os.strerror(err)}")


def threads(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


TIMEHIST = re.compile(r"^\s*(\d+\.\d+)\s+\[(\d+)\]\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")


def timehist(data: str) -> list[tuple[float, int, str, float, float, float]]:
    """(time s, cpu, task, wait ms, sched delay ms, run ms) per switch-in, from perf."""
    out = subprocess.run(["perf", "sched", "timehist", "-i", data], capture_output=True,
                         text=True, timeout=300).stdout
    rows = []
    for line in out.splitlines():
        m = TIMEHIST.match(line)
        if m:
            rows.append((float(m[1]), int(m[2]), m[3], float(m[4]), float(m[5]), float(m[6])))
    return rows


def summarize(rows, late_ms: float, forwarders: set[int]) -> list[str]:
    late = defaultdict(list)
    for t, cpu, task, _wait, delay, _run in rows:
        if delay > late_ms:
            late[(task, cpu)].append(delay)
    lines = [f"wake-ups that waited > {late_ms} ms for a core (task, cpu: count, max ms):"]
    for (task, cpu), d in sorted(late.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {task} cpu{cpu}: {len(d)}, max {max(d):.2f}")
    # The forwarders' longest wait, and who held the CPU meanwhile.
    def tid_of(task):
        m = re.search(r"\[(\d+)", task)
        return int(m[1]) if m else -1
    fw = [r for r in rows if tid_of(r[2]) in forwarders]
    if fw:
        worst = max(fw, key=lambda r: r[4])
        t, cpu, task, _w, delay, _r = worst
        held = defaultdict(float)
        for t2, cpu2, task2, _w2, _d2, run2 in rows:
            if cpu2 == cpu and t - delay / 1e3 <= t2 <= t and task2 != task:
                held[task2] += run2
        lines.append(f"longest forwarder wait: {task} on cpu{cpu}, {delay:.2f} ms; "
                     "meanwhile on that CPU (ms run): " +
                     ", ".join(f"{k} {v:.2f}" for k, v in sorted(held.items(), key=lambda kv: -kv[1])))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", default="c", help=f"a bench path ({', '.join(ALL_PATHS)})")
    ap.add_argument("--rate", type=float, default=150000,
                    help="background 64 B packets/s during the round trips (default 150000)")
    ap.add_argument("--count", type=int, default=2000, help="round trips (100-20000, default 2000)")
    ap.add_argument("--nice", type=int, default=0, help="nice of the forwarders' threads (-20..19)")
    ap.add_argument("--slice-us", type=int, default=0,
                    help="EEVDF slice of the forwarders' threads (100-100000 us; 0 = default)")
    ap.add_argument("--perf", metavar="FILE", help="perf sched record -a into FILE, then summarize")
    ap.add_argument("--late-ms", type=float, default=0.5, help="a wait counted as late (ms)")
    a = ap.parse_args()
    if not 100 <= a.count <= 20000:
        ap.error("--count must be 100..20000")
    if not -20 <= a.nice <= 19:
        ap.error("--nice must be -20..19")
    if a.slice_us and not 100 <= a.slice_us <= 100000:
        ap.error("--slice-us must be 0 or 100..100000 (the kernel's bounds)")
    if a.rate < 0:
        ap.error("--rate must be >= 0")
    tools = measure.Tools(**build.setup())
    probe_s = a.count * INTERVAL_US / 1e6
    with BenchTopo() as topo:
        path = make_path(topo, a.path)
        path.setup()
        try:
            measure.udp_trial(topo, tools, size=64, rate=2000, duration=0.1)
            forwarders = {t for pid in path.forwarder_pids().values() for t in threads(pid)}
            if a.nice or a.slice_us:
                for tid in forwarders:
                    set_fair(tid, a.nice, a.slice_us)
                # Read back: setpriority on a TID changes that thread only, the trap of renice.
                got = {tid: os.getpriority(os.PRIO_PROCESS, tid) for tid in forwarders}
                print(f"{len(forwarders)} forwarder threads: nice {sorted(set(got.values()))}, "
                      f"slice {a.slice_us or 'default'} us", file=sys.stderr)
            rec = None
            if a.perf:
                rec = subprocess.Popen(["perf", "sched", "record", "-a", "-o", a.perf, "--",
                                        "sleep", f"{probe_s + 1:.1f}"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(0.3)
            res = measure.latency(topo, tools, count=a.count, interval_us=INTERVAL_US,
                                  bg_rate=a.rate, bg_size=64)
            if rec is not None:
                rec.wait(timeout=probe_s + 30)
        finally:
            path.teardown()
    print(json.dumps(res))
    if a.perf:
        for line in summarize(timehist(a.perf), a.late_ms, forwarders):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
