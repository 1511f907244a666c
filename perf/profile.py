"""Profile one bench path under one load, to see where the CPU goes.

    python perf/profile.py --path c --tcp --seconds 8 --perf /tmp/c-tcp.data
    python perf/profile.py --path c --size 64 --rate 0 --perf /tmp/c-64.data
    python perf/profile.py --path c6 --tcp --family 4     # IPv4 through c6's forwarders
    perf report -i /tmp/c-tcp.data --no-children --sort cpu,comm,sym -g none

Sets up the bench's two-host testbed and the path (perf/README.md: The
testbed), runs one TCP stream (iperf3) or one UDP stream (udpgen, `--rate`
pps, 0 = flood) of the path's inner family (`--family`), and meanwhile, with
`--perf FILE`, `perf record -a -g` for the middle of the load (both cores:
host A is CPU0, host B CPU1). Prints
the throughput and the forwarders' counters that moved. As root; every load
is bounded by --seconds, and the testbed is removed on exit.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataplane.bench import build, measure  # noqa: E402
from dataplane.bench.families import IPV6_TWINS  # noqa: E402
from dataplane.bench.path_choice import make_path  # noqa: E402
from dataplane.bench.paths import ALL_PATHS  # noqa: E402
from dataplane.bench.topo import BenchTopo  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", default="c", help=f"a bench path ({', '.join(ALL_PATHS)})")
    ap.add_argument("--tcp", action="store_true", help="one TCP stream instead of UDP")
    ap.add_argument("--size", type=int, default=64, help="UDP payload bytes (default 64)")
    ap.add_argument("--rate", type=float, default=0, help="UDP packets/s, 0 = flood (default)")
    ap.add_argument("--seconds", type=float, default=6, help="length of the load (2-60, default 6)")
    ap.add_argument("--batch", type=int, default=None, help="engine batch size")
    ap.add_argument("--family", type=int, choices=(4, 6), default=None,
                    help="inner family of the traffic (default: the path's; 4 on an IPv6 path "
                         "such as c6 sends IPv4 through its dual-stack forwarders)")
    ap.add_argument("--forwarders-together", action="store_true",
                    help="both forwarders on host B's core, as bench --forwarders-together")
    ap.add_argument("--perf", metavar="FILE", help="perf record -a -g into FILE during the load")
    a = ap.parse_args()
    if not 2 <= a.seconds <= 60:
        ap.error("--seconds must be between 2 and 60")
    tools = measure.Tools(**build.setup())
    with BenchTopo(ipv6=a.path in IPV6_TWINS,
                   forwarders_together=a.forwarders_together) as topo:
        path = make_path(topo, a.path, batch=a.batch)
        family = a.family or path.family
        if family == 6 and path.family != 6:
            ap.error(f"--family 6 needs an inner-IPv6 path ({', '.join(IPV6_TWINS)})")
        path.setup()
        try:
            before = path.counters()
            drops0 = measure.drop_counters(topo)
            rec = None
            if a.perf:
                # The middle of the load: skip the ramp-up and the end.
                rec = subprocess.Popen(
                    ["bash", "-c", f"sleep 1; exec perf record -a -g -o {a.perf} -- "
                                   f"sleep {a.seconds - 2:g}"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if a.tcp:
                r = measure.tcp(topo, tools, seconds=a.seconds, family=family)
                print(f"{a.path}: TCP over IPv{family} {r['gbps']:.2f} Gbit/s, "
                      f"{r['retransmits']} retransmits")
            else:
                r = measure.udp_trial(topo, tools, size=a.size, rate=a.rate, duration=a.seconds,
                                      family=family)
                print(f"{a.path}: IPv{family} {a.size} B offered {r['tx_pps'] / 1e3:.1f} kpps, received "
                      f"{r['rx_pps'] / 1e3:.1f} kpps, loss {100 * r['loss']:.2f} %")
            if rec is not None:
                rec.wait(timeout=a.seconds + 30)
                print(f"perf data: {a.perf}")
            after = path.counters(after=time.time())
            print("kernel drops:", measure.drop_delta(drops0, measure.drop_counters(topo)))
            for side, d in after.items():
                moved = {k: v - before.get(side, {}).get(k, 0) for k, v in d.items()
                         if isinstance(v, int) and v != before.get(side, {}).get(k, 0)}
                print(side, moved)
        finally:
            path.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
