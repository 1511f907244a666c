"""How long publishing a route table takes, no root needed: the median over
several runs, for N distinct /24 routes, of

* ``engine.set_routes(routes)``: a whole table (the daemon's first table, and
  the table a new engine gets after a lease move);
* ``engine.set_table(table.updated(removed, added))``: one peer replaced, what
  the daemon does for a batch of lease events (control/routes.py).

    python perf/route_publish.py [--engine c|python|both] [-n 10000] [--runs 15]

The engine is never started (set_routes works on a stopped loop), so the
figure is the table build alone: validation, packing and the swap.
"""
from __future__ import annotations

import argparse
import socket
import timeit

import numpy as np

from dataplane.engine import Route, c_available, create_engine


def routes(n: int) -> list[Route]:
    """n distinct /24s counted up from 10.0.0.0/24, each behind its own
    peer as in flannel (one subnet per host); loopback peers, never sent to."""
    return [Route.make((0x0A000000 + (i << 8), 24), 0x7F000002 + i, 8285) for i in range(n)]


def measure(kind: str, table: list[Route], runs: int) -> tuple[list[float], list[float]]:
    tun, tun_engine = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    engine = create_engine(kind, tun_fd=tun_engine.fileno(), udp_fd=udp.fileno(),
                           tun_addr="10.255.1.0", mtu=1472)
    try:
        engine.set_routes(table)        # warm-up: first allocation, imports
        whole = timeit.repeat(lambda: engine.set_routes(table), number=1, repeat=runs)
        kept = engine.table_type.of(table)
        kept = kept.updated((), ())     # the daemon's table is always a derived one
        one = Route.make((0x0AFF0000, 24), 0x7F000001, 8285)

        def change():
            engine.set_table(kept.updated([table[0].subnet], [one]))
        return whole, timeit.repeat(change, number=1, repeat=runs)
    finally:
        engine.close()
        for s in (tun, tun_engine, udp):
            s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="both", choices=("c", "python", "both"))
    ap.add_argument("-n", type=int, default=10000, help="routes in the table")
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    kinds = ("c", "python") if a.engine == "both" else (a.engine,)
    table = routes(a.n)
    for kind in kinds:
        if kind == "c" and not c_available():
            print("c: engine not built, skipped")
            continue
        whole, change = (np.array(t) * 1e3 for t in measure(kind, table, a.runs))
        for what, t in ((f"set_routes({a.n} routes)", whole), ("one peer changed", change)):
            print(f"{kind}: {what} median {np.median(t):.2f} ms "
                  f"[min {t.min():.2f}, max {t.max():.2f}] over {a.runs} runs")


if __name__ == "__main__":
    main()
