"""Whether this host forwards packets between its interfaces, one family at a time.

Pods' packets cross the host twice: from the pod's veth (the bridge) into flannel0, and from
flannel0 out to the pod. Both are forwarding, which the kernel does only with
``net.ipv4.ip_forward`` (IPv4) and ``net.ipv6.conf.all.forwarding`` (IPv6) on; with either off
the kernel drops that family's pod packets without an ICMP error and without a log line. A stock
Debian host has both off; the CNI ``bridge`` plugin switches them on when it makes a pod's
gateway, a workload runtime of its own may not. The daemon reads them and never writes them: they
are the host's, and switching IPv6 forwarding on changes how the host takes router advertisements
(:func:`fix`). Nothing here logs; daemon/host_forwarding.py says it.
"""
from __future__ import annotations

import os

PROC_SYS = "/proc/sys"
SYSCTL = {4: "net.ipv4.ip_forward", 6: "net.ipv6.conf.all.forwarding"}


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


def fix(version: int, iface: str | None = None, root: str = PROC_SYS) -> str:
    """The commands that switch the family's forwarding on, as an operator runs them. For IPv6 on
    an interface that takes router advertisements (``accept_ra`` 1, the default) ``accept_ra=2``
    comes first: with forwarding on the kernel ignores advertisements on such an interface, and the
    host loses the address and default route it configured from them when they expire."""
    key = SYSCTL[version]
    ra = accept_ra(iface, root) if (version == 6 and iface) else None
    if version == 6 and (ra == 1 or iface is None):
        name = iface or "<interface>"
        return (f"sysctl -w net.ipv6.conf.{name}.accept_ra=2 first if this host takes its IPv6 "
                f"address or default route from router advertisements on {name} (with "
                f"forwarding on the kernel ignores them where accept_ra is 1), then "
                f"sysctl -w {key}=1")
    return f"sysctl -w {key}=1"
