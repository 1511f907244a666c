"""The peers' first table at N leases, in one process: what a fresh start does after subnet.env.

    python perf/peer_table_cost.py --peers 16000 --runs 7          # CPU time of each part, best of
    python perf/peer_table_cost.py --peers 16000 --profile          # cProfile of one build
    OTHER/.venv/bin/python perf/peer_table_cost.py --tree OTHER     # another checkout, in turns

The leases are perf/lease_burst.py's (each its own PublicIP), parsed as the registry's listing
parses them; then the watcher's first report (control/peers.py: the claims, the PublicIP index,
the snapshot and its difference) and the daemon's table of it (daemon/peer_routes.py: the
routes, the engine's table) for the C engine (``--engine py``: the Python engine's table),
with the collector off, as the daemon's start has it.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

_TREE = (sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv
         else os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.abspath(_TREE))
# not perf/ itself: its profile.py would shadow the standard library's, which cProfile imports
sys.path = [p for p in sys.path if os.path.abspath(p) != os.path.dirname(os.path.abspath(__file__))]

from dataplane.control.lease import leases_of_kvs  # noqa: E402
from dataplane.control.peers import PeerWatcher  # noqa: E402
from dataplane.control.registry import Registry  # noqa: E402
from dataplane.control.routes import route_table  # noqa: E402
from dataplane.daemon.peer_routes import _engine  # noqa: E402
from dataplane.host.family import V4, V6  # noqa: E402
from perf.lease_burst import PRELOAD_BASE, leases  # noqa: E402

PREFIX = "/coreos.com/network/subnets/"


class _KV:
    __slots__ = ("key", "value", "lease", "mod_revision", "create_revision")

    def __init__(self, key, value, rev):
        self.key, self.value, self.lease = key, value, 0
        self.mod_revision = self.create_revision = rev


class _Registry:
    """What the watcher reads of a registry for a listing handed to it."""
    subnets_prefix = PREFIX

    def add_note(self, note):
        pass


def listing(n: int):
    kvs = [_KV(f"{PREFIX}{subnet.network_address}-{subnet.prefixlen}".encode(),
               b'{"PublicIP":"%s","BackendType":"udp"}' % ip.encode(), 2 + i // 100)
           for i, (subnet, ip) in enumerate(leases(PRELOAD_BASE, 0, n).items())]
    reg = Registry.__new__(Registry)
    reg.subnets_prefix = PREFIX
    out = leases_of_kvs(kvs, lambda kv: reg._lease(kv, False, quiet=True))
    return out, [], 2 + n // 100


def first_table(listed, table_type):
    """The watcher's first report, and the engine's table of it; the CPU time of each."""
    reports = []
    t0 = time.process_time()
    w = PeerWatcher(_Registry(), None, reports.append, listing=listed)
    w._snapshot()
    t1 = time.process_time()
    snap = reports[0].snapshot
    peers = {4: snap, 6: snap}
    table = table_type.of(_engine(sum((route_table(peers[f.version], 8285, None, f)
                                      for f in (V4, V6)), ())))
    t2 = time.process_time()
    return t1 - t0, t2 - t1, table


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", type=int, default=16000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--engine", choices=("c", "py"), default="c")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--tree")
    a = ap.parse_args()
    if a.engine == "c":
        from dataplane.engine.route_array import RouteArray as table_type
    else:
        from dataplane.engine.pytable import RouteTable as table_type
    listed = listing(a.peers)
    gc.disable()        # as the daemon's start has it (daemon/interpreter.py)
    if a.profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.runcall(first_table, listed, table_type)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return 0
    watch, table = [], []
    for _ in range(a.runs):
        w, t, _ = first_table(listed, table_type)
        watch.append(w)
        table.append(t)
    def ms(times):
        return f"{min(times) * 1e3:.0f} / {sorted(times)[len(times) // 2] * 1e3:.0f}"
    print(f"{a.peers} leases, {a.engine} engine, best / median of {a.runs} (CPU ms): "
          f"watcher's first report {ms(watch)}, the engine's table {ms(table)}, "
          f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
