"""DirectRouting's kernel routes alone, both forms, in a namespace of their own (as root):

    python perf/direct_nexthops.py --peers 16000 --burst 5000          # nexthops, then plain

Each form: N routes ``10.x.y.0/24 via 172.16.a.b dev e0`` (each peer its own gateway, as
perf/scale.py's leases) put at once (host/direct_routes.py ``put_all``), our routes listed
back (``listing``), all put again over themselves (a restart's first listing: by the same process, then by one
that reads its ids back from the kernel), the last ``--burst`` removed (``remove_all``) and put back (the burst from
N - burst to N), all removed. Wall, user and system time of this process (``getrusage``: the
kernel's work on a netlink request is done in the sender's system time). Each form runs in a
fresh network namespace (``unshare`` of this process's network, one form per child).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _timed(what: str, fn, out: dict):
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    got = fn()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    out[what] = {"wall_s": round(time.monotonic() - t0, 3),
                 "user_s": round(r1.ru_utime - r0.ru_utime, 3),
                 "sys_s": round(r1.ru_stime - r0.ru_stime, 3)}
    return got


def child(n: int, burst: int, plain: bool) -> dict:
    from ipaddress import IPv4Address, IPv4Network
    from dataplane.host import direct_routes as dr, nexthops
    nexthops.FORCE_PLAIN = plain
    for cmd in (["link", "add", "e0", "type", "veth", "peer", "name", "e1"],
                ["link", "set", "e0", "up"], ["link", "set", "e1", "up"],
                ["addr", "add", "172.31.255.254/12", "dev", "e0"]):
        subprocess.run(["ip"] + cmd, check=True)
    ifindex = socket.if_nametoindex("e0")
    routes = [(IPv4Network(((10 << 24) + (i << 8), 24)), IPv4Address("172.16.0.1") + i)
              for i in range(n)]
    out: dict = {"form": "plain" if plain else "nexthops"}
    refused = _timed("put_all", lambda: dr.put_all(routes, ifindex), out)
    have = _timed("listing", dr.listing, out)[0]
    # a restart's first listing: every route put again over itself (known ids replaced)
    _timed("put_again", lambda: dr.put_all(routes, ifindex), out)
    nexthops.forget()                   # a new process: which id each route uses read back
    _timed("put_restarted", lambda: dr.put_all(routes, ifindex), out)
    back = routes[n - burst:]
    _timed("remove_burst", lambda: dr.remove_all(s for s, _ in back), out)
    _timed("put_burst", lambda: dr.put_all(back, ifindex), out)
    _timed("remove_all", lambda: dr.remove_all(s for s, _ in routes), out)
    out.update(refused=len(refused), listed=len(have))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", type=int, default=16000)
    ap.add_argument("--burst", type=int, default=5000)
    ap.add_argument("--child", choices=("nexthops", "plain"))
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.peers, a.burst, a.child == "plain")))
        return 0
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} UTC, load average "
          f"{os.getloadavg()[0]:.2f}, N={a.peers}, burst {a.burst}")
    for form in ("nexthops", "plain"):
        r = subprocess.run(["unshare", "-n", sys.executable, os.path.abspath(__file__),
                            "--peers", str(a.peers), "--burst", str(a.burst), "--child", form],
                           capture_output=True, text=True, timeout=600)
        if r.returncode:
            print(r.stderr[-2000:], file=sys.stderr)
            return 1
        out = json.loads(r.stdout.splitlines()[-1])
        print(f"{form}: " + ", ".join(
            f"{k} {v['wall_s']} s (user {v['user_s']}, sys {v['sys_s']})" if isinstance(v, dict)
            else f"{k} {v}" for k, v in out.items() if k != "form"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
