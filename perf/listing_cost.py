"""A start's listing at N leases, in one process: its parse and the pick of a free subnet.

    python perf/listing_cost.py --peers 16000 --runs 9        # CPU time of each, best / median
    OTHER/.venv/bin/python perf/listing_cost.py --tree OTHER  # another checkout, in turns

The leases are perf/lease_burst.py's (each its own PublicIP, the udp backend's value, as etcd
hands them: protobuf KeyValues), parsed as the registry's listing parses them
(control/lease.py leases_of_kvs); then the walk for free subnets a new lease picks from
(control/allocate.py pick_pair). The collector off, as the daemon's start has it.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time

_TREE = (sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv
         else os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.abspath(_TREE))

from pyetcd.etcdrpc import kv_pb2  # noqa: E402

from dataplane.control.allocate import pick_pair  # noqa: E402
from dataplane.control.config import parse_config  # noqa: E402
from dataplane.control.lease import LeaseAttrs, leases_of_kvs  # noqa: E402
from dataplane.control.registry import Registry  # noqa: E402
from perf.lease_burst import CONFIG, PRELOAD_BASE, leases  # noqa: E402

PREFIX = "/coreos.com/network/subnets/"


def listing(n: int) -> list:
    return [kv_pb2.KeyValue(key=f"{PREFIX}{subnet.network_address}-{subnet.prefixlen}".encode(),
                            value=LeaseAttrs.from_json(
                                b'{"PublicIP":"%s","PublicIPv6":null}' % ip.encode()).to_json(),
                            lease=1000 + i, mod_revision=2 + i, create_revision=2 + i)
            for i, (subnet, ip) in enumerate(leases(PRELOAD_BASE, 0, n).items())]


def cpu_ms(fn, runs: int) -> str:
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append((time.process_time() - t0) * 1000)
    return f"{min(times):.1f} / {statistics.median(times):.1f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", type=int, default=16000)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--tree")
    args = ap.parse_args()
    kvs = listing(args.peers)
    reg = Registry.__new__(Registry)
    reg.subnets_prefix = PREFIX

    def parse():
        return leases_of_kvs(kvs, lambda kv: reg._lease(kv, False, quiet=True))

    config = parse_config(json.dumps(CONFIG))     # the scene's: its range past the leases
    listed = parse()
    rng = random.Random(1)
    gc.disable()
    # flannel's largest default network, its range filled from the start by the leases (a
    # network grown to 16,000 hosts: each new one picks among the first free subnets)
    largest = parse_config(json.dumps({"Network": "10.0.0.0/10", "SubnetLen": 24,
                                       "SubnetMin": "10.1.0.0"}))
    pick = cpu_ms(lambda: pick_pair(config, listed, (), rng), args.runs)
    pick_in = cpu_ms(lambda: pick_pair(largest, listed, (), rng), args.runs)
    print(f"{args.peers} leases, best / median of {args.runs} (CPU ms): the listing's parse "
          f"{cpu_ms(parse, args.runs)}, the pick {pick} (a /10's: {pick_in}), "
          f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
