"""The route table: peer leases -> routes, with no I/O.

Every peer's subnet goes as UDP to its PublicIP on the network config's backend port, flanneld's
udp backend's one port for every node; so does the IPv6 part of a dual-stack peer's lease, when
:class:`Ipv6Parts` says it is a route: over the IPv6 underlay to the peer's PublicIPv6 when both
hosts have one (as flannel's vxlan carries IPv6 over its IPv6 device), else over the IPv4 one.
``route_table`` is the whole table of a snapshot; ``route_changes`` is what one peer change does
to it, which the daemon applies to the table it keeps (``table.updated(removed, added)``,
engine/route_array.py and engine/pytable.py) and hands to the engine in one swap: a change costs
its own size, not the peer set's. A route here is plain data (:class:`PeerRoute`): the daemon
makes the engine's routes of it (daemon/peer_routes.py), control knows no engine.
"""
from __future__ import annotations

import logging
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import NamedTuple, Optional, Union

from ..host.family import V4, V6, Family
from .lease import Lease
from .peerset import PeerChange, PeerSnapshot, in_subnet_order

log = logging.getLogger(__name__)


class PeerRoute(NamedTuple):
    """Packets to ``subnet`` (either family) go as UDP to ``peer_ip:port``: an IPv4 peer over
    the IPv4 underlay, an IPv6 one (an IPv6 subnet's only) over the IPv6 underlay; ``mtu``, for
    an IPv6 subnet, the largest inner packet it carries (0: flannel0's)."""
    subnet: Union[IPv4Network, IPv6Network]
    peer_ip: Union[IPv4Address, IPv6Address]
    port: int
    mtu: int = 0


class Ipv6Parts:
    """Which peers' IPv6 parts are routes, on a network config with ``network6`` (its
    IPv6Network; None: IPv6 is off here and no part is a route).

    A part is a route when the lease's value says ``ForwardsIPv6`` (control/lease.py: flanneld's
    udp backend takes dual-stack keys but routes no IPv6, so what went to it would vanish) and
    the part lies in ``network6`` (anything else could only shadow or steal others' traffic) and
    is not this host's own (``own6``). A part that is no route costs that part only: the
    peer's IPv4 subnet is routed as ever. Each such part is said once (per subnet and reason).

    The underlay of a part (:meth:`underlay`): with ``public6`` (this host's PublicIPv6, whose
    sockets are open) and a usable PublicIPv6 in the peer's lease, that address, with
    ``mtu6`` the inner MTU towards it (the interface's MTU - 48, so that the sender learns it
    by an ICMPv6 packet too big while flannel0 keeps the IPv4 underlay's MTU - 28); else the
    peer's PublicIP, at flannel0's MTU. The same goes for a part whose IPv4 subnet is in
    ``fallback``: its IPv6 underlay was found to carry nothing (daemon/underlay_fallback.py).

    With ``probe_routes`` (--ipv6-underlay-fallback), a part that goes over the IPv6 underlay
    but for ``fallback`` also gets :meth:`probe_route`: its first address, the peer's
    flannel0 address, as a /128 over the IPv6 underlay whatever ``fallback`` says. The answers
    to the peer's probes take it, so a probe proves both ways of the IPv6 underlay and both
    hosts decide alike; and its peer keeps the peer's PublicIPv6 among the engines' accepted
    sources while the part goes over IPv4 (dataplane.h: the source check of the IPv6 socket
    asks the IPv6 routes' peers)."""

    def __init__(self, network6: Optional[IPv6Network], own6: Optional[IPv6Network] = None,
                 public6: Optional[IPv6Address] = None, mtu6: int = 0):
        self.network6 = network6
        self.own6 = own6
        self.public6 = public6
        self.mtu6 = mtu6
        self.fallback: frozenset = frozenset()  # IPv4 subnets whose IPv6 underlay fails
        self.probe_routes = False
        self._said: dict = {}           # IPv4 subnet -> (IPv6 part, why) logged last
        self._said_underlay: dict = {}  # IPv4 subnet -> (PublicIPv6, why) logged last

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


    def underlay(self, lease: Lease) -> tuple:
        """``(peer address, inner MTU or 0 for flannel0's)`` of ``lease``'s IPv6 part."""
        if self.over_ipv6(lease) and lease.subnet not in self.fallback:
            return lease.attrs.public_ipv6, self.mtu6
        return lease.public_ip, 0

    def over_ipv6(self, lease: Lease) -> bool:
        """Whether ``lease``'s IPv6 part goes over the IPv6 underlay unless it failed (a
        problem with the peer's PublicIPv6 is said once)."""
        pub6 = lease.attrs.public_ipv6
        if self.public6 is None or pub6 is None:
            return False
        why = self.underlay_problem(pub6)
        if why is None:
            return True
        said = (pub6, why)
        if self._said_underlay.get(lease.subnet) != said:
            self._said_underlay[lease.subnet] = said
            log.warning("Subnet %s: its PublicIPv6 %s cannot carry the overlay (%s): its IPv6 "
                        "part goes over IPv4 to %s", lease.subnet, pub6, why, lease.public_ip)
        return False

    def underlay_problem(self, pub6: IPv6Address) -> Optional[str]:
        """Why a peer's PublicIPv6 cannot be its IPv6 underlay, or None."""
        if pub6.ipv4_mapped is not None or pub6.is_unspecified or pub6.is_loopback \
                or pub6.is_link_local or pub6.is_multicast:
            return "no global unicast address"
        if pub6 == self.public6:
            return "it is this host's own"
        if self.network6 is not None and pub6 in self.network6:
            return f"it lies inside the IPv6Network {self.network6} (it would loop)"
        return None

    def route(self, part: IPv6Network, lease: Lease, port: int) -> PeerRoute:
        """The route of ``lease``'s IPv6 part ``part``."""
        peer, mtu = self.underlay(lease)
        return PeerRoute(part, peer, port, mtu)

    def probe_route(self, part: IPv6Network, lease: Lease, port: int) -> Optional[PeerRoute]:
        """The /128 of the peer's flannel0 address in ``part`` over its IPv6 underlay, or
        None (no probes, or the part goes over IPv4 anyway)."""
        if not self.probe_routes or part.prefixlen == 128 or not self.over_ipv6(lease):
            return None         # (a /128 part is its own probe route: it cannot fall back)
        return PeerRoute(probe_subnet(part), lease.attrs.public_ipv6, port, self.mtu6)


