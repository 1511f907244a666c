"""Which of the daemon's files, on which threads and in which processes, one lease event crosses.

    python perf/lease_event_trace.py [--engine c] [--events 5] [--window 0.3]

As root, on the project's testbed: an etcd and one host h0 running a real daemon, started with a
profiler (a ``sitecustomize`` on its PYTHONPATH, this script's ``_trace_site`` directory) that writes,
per process, each (file under dataplane/, thread, 10 ms slot) in which a Python function of that
file was called. Then, per event: a quiet window of ``--window`` seconds with nothing written to etcd,
and a peer's lease put into etcd followed by the same window. A file counts for the event when it
was called in the event's window and not in the quiet one before it (the serve loop's ticks run in
both); the figure is the union over ``--events`` events, and the files seen in every event.

C files are not traced: what the engine's table update calls in csrc/ is read off the code (the
engine's set_routes -> dp_routes_build and the swap), and named beside the figure by hand.

Bounded: every wait has a timeout, the testbed removes h0, the etcd and every process it started.
"""
from __future__ import annotations

import argparse
import glob
import ipaddress
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataplane.testbed.overlay import Overlay  # noqa: E402

SITE = '''
import os, sys, threading, time
_out = os.environ.get("FLANNEL_UDP_TRACE_DIR")
if _out:
    _seen = set()
    _f = open(os.path.join(_out, "trace-%d.txt" % os.getpid()), "a", buffering=1)
    _lock = threading.Lock()

    def _prof(frame, event, _arg):
        if event != "call":
            return
        fn = frame.f_code.co_filename
        i = fn.rfind("/dataplane/")
        if i < 0:
            return
        key = (fn[i + 1:], threading.current_thread().name, int(time.time() * 100))
        if key in _seen:
            return
        with _lock:
            _seen.add(key)
            _f.write("%s %s %d\\n" % (key[0], key[1].replace(" ", "_"), key[2]))

    sys.setprofile(_prof)
    threading.setprofile(_prof)
'''


def lease_json(public_ip: str) -> str:
    return json.dumps({"PublicIP": public_ip, "BackendType": "udp"})


def read_traces(d: str) -> list[tuple[int, str, str, float]]:
    out = []
    for path in glob.glob(os.path.join(d, "trace-*.txt")):
        pid = int(path.rsplit("-", 1)[1].split(".")[0])
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:
                    out.append((pid, parts[0], parts[1], int(parts[2]) / 100))
    return out


def in_window(rows, start: float, end: float) -> set:
    return {(pid, f, th) for pid, f, th, t in rows if start <= t < end}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="c", choices=("c", "python"))
    ap.add_argument("--events", type=int, default=5)
    ap.add_argument("--window", type=float, default=0.3, help="seconds after each put (default 0.3)")
    a = ap.parse_args()
    site = tempfile.mkdtemp(prefix="fu-trace-site-")
    out = tempfile.mkdtemp(prefix="fu-trace-")
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITE)
    env = {"PYTHONPATH": os.pathsep.join(
        [site, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]),
        "FLANNEL_UDP_TRACE_DIR": out}
    marks = []
    with Overlay(0) as ov:
        h = ov.add_host(start=False)
        ov.start_daemon(h, engine=a.engine, env=env, wait=True)
        time.sleep(2.0)
        for i in range(a.events):
            t0 = time.time()
            time.sleep(a.window + 0.2)
            t1 = time.time()
            net = ipaddress.IPv4Network((int(ov.network.network_address) + ((200 + i) << 8), 24))
            ov.put(f"subnets/{net.network_address}-{net.prefixlen}", lease_json(f"172.16.9.{i + 1}"))
            time.sleep(a.window + 0.2)
            marks.append((t0, t1))
        time.sleep(0.5)
        rows = read_traces(out)
    pids = sorted({r[0] for r in rows})
    union, every = set(), None
    for t0, t1 in marks:
        quiet = in_window(rows, t0 + 0.1, t0 + 0.1 + a.window)
        event = in_window(rows, t1, t1 + a.window) - quiet
        union |= event
        every = event if every is None else every & event
    every = every or set()

    def summary(s):
        files = sorted({f for _p, f, _t in s})
        threads = sorted({(pids.index(p), t) for p, _f, t in s})
        return files, threads
    for what, s in (("in any event", union), ("in every event", every)):
        files, threads = summary(s)
        print(f"{a.engine}: {what}: {len(files)} Python files, {len(threads)} threads "
              f"in {len({p for p, _f, _t in s})} process(es)")
        print("  threads: " + ", ".join(f"p{p}:{t}" for p, t in threads))
        for f in files:
            print("   ", f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
