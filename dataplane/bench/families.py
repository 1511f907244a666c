"""Which bench paths carry inner IPv6, and the IPv4 path each is the twin of.

An inner-IPv6 path is its twin set up with a dual-stack config (flannel0 or flannel.1 with an
IPv6 address too, the peer's IPv6 subnet routed), with the traffic between the hosts' IPv6
addresses: the report divides each one's figures by its twin's from the same run, which is the
issue's measure (IPv6 at >= 0.9x the same engine's IPv4), and the engines' by ``vxlan6``'s.
"""
from __future__ import annotations

# inner-IPv6 path -> its IPv4 twin
IPV6_TWINS = {"c6": "c", "python6": "python", "vxlan6": "vxlan", "kernel6": "kernel"}
# the kernel's inner-IPv6 path, the engines' IPv6 reference
KERNEL6 = "vxlan6"


def family(path: str) -> int:
    """4 or 6: the inner family of a path's traffic."""
    return 6 if path in IPV6_TWINS else 4
