"""The route table: peer leases -> routes, with no I/O.

Every peer's subnet goes as UDP to its PublicIP on the network config's backend port, flanneld's
udp backend's one port for every node; so does the IPv6 part of a dual-stack peer's lease, over
the same IPv4 underlay, when :class:`Ipv6Parts` says it is a route. ``route_table`` is the whole
table of a snapshot; ``route_changes`` is what one peer change does to it, which the daemon
applies to the table it keeps (``table.updated(removed, added)``, engine/route_array.py and
engine/pytable.py) and hands to the engine in one swap: a change costs its own size, not the peer
set's.
"""
from __future__ import annotations

import logging
from ipaddress import IPv6Network
from typing import Callable, Optional

from ..engine.api import Route
from .lease import Lease
from .peerset import PeerChange, PeerSnapshot

log = logging.getLogger(__name__)

# lease -> the IPv6 part that is a route, or None (an Ipv6Parts)
V6Part = Callable[[Lease], Optional[IPv6Network]]


class Ipv6Parts:
    """Which peers' IPv6 parts are routes, on a network config with ``network6`` (its
    IPv6Network; None: IPv6 is off here and no part is a route).

    A part is a route when the lease's value says ``ForwardsIPv6`` (control/lease.py: flanneld's
    udp backend takes dual-stack keys but routes no IPv6, so what went to it would vanish) and
    the part lies in ``network6`` (anything else could only shadow or steal others' traffic) and
    is not this host's own (``own6``). A part that is no route costs that part only: the
    peer's IPv4 subnet is routed as ever. Each such part is said once (per subnet and reason)."""

    def __init__(self, network6: Optional[IPv6Network], own6: Optional[IPv6Network] = None):
        self.network6 = network6
        self.own6 = own6
        self._said: dict = {}           # IPv4 subnet -> (IPv6 part, why) logged last

    def __call__(self, lease: Lease) -> Optional[IPv6Network]:
        part = lease.ipv6_subnet
        if part is None or self.network6 is None:
            return None
        why = self.why_not(lease)
        if why is None:
            return part
        said = (part, why)
        if self._said.get(lease.subnet) != said:
            self._said[lease.subnet] = said
            level = logging.INFO if not lease.attrs.forwards_ipv6 else logging.WARNING
            log.log(level, "Subnet %s (PublicIP %s): its IPv6 part %s gets no route: %s",
                    lease.subnet, lease.public_ip, part, why)
        return None

    def why_not(self, lease: Lease) -> Optional[str]:
        """Why the IPv6 part of ``lease`` is no route, or None when it is one."""
        part, net = lease.ipv6_subnet, self.network6
        if part is None or net is None:
            return "no IPv6 part" if part is None else "IPv6 is off in the network config"
        if not lease.attrs.forwards_ipv6:
            return ("the lease does not say ForwardsIPv6: its host forwards no IPv6 (flanneld's "
                    "udp backend, or a flannel-udp without EnableIPv6)")
        if part.prefixlen < net.prefixlen or not part.subnet_of(net):
            return f"it lies outside the IPv6Network {net}"
        if self.own6 is not None and part.overlaps(self.own6):
            return f"it overlaps this host's own IPv6 part {self.own6}"
        return None


def route_table(snapshot: PeerSnapshot, port: int, v6: Optional[V6Part] = None) -> tuple[Route, ...]:
    """One route per peer in ``snapshot``, sorted by subnet, then one per peer's IPv6 part that
    ``v6`` makes a route; our own subnet is not a peer."""
    peers = sorted(snapshot.peers.items())
    routes = [Route.make(subnet, lease.public_ip, port) for subnet, lease in peers]
    if v6 is not None:
        for _, lease in peers:
            part = v6(lease)
            if part is not None:
                routes.append(Route(part, lease.public_ip, port))
    return tuple(routes)


def route_changes(change: PeerChange, port: int, v6: Optional[V6Part] = None,
                  before: Optional[PeerSnapshot] = None) -> tuple[tuple, tuple[Route, ...]]:
    """``(removed subnets, added routes)``: applied to the table of ``before`` (the snapshot
    preceding ``change``), they give ``route_table(change.snapshot, port, v6)``; a peer whose
    PublicIP or IPv6 part changed is added again, and its old IPv6 part removed."""
    removed = [lease.subnet for lease in change.removed]
    added = [Route(lease.subnet, lease.public_ip, port) for lease in change.added]
    if v6 is not None:
        # A part that was no route is removed all the same: the table ignores it.
        removed += [lease.ipv6_subnet for lease in change.removed if lease.ipv6_subnet is not None]
        old_peers = before.peers if before is not None else {}
        for lease in change.added:
            part = v6(lease)
            old = old_peers.get(lease.subnet)
            if old is not None and old.ipv6_subnet is not None and old.ipv6_subnet != part:
                removed.append(old.ipv6_subnet)
            if part is not None:
                added.append(Route(part, lease.public_ip, port))
    return tuple(removed), tuple(added)
