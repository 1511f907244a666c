"""A narrower link on the underlay's path, and the kernel counters that show what crossed it.

The testbed's router (router.py, made by ``add_host(behind_router=True)``) forwards between the hosts'
link and its own; :func:`narrow_router_link` gives its own side a smaller MTU, so that it
answers a longer packet towards the hosts behind it as a router before a narrower link does:
ICMP fragmentation needed for an IPv4 packet with DF, ICMPv6 packet too big for any IPv6 one.
The hosts keep their interfaces' MTU, so only the path MTU tells them. :func:`frag_creates` reads
the fragments a host's kernel made of its own packets, the counters a path MTU that nobody heeds
moves.
"""
from __future__ import annotations

from . import netns as ns
from .hosts import Host, Testbed


def narrow_router_link(tb: Testbed, mtu: int) -> None:
    """The router's side of the link behind it (its bridge) at ``mtu``; the hosts' veths on
    that link keep theirs, so what they send back is not cut."""
    router = tb.make_router()
    ns.run_ip(["link", "set", router.bridge, "mtu", str(int(mtu))], netns=router.netns)


def frag_creates(host: Host) -> tuple[int, int]:
    """(IPv4's FragCreates, IPv6's Ip6FragCreates) of ``host``'s namespace: the fragments its
    kernel cut from packets it sent."""
    lines = host.exec(["cat", "/proc/net/snmp", "/proc/net/snmp6"],
                      check=True).stdout.splitlines()
    names, values = [line.split() for line in lines if line.startswith("Ip:")][:2]
    v6 = next(line.split()[1] for line in lines if line.startswith("Ip6FragCreates "))
    return int(values[names.index("FragCreates")]), int(v6)
