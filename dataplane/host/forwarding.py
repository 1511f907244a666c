"""Whether this host forwards packets between its interfaces, one family at a time.

Pods' packets cross the host twice: from the pod's veth (the bridge) into flannel0, and from
flannel0 out to the pod. Both are forwarding, which the kernel does only with
``net.ipv4.ip_forward`` (IPv4) and ``net.ipv6.conf.all.forwarding`` (IPv6) on; with either off
the kernel drops that family's pod packets without an ICMP error and without a log line. A stock
Debian host has both off; the CNI ``bridge`` plugin switches them on when it makes a pod's
gateway, a workload runtime of its own may not. The daemon reads them and never writes them: they
are the host's, and switching IPv6 forwarding on changes how the host takes router
advertisements (:func:`fix`). Nothing here logs; daemon/host_forwarding.py says it.
"""
from __future__ import annotations

import os
import socket

PROC_SYS = "/proc/sys"
SYSCTL = {4: "net.ipv4.ip_forward", 6: "net.ipv6.conf.all.forwarding"}
RTPROT_RA = 9               # <linux/rtnetlink.h>: a route learned from a router advertisement
IFA_F_PERMANENT = 0x80      # <linux/if_addr.h>: an address without lifetimes (not SLAAC's)


def _read(key: str, root: str = PROC_SYS) -> int | None:
    try:
        with open(os.path.join(root, key.replace(".", "/"))) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def enabled(version: int, root: str = PROC_SYS) -> bool | None:
    """Whether the kernel forwards the family's packets (None: not known, the key unreadable)."""
    value = _read(SYSCTL[version], root)
    return None if value is None else value != 0


def accept_ra(iface: str, root: str = PROC_SYS) -> int | None:
    """The interface's ``accept_ra`` (0, 1 or 2), None when it cannot be read."""
    return _read(f"net.ipv6.conf.{iface}.accept_ra", root)


def ra_interfaces(root: str = PROC_SYS) -> list[str]:
    """The interfaces that would lose what router advertisements gave them once IPv6 forwarding
    is on: ``accept_ra`` 1, and a route learned from an advertisement (``proto ra``) or a global
    address with lifetimes (SLAAC's) on them now. Empty when netlink cannot be asked."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError
    found = set()
    try:
        with IPRoute() as ipr:
            names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
            for route in ipr.get_routes(family=socket.AF_INET6):
                if route["proto"] == RTPROT_RA:
                    found.add(names.get(route.get_attr("RTA_OIF")))
            for addr in ipr.get_addr(family=socket.AF_INET6):
                flags = addr.get_attr("IFA_FLAGS") or addr["flags"]
                if addr["scope"] == 0 and not flags & IFA_F_PERMANENT:
                    found.add(names.get(addr["index"]))
    except (OSError, NetlinkError):
        return []
    return sorted(n for n in found if n and accept_ra(n, root) == 1)


def fix(version: int, ra_ifaces=()) -> str:
    """The commands that switch the family's forwarding on, as an operator runs them. For IPv6,
    ``accept_ra=2`` first on each interface of ``ra_ifaces`` (:func:`ra_interfaces`): with
    forwarding on the kernel ignores advertisements where ``accept_ra`` is 1, and the host loses
    the address and default route it took from them when they expire."""
    key = SYSCTL[version]
    if version == 4:
        return f"sysctl -w {key}=1"
    if not ra_ifaces:
        return (f"sysctl -w {key}=1 (where an interface takes its IPv6 address or default route "
                "from router advertisements, set its accept_ra=2 first)")
    names = ", ".join(ra_ifaces)
    first = "; ".join(f"sysctl -w net.ipv6.conf.{n}.accept_ra=2" for n in ra_ifaces)
    return (f"{first} first (this host takes IPv6 addresses or routes from router advertisements "
            f"on {names}: with forwarding on the kernel ignores them where accept_ra is 1, and "
            f"what they gave is gone when it expires), then sysctl -w {key}=1")
