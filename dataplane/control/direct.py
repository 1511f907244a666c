"""DirectRouting: which peers get a plain kernel route instead of the engine, with no I/O; each
family decided on its own.

A peer's IPv4 subnet goes direct when all three hold:

* the network config says ``"Backend": {"Type": "udp", "DirectRouting": true}`` (this host);
* the peer's lease says ``"DirectRouting": true``: it routes directly back to us. Without that
  (flanneld, whose udp backend ignores the option, or a host that has it off) our requests
  would leave plain and its replies come back through flannel0, and reverse-path filtering drops
  what arrives on an interface the route back does not use;
* the kernel reaches the peer's PublicIP without a gateway on our external interface (the
  ``on_link`` question, host/direct_routes.py), as flanneld's vxlan backend decides it.

Its IPv6 part (a dual-stack lease) goes direct, ``via <PublicIPv6> dev <external interface>``,
when the first two hold, the part is one the engines would route (``ipv6_part``: the lease says
ForwardsIPv6, the part lies in IPv6Network and is not ours; control/routes.py Ipv6Parts), and the
lease's PublicIPv6 is on our link the same way (a connected IPv6 prefix of the external
interface covers it). flanneld's vxlan and host-gw backends decide the two families apart the
same way, IPv6 on PublicIPv6 alone. A peer without a PublicIPv6 (or with one behind a gateway)
keeps its IPv6 part in the engine, over the IPv4 underlay, whatever its IPv4 subnet does.

The engine's table gets every IPv4 subnet that is not direct; its IPv6 parts do not depend on
DirectRouting at all (daemon/peer_routes.py derives them from the whole change): a direct route
is more specific than IPv6Network's route to flannel0, so the kernel sends nothing of a direct
part to the engine, and a peer that sends its IPv6 to us encapsulated all the same (it does not
see a PublicIPv6 of ours on its link) is still a peer the engine receives from.

:meth:`DirectRouting.apply` takes each change of the peer watcher and returns the engine's (IPv4)
share of it and the kernel routes to add and remove for both families. Each family is a value
(host/family.py): ``direct[family]`` the leases routed directly, ``why_not(lease, family)``,
``mode(subnet, family)``, ``Split.route[family]``; ``dst``/``via`` say what a family's direct
route goes to and through;
:meth:`DirectRouting.reconsider` answers again for every peer after the host's addresses or
routes changed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address
from types import MappingProxyType
from typing import Callable, Mapping, Optional, Union

from ..host.family import FAMILIES, V4, Family
from .lease import Lease
from .peerset import PeerChange, PeerSnapshot

DIRECT, ENCAPSULATED = "direct", "encapsulated"


def _none() -> Mapping:
    return MappingProxyType({family: () for family in FAMILIES})


@dataclass(frozen=True)
class Split:
    """One peer change, divided: ``engine`` is what the engine's table gets of the IPv4
    subnets (its snapshot holds the encapsulated peers only); ``route[family]`` the leases
    whose subnet of that family (the IPv4 subnet, the IPv6 part) to route directly (new or
    whose address changed), ``unroute[family]`` those whose direct route goes (an unrouted
    lease is the one whose part had the route: a part that changed is unrouted, then
    routed)."""
    engine: PeerChange
    route: Mapping[Family, tuple] = field(default_factory=_none)
    unroute: Mapping[Family, tuple] = field(default_factory=_none)
    source: Optional[PeerChange] = None     # the change it divides (DirectRouting.refused)


def dst(lease: Lease, family: Family):
    """The subnet of ``lease`` that a direct route of ``family`` goes to."""
    return lease.subnet if family is V4 else lease.ipv6_subnet


def via(lease: Lease, family: Family):
    """The peer's address that a direct route of ``family`` goes through."""
    return lease.public_ip if family is V4 else lease.attrs.public_ipv6


def _no_ipv6(_lease: Lease) -> Optional[str]:
    return "IPv6 is off in the network config"