def probe_subnet(part: IPv6Network) -> IPv6Network:
    """The /128 of a peer's flannel0 IPv6 address: its part's first address
    (daemon/startup.py tun_addr6)."""
    return IPv6Network(part.network_address)


def route_table(snapshot: PeerSnapshot, port: int, v6: Optional[Ipv6Parts] = None,
                family: Optional[Family] = None) -> tuple[PeerRoute, ...]:
    """One route per peer in ``snapshot``, sorted by subnet, then one per peer's IPv6 part that
    ``v6`` makes a route; our own subnet is not a peer. ``family``: that family's routes alone
    (V4: the subnets, V6: the IPv6 parts), so a caller that wants one builds none of the other."""
    if family is V6 and (v6 is None or v6.network6 is None):     # IPv6 off: no part routed
        return ()
    peers = in_subnet_order(snapshot.peers)
    # tuple.__new__: a NamedTuple's own __new__ is a Python call, one per peer of thousands
    routes = [_tuple(PeerRoute, (subnet, lease.attrs.public_ip, port, 0))
              for subnet, lease in peers] if family is not V6 else []
    if v6 is not None and family is not V4:
        for _, lease in peers:
            part = v6(lease)
            if part is not None:
                routes.append(v6.route(part, lease, port))
                probe = v6.probe_route(part, lease, port)
                if probe is not None:
                    routes.append(probe)
    return tuple(routes)


_tuple = tuple.__new__


def route_changes(change: PeerChange, port: int, v6: Optional[Ipv6Parts] = None,
                  before: Optional[PeerSnapshot] = None,
                  family: Optional[Family] = None) -> tuple[tuple, tuple[PeerRoute, ...]]:
    """``(removed subnets, added routes)``: applied to the table of ``before`` (the snapshot
    preceding ``change``), they give ``route_table(change.snapshot, port, v6, family)``; a peer
    whose PublicIP or IPv6 part changed is added again, and its old IPv6 part removed (with the
    probe routes, :meth:`Ipv6Parts.probe_route`, of both)."""
    removed, added = [], []
    if family is not V6:
        removed = [lease.subnet for lease in change.removed]
        added = [PeerRoute(lease.subnet, lease.public_ip, port) for lease in change.added]
    if v6 is not None and family is not V4:
        # A part that was no route is removed all the same: the table ignores it.
        for lease in change.removed:
            if lease.ipv6_subnet is not None:
                removed += [lease.ipv6_subnet, probe_subnet(lease.ipv6_subnet)]
        old_peers = before.peers if before is not None else {}
        for lease in change.added:
            part = v6(lease)
            old = old_peers.get(lease.subnet)
            if old is not None and old.ipv6_subnet is not None:
                if old.ipv6_subnet != part:
                    removed.append(old.ipv6_subnet)
                removed.append(probe_subnet(old.ipv6_subnet))   # added again below if kept
            if part is not None:
                added.append(v6.route(part, lease, port))
                probe = v6.probe_route(part, lease, port)
                if probe is not None:
                    added.append(probe)
    return tuple(removed), tuple(added)

