"""DirectRouting: which peers get a plain kernel route instead of the engine, with no I/O.

A peer goes direct when all three hold:

* the network config says ``"Backend": {"Type": "udp", "DirectRouting": true}`` (this host);
* the peer's lease says ``"DirectRouting": true``: it routes directly back to us. Without that
  (flanneld, whose udp backend ignores the option, or a host that has it off) our requests
  would leave plain and its replies come back through flannel0, and reverse-path filtering drops
  what arrives on an interface the route back does not use;
* the kernel reaches the peer's PublicIP without a gateway on our external interface (the
  ``on_link`` question, host/direct_routes.py), as flanneld's vxlan backend decides it;
* the engines forward no IPv6 part of its lease (``ipv6_routed``): direct routes are IPv4
  only so far, and a peer is reached one way for both families (its host decides the same on
  our lease, so both ends agree and reverse-path filtering sees each family come back the way
  it left).

Every other peer stays in the engine's table. :meth:`DirectRouting.apply` takes each change of
the peer watcher and returns the engine's share of it and the kernel routes to add and remove;
:meth:`DirectRouting.reconsider` answers again for every peer after the host's addresses or
routes changed.
"""
from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Callable

from .lease import Lease
from .peerset import PeerChange, PeerSnapshot

DIRECT, ENCAPSULATED = "direct", "encapsulated"


@dataclass(frozen=True)
class Split:
    """One peer change, divided: ``engine`` is what the engine's table gets (its snapshot
    holds the encapsulated peers only); ``route`` the leases to route directly (new or whose
    PublicIP changed), ``unroute`` those whose direct route goes."""
    engine: PeerChange
    route: tuple = ()
    unroute: tuple = ()


class DirectRouting:
    def __init__(self, enabled: bool, on_link: Callable[[IPv4Address], bool],
                 ipv6_routed: Callable[[Lease], bool] = lambda _lease: False):
        self.enabled = enabled
        self.on_link = on_link
        self.ipv6_routed = ipv6_routed
        self.direct: dict[IPv4Network, Lease] = {}

    def why_not(self, lease: Lease) -> str | None:
        """Why ``lease`` is encapsulated (None: it goes direct)."""
        if not self.enabled:
            return "DirectRouting is off in the network config"
        if not lease.attrs.direct_routing:
            return "the peer does not route directly (no DirectRouting in its lease: flanneld, " \
                   "or a flannel-udp without it)"
        if self.ipv6_routed(lease):
            return ("the engines forward its IPv6 part (direct routes are IPv4 only so far), so "
                    "both families go through flannel0")
        if not self.on_link(lease.public_ip):
            return f"its PublicIP {lease.public_ip} is reached through a gateway, not on this " \
                   "host's link"
        return None

    def mode(self, subnet: IPv4Network) -> str:
        return DIRECT if subnet in self.direct else ENCAPSULATED

    def apply(self, change: PeerChange, engine_before: PeerSnapshot) -> Split:
        """``change`` as the watcher reported it; ``engine_before``: the engine's snapshot the
        last split gave (what its table holds now)."""
        if not self.enabled:
            return Split(change)
        route, unroute = [], []
        for lease in change.removed:
            old = self.direct.pop(lease.subnet, None)
            if old is not None:
                unroute.append(old)
        for lease in change.added:
            if self.why_not(lease) is None:
                self.direct[lease.subnet] = lease
                route.append(lease)
            else:
                old = self.direct.pop(lease.subnet, None)
                if old is not None:
                    unroute.append(old)
        return self._split(change, route, unroute, engine_before)

    def reconsider(self, snapshot: PeerSnapshot, engine_before: PeerSnapshot) -> Split:
        """Every peer of ``snapshot`` decided again; the split of those whose way changed."""
        if not self.enabled:
            return Split(PeerChange(engine_before))
        flipped = tuple(lease for subnet, lease in sorted(snapshot.peers.items())
                        if (self.why_not(lease) is None) != (subnet in self.direct))
        return self.apply(PeerChange(snapshot, added=flipped), engine_before)

    def _split(self, change, route, unroute, engine_before) -> Split:
        snapshot = change.snapshot
        engine = PeerSnapshot.of(snapshot.peers, snapshot.own, skip=self.direct)
        removed = [lease for lease in change.removed if lease.subnet in engine_before.peers]
        removed += [lease for lease in route if lease.subnet in engine_before.peers]
        added = [lease for lease in change.added if lease.subnet not in self.direct]
        order = lambda lease: (int(lease.subnet.network_address), lease.subnet.prefixlen)
        return Split(PeerChange(engine, tuple(sorted(added, key=order)),
                                tuple(sorted(removed, key=order))),
                     tuple(route), tuple(unroute))