class DirectRouting:
    def __init__(self, enabled: bool,
                 on_link: Callable[[Union[IPv4Address, IPv6Address]], bool],
                 ipv6_part: Callable[[Lease], Optional[str]] = _no_ipv6,
                 on_link_all: Optional[Callable[[list], set]] = None):
        """``on_link``: the kernel's answer for an address of either family; ``ipv6_part``:
        why a lease's IPv6 part is no route of the engines (None: it is one);
        ``on_link_all``: the same answer for many addresses at once (those on the link), asked
        once per change for the peers that route directly (a listing of thousands)."""
        self.enabled = enabled
        self.on_link = on_link
        self.on_link_all = on_link_all
        self._known: dict = {}         # address -> on_link's answer, during one change
        self.ipv6_part = ipv6_part
        # per family: IPv4 subnet -> the lease whose subnet of that family is routed directly
        self.direct: dict[Family, dict[IPv4Network, Lease]] = {family: {} for family in FAMILIES}

    def _why_not_peer(self, lease: Lease) -> Optional[str]:
        if not self.enabled:
            return "DirectRouting is off in the network config"
        if not lease.attrs.direct_routing:
            return "the peer does not route directly (no DirectRouting in its lease: flanneld, " \
                   "or a flannel-udp without it)"
        return None

    def why_not(self, lease: Lease, family: Family = V4) -> Optional[str]:
        """Why the subnet of ``family`` of ``lease`` (its IPv4 subnet, its IPv6 part) is not
        routed directly (None: it is)."""
        why = self._why_not_peer(lease)
        if family is V4:
            if why is None and not self._on_link(lease.public_ip):
                why = f"its PublicIP {lease.public_ip} is reached through a gateway, not on " \
                      "this host's link"
            return why
        why = why or self.ipv6_part(lease)
        if why is not None:
            return why
        pub6 = lease.attrs.public_ipv6
        if pub6 is None:
            return "its lease has no PublicIPv6"
        if not self._on_link(pub6):
            return f"its PublicIPv6 {pub6} is reached through a gateway, not on this host's link"
        return None

    def mode(self, subnet: IPv4Network, family: Family = V4) -> str:
        """The way of the subnet of ``family`` of the lease of ``subnet`` (its IPv4 subnet)."""
        return DIRECT if subnet in self.direct[family] else ENCAPSULATED

    def _on_link(self, ip) -> bool:
        known = self._known.get(ip)
        return self.on_link(ip) if known is None else known

    def _ask(self, leases) -> None:
        """on_link_all's answers for the addresses of ``leases`` that route directly."""
        if self.on_link_all is None:
            return
        ips = [ip for lease in leases if self._why_not_peer(lease) is None
               for ip in (lease.public_ip, lease.attrs.public_ipv6) if ip is not None]
        if len(ips) > 1:
            on = self.on_link_all(ips)
            self._known = {ip: ip in on for ip in ips}

    def apply(self, change: PeerChange, engine_before: PeerSnapshot) -> Split:
        """``change`` as the watcher reported it; ``engine_before``: the engine's snapshot the
        last split gave (what its table holds now)."""
        if not self.enabled:
            return Split(change)
        try:
            self._ask(change.added)
            moves = [way.follow(change.removed, change.added) for way in self._ways()]
        finally:
            self._known = {}
        return self._split(change, engine_before, moves)

    def reconsider(self, snapshot: PeerSnapshot, engine_before: PeerSnapshot) -> Split:
        """Every peer of ``snapshot`` decided again; the split of those whose way changed, each
        family on its own (a peer whose IPv6 part alone flipped leaves its IPv4 route be)."""
        if not self.enabled:
            return Split(PeerChange(engine_before))
        peers = sorted(snapshot.peers.items(), key=lambda item: (int(item[0].network_address),
                                                                  item[0].prefixlen))
        ways = self._ways()
        try:
            self._ask(lease for _, lease in peers)
            flips = [tuple(lease for subnet, lease in peers
                           if (way.why_not(lease) is None) != (subnet in way.table))
                     for way in ways]
        finally:
            self._known = {}
        moves = [way.follow((), flipped) for way, flipped in zip(ways, flips)]
        # the engine's share is of the IPv4 subnets: its change is their flips alone
        return self._split(PeerChange(snapshot, added=flips[0]), engine_before, moves)

    def _ways(self) -> tuple["_Way", ...]:
        """Each family's way of deciding, IPv4 first (FAMILIES' order)."""
        return tuple(_Way(family, self.direct[family],
                          lambda lease, family=family: self.why_not(lease, family))
                     for family in FAMILIES)

    def _split(self, change: PeerChange, engine_before: PeerSnapshot, moves: list) -> Split:
        """``moves``: per family, IPv4 first, the leases to route directly and those whose
        route goes (:meth:`_Way.follow`)."""
        route = MappingProxyType({f: tuple(r) for f, (r, _) in zip(FAMILIES, moves)})
        unroute = MappingProxyType({f: tuple(u) for f, (_, u) in zip(FAMILIES, moves)})
        snapshot, direct = change.snapshot, self.direct[V4]
        engine = PeerSnapshot.of(snapshot.peers, snapshot.own, skip=direct)
        removed = [lease for lease in change.removed if lease.subnet in engine_before.peers]
        removed += [lease for lease in route[V4] if lease.subnet in engine_before.peers]
        added = [lease for lease in change.added if lease.subnet not in direct]
        order = lambda lease: (int(lease.subnet.network_address), lease.subnet.prefixlen)
        return Split(PeerChange(engine, tuple(sorted(added, key=order)),
                                tuple(sorted(removed, key=order))), route, unroute, change)

    def refused(self, split: Split, family: Family, subnets, engine_before: PeerSnapshot) -> Split:
        """``split`` once the kernel refused the direct routes of ``family`` of the leases of
        ``subnets`` (their IPv4 subnets): those leave the direct table, so that the engine
        routes them (an IPv4 subnet joins the engine's share; the engine routes every IPv6 part
        anyway), and they are tried again when the host's addresses or routes change
        (:meth:`reconsider`)."""
        table = self.direct[family]
        for subnet in subnets:
            table.pop(subnet, None)
        moves = [(tuple(lease for lease in split.route[f] if f is not family
                        or lease.subnet not in subnets), split.unroute[f]) for f in FAMILIES]
        return self._split(split.source, engine_before, moves)


@dataclass(frozen=True)
class _Way:
    """One family's direct routes: ``table`` (IPv4 subnet -> lease whose route to
    ``dst(lease, family)`` is in the kernel), decided by ``why_not``."""
    family: Family
    table: dict
    why_not: Callable[[Lease], Optional[str]]

    def follow(self, removed, added) -> tuple[list, list]:
        """``table`` after a change; returns the leases to route and those whose route goes."""
        table, route, unroute = self.table, [], []
        for lease in removed:
            old = table.pop(lease.subnet, None)
            if old is not None:
                unroute.append(old)
        for lease in added:
            old = table.pop(lease.subnet, None)
            if self.why_not(lease) is None:
                if old is not None and dst(old, self.family) != dst(lease, self.family):
                    unroute.append(old)
                table[lease.subnet] = lease
                route.append(lease)
            elif old is not None:
                unroute.append(old)
        return route, unroute
