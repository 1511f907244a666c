"""The Python engine's per-packet cost, no I/O: pypath's path_tun and path_udp over one batch of
forwarded IPv4 or IPv6 packets, for this tree and an older one, in turns.

    python perf/pypath_packet.py                      # 9 turns against 5db1fcb; about 3 min
    python perf/pypath_packet.py --old f8c2acc --turns 5
    python perf/pypath_packet.py --tree DIR           # one run of DIR's dataplane/ alone

A turn runs each tree once in a child process (the old one first), so that a busy machine slows
both alike; the table gives each line's median and min..max over the turns, in ns of the child's
CPU time per packet (CPU time: the time its thread waits for a shared core is not counted). A run
is the best of --repeat passes of --rounds batches; each batch first restores its packets (a copy
per packet, the same for both trees: the ``copy`` lines are that cost alone, included in the
others). The old tree is `git archive`d into a temporary directory; no network, no root.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINES = [(name, version) for version in (4, 6) for name in ("copy", "tun", "udp")]


def packets(version: int, n: int) -> list[bytearray]:
    from dataplane.engine import ipv4, ipv6
    payload = b"x" * 44
    if version == 4:
        return [bytearray(ipv4.build("10.5.1.2", f"10.5.2.{2 + i % 200}", payload))
                for i in range(n)]
    return [bytearray(ipv6.build("fd00:5:1::2", f"fd00:5:2::{2 + i:x}", payload))
            for i in range(n)]


def measure(tree: str, n: int, rounds: int, repeat: int) -> dict:
    """{"tun 4": ns per packet, ...} for ``tree``'s dataplane/."""
    sys.path.insert(0, tree)
    from dataplane.engine import pypath
    from dataplane.engine.api import Route
    from dataplane.engine.pytable import RouteTable
    assert pypath.__file__.startswith(os.path.abspath(tree)), pypath.__file__
    pa = pypath.Path(bytes([10, 5, 1, 0]), True)
    pa.routes = RouteTable.of([Route.make("10.5.2.0/24", "192.168.77.2", 8285),
                               Route.make("fd00:5:2::/64", "192.168.77.2", 8285)])
    lens, hops = [0] * n, [None] * n
    srcs = [("192.168.77.2", 8285)] * n
    out = {}
    for version in (4, 6):
        pristine = packets(version, n)
        for j, p in enumerate(pristine):
            lens[j] = len(p)
        bufs = [bytearray(p) for p in pristine]
        for name, run in (("copy", lambda: ()),
                          ("tun", lambda: pypath.path_tun(pa, bufs, lens, n, hops)),
                          ("udp", lambda: pypath.path_udp(pa, bufs, lens, srcs, n, 1500))):
            best = float("inf")
            for _ in range(repeat):
                t0 = time.thread_time_ns()
                for _ in range(rounds):
                    for j in range(n):
                        bufs[j][:] = pristine[j]
                    for _ in run():
                        pass
                best = min(best, time.thread_time_ns() - t0)
            fwd = sum(h is not None for h in hops) if name == "tun" else n
            assert fwd == n, f"{name} IPv{version}: {fwd} of {n} forwarded"
            hops[:] = [None] * n
            out[f"{name} {version}"] = best / (rounds * n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", help="measure this checkout's dataplane/ once (JSON on stdout)")
    ap.add_argument("--old", default="5db1fcb", help="the commit to compare this tree with")
    ap.add_argument("--turns", type=int, default=9)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=500, help="batches per pass")
    ap.add_argument("--repeat", type=int, default=5, help="passes per run")
    args = ap.parse_args()
    knobs = ["--batch", str(args.batch), "--rounds", str(args.rounds), "--repeat", str(args.repeat)]
    if args.tree:
        print(json.dumps(measure(args.tree, args.batch, args.rounds, args.repeat)))
        return
    with tempfile.TemporaryDirectory(prefix="pypath-old-") as old:
        archive = subprocess.run(["git", "-C", HERE, "archive", args.old, "dataplane", "csrc"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        got: dict = {args.old: [], "this tree": []}
        for turn in range(args.turns):
            for label, tree in ((args.old, old), ("this tree", HERE)):
                child = subprocess.run([sys.executable, __file__, "--tree", tree] + knobs,
                                       check=True, capture_output=True, text=True, cwd=old)
                got[label].append(json.loads(child.stdout))
            print(f"turn {turn + 1} of {args.turns}", file=sys.stderr)
    print(f"ns of CPU per packet, median (min..max) of {args.turns} turns, batch {args.batch}")
    print(f"{'':10} {args.old:>22} {'this tree':>22}")
    for name, version in LINES:
        key = f"{name} {version}"
        cells = []
        for runs in got.values():
            v = [r[key] for r in runs]
            cells.append(f"{statistics.median(v):.0f} ({min(v):.0f}..{max(v):.0f})")
        print(f"{name + ' IPv' + str(version):10} {cells[0]:>22} {cells[1]:>22}")


if __name__ == "__main__":
    main()
