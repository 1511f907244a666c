"""Peer changes -> routes: the engine's route table and, with DirectRouting, the kernel's direct
routes. The one way a peer change reaches the engine.

The peer watch reports changes (its publisher thread, or the daemon's main thread during a lease
move: daemon/lease_move.py); DirectRouting (control/direct.py) splits each into the engine's
share of the IPv4 subnets and the direct routes of both families. The engine's IPv4 routes follow
that share, its IPv6 routes the whole change (a peer's IPv6 part is routed by the engine whether
or not either family goes direct: control/direct.py says why), so the two families' ways are
independent. Both are applied to the route table kept here (the work of the change, not of the
whole table: control/routes.py), which every queue takes whole and at once; a new engine (a lease
move, a failed handover) gets the whole table the same way. With DirectRouting on, the host's
address and route changes decide every peer again. With --ipv6-underlay-fallback, the probes of
daemon/underlay_fallback.py start here too and move a peer's IPv6 part between the underlays
(:meth:`PeerRoutes.set_fallback`).

What the reports read (the engine's peers, the direct ones) is in the daemon's DaemonState
(daemon/state.py), written under its lock.
"""
from __future__ import annotations

import errno
import logging
import os
import threading

from ..control.direct import DirectRouting, dst, via
from ..control.peerset import PeerChange
from ..control.recurring import Recurring
from ..control.routes import Ipv6Parts, route_changes, route_table
from ..engine.route_array import routes_of
from ..host import direct_routes, malloc, netlink_batch
from ..host.family import FAMILIES, V4, V6
from . import underlay_fallback
from .peer_log import PeerLog

log = logging.getLogger(__name__)


class PeerRoutes:
    """The routes of the daemon whose DaemonState is ``state`` (its engine and its class, its
    peers, its config and interface), and the peer changes in the log."""

    def __init__(self, state):
        self.state = state
        self.routes = None                    # the engine's table; None until the first listing
        # which peers' IPv6 parts are routes (control/routes.py): none until follow_lease
        self.ipv6 = Ipv6Parts(None)
        self.route_watch = None               # host/direct_routes.py HostRouteWatch, when it is on
        self.fallback = None                  # daemon/underlay_fallback.py, when it is on
        self.peer_log = None                  # daemon/peer_log.py, from start_direct on
        self._lock = threading.RLock()        # one peer change (or re-decision) at a time
        self._changed = False                 # peers changed since tick(); state.lock
        # direct routes the kernel refused (added or removed): counted, and said once per errno
        self.direct_routes_refused = 0
        self._refusals = Recurring(log, "The kernel refused DirectRouting's routes")

    def follow_lease(self, network6, own6, underlay6=(None, 0)) -> None:
        """The network config's IPv6Network and our lease's IPv6 part, before the first engine
        gets its routes and whenever the lease moves; ``underlay6`` is (our PublicIPv6 or
        None, the inner MTU over it): control/routes.py Ipv6Parts."""
        if self.ipv6.network6 != network6:
            old, self.ipv6 = self.ipv6, Ipv6Parts(network6, own6)
            self.ipv6.probe_routes, self.ipv6.fallback = old.probe_routes, old.fallback
        self.ipv6.own6 = own6
        self.ipv6.public6, self.ipv6.mtu6 = underlay6

    def start_direct(self, socks6=()) -> None:
        """Which peers go direct, as the network config says (its DirectRouting), and, when it
        is on, the watch of this host's addresses and routes that decides them again; and the
        probes of the IPv6 underlay on one of ``socks6`` (before the first listing, whose
        routes they change)."""
        st = self.state
        self.peer_log = PeerLog(st.config.backend_port)
        ifindex = st.ext.index
        st.direct = DirectRouting(st.config.direct_routing,
                                  lambda ip: direct_routes.on_link(ip, ifindex),
                                  ipv6_part=lambda lease: self.ipv6.why_not(lease),
                                  on_link_all=lambda ips: direct_routes.on_link_all(ips, ifindex))
        if st.config.direct_routing:
            log.info("DirectRouting is on: peers that have it too and whose PublicIP is on %s's "
                     "link get a kernel route via their PublicIP (proto %d), their IPv6 parts one "
                     "via their PublicIPv6 when that is on the link; the others go through "
                     "flannel0", st.ext.name, direct_routes.PROTO)
            self.route_watch = direct_routes.HostRouteWatch(
                self.reconsider).start()
        self.fallback = underlay_fallback.start(st, self, socks6)

    def close(self) -> None:
        """Stop watching the host's routes (the direct routes stay) and probing."""
        if self.route_watch is not None:
            self.route_watch.close()
        if self.fallback is not None:
            self.fallback.close()

    def set_fallback(self, subnets: frozenset) -> None:
        """The peers (IPv4 subnets) whose IPv6 parts go over IPv4 because their IPv6 underlay
        failed, from now on: the routes of those that changed are made again."""
        st = self.state
        with self._lock:
            changed = self.ipv6.fallback ^ subnets
            self.ipv6.fallback = frozenset(subnets)
            port = st.config.backend_port
            with st.lock:
                leases = [st.peers[6].peers.get(subnet) for subnet in changed]
                added = tuple(self.ipv6.route(lease.ipv6_subnet, lease, port)
                              for lease in leases
                              if lease is not None and self.ipv6.why_not(lease) is None)
                if self.routes is None or not added:
                    return
                self.routes = self.routes.updated((), _engine(added))
                if st.engine is not None:
                    st.engine.set_table(self.routes)

    def on_peers(self, change: PeerChange) -> None:
        """PeerWatcher's callback (its publisher thread, or the daemon's main thread during a
        lease move): a change applied, and said in the peer log."""
        st = self.state
        with self._lock:
            first = self.routes is None
            split = st.direct.apply(change, st.peers[4])
            self._apply(split, change, reconcile=first)
            # the peers the engine routes: its table also holds their IPv6 parts
            self.peer_log.record(change, len(st.peers[4]), direct=st.direct)
        if first:
            _give_back_memory()

    def reconsider(self) -> None:
        """HostRouteWatch's callback: the host's addresses or routes changed; every peer is
        decided again, and the kernel's direct routes made to match."""
        st = self.state
        with self._lock:
            if self.routes is None:     # before the first listing, which decides every peer
                return
            split = st.direct.reconsider(st.peers[6], st.peers[4])
            for family in FAMILIES:
                address = "PublicIP" if family is V4 else "PublicIPv6"
                for lease in split.route[family]:
                    log.info("Subnet %s:%s now a direct route via %s dev %s (its %s is on this "
                             "host's link)", lease.subnet, _part(lease, family),
                             via(lease, family), st.ext.name, address)
                for lease in split.unroute[family]:
                    log.info("Subnet %s:%s now through flannel0 to %s:%d (%s)", lease.subnet,
                             _part(lease, family), lease.public_ip, st.config.backend_port,
                             st.direct.why_not(lease, family) or "its lease changed")
            self._apply(split, PeerChange(st.peers[6]), reconcile=True)

    def load(self, engine) -> None:
        """Give a new engine the routes of the peers known (the caller holds state.lock)."""
        if self.routes is not None:
            engine.set_table(self.routes)
        else:
            engine.set_routes(self._table(self.state.peers))

    def tick(self) -> bool:
        """The serve loop's, once a tick: the peer log's summary when due; whether the peers
        changed since the last tick (the caller holds state.lock)."""
        if self.peer_log is not None:
            self.peer_log.tick()
        changed, self._changed = self._changed, False
        return changed

    def _table(self, peers: dict) -> tuple:
        """The whole table of ``peers`` (DaemonState.peers): each family's routes of the
        snapshot of that family's version."""
        port = self.state.config.backend_port
        return _engine(sum((
            route_table(peers[family.version], port, self._ipv6_of(family), family)
            for family in FAMILIES), ()))

    def _ipv6_of(self, family):
        """How route_table and route_changes make one family's routes: the IPv6 parts' need
        :class:`Ipv6Parts`."""
        return self.ipv6 if family is V6 else None

    def _apply(self, split, whole: PeerChange, reconcile: bool = False) -> None:
        """A change (``whole``; ``split`` its division, control/direct.py) applied: the
        engine's IPv4 routes from its share, its IPv6 routes from the whole, and the direct
        routes. A peer that goes direct gets its IPv4 route before it leaves the engine's
        table, one that comes back is in the table before its route goes, so that no packet
        finds neither; the engine routes every IPv6 part, so a part's direct route may go
        first (a part that moved to another peer is routed after its old route went)."""
        st = self.state
        # A reconcile reads the kernel's routes first: those already there as wanted (a
        # restart's) are not made again, and ours just made are not read back (16,000 routes
        # and nexthops: ~0.25 s of a DirectRouting start's CPU, perf/README.md#direct-start)
        before = direct_routes.listing() if reconcile and st.direct.enabled else None
        made: set = set()
        split = self._route(split, V4, before, made)
        self._unroute(split.unroute[V6], V6)
        split = self._route(split, V6, before, made)
        changes = {V4: split.engine, V6: whole}
        peers = {family.version: change.snapshot for family, change in changes.items()}
        if self.routes is None:
            # the first listing: the whole table (nothing handed over lingers), made outside
            # state.lock so that /metrics and status answer meanwhile
            table_type = (st.engine_cls.table_type if st.kernel is None
                          else st.kernel.table_type(st.engine_cls))
            routes = table_type.of(self._table(peers))
        else:
            port = st.config.backend_port
            removed, added = (), ()
            for family, change in changes.items():
                gone, new = route_changes(change, port, self._ipv6_of(family),
                                          before=st.peers[family.version], family=family)
                removed += gone
                added += new
            routes = self.routes.updated(removed, _engine(added))
        with st.lock:
            self.routes = routes
            st.peers = peers
            if st.engine is not None:
                st.engine.set_table(self.routes)
            # The state file is for the next process only; the serve loop rewrites it once a
            # tick (all peers: docs/design.md#fig-state-file), not once per batch of a burst.
            self._changed = True
        self._unroute(split.unroute[V4], V4)
        if before is not None:
            self._reconcile_direct_routes(before, made)

    def _reconcile_direct_routes(self, listing, made: set) -> None:
        """Our routes in the kernel as decided, both families: a previous daemon's that no peer
        wants go, a missing one (deleted by hand) comes back. ``listing``: direct_routes.listing()
        before this change's routes were made; ``made``: the subnets routed since."""
        st = self.state
        have, other_form, orphans = listing
        wanted = [(dst(lease, family), via(lease, family))
                  for family in FAMILIES for lease in st.direct.direct[family].values()]
        if not have and not other_form:
            # none there before (a fresh start): nothing to remove or replace, and each subnet
            # hashed once (an IPv4Network's hash is a Python call: 16,000 of them a pass)
            self._put_missing([(s, gw) for s, gw in wanted if s not in made])
            self._remove_orphans(orphans)
            return
        want = dict(wanted)
        for subnet, gateway in have.items():
            if subnet not in want:
                log.info("Removing the direct route to %s via %s: no peer routed directly has "
                         "it now", subnet, gateway)
        self._remove(subnet for subnet in have if subnet not in want)
        # a route in the other form (a plain one of an older daemon, where nexthop objects are
        # used now) is replaced in place: the kernel swaps it, no packet finds none
        self._put_missing([(subnet, gateway) for subnet, gateway in want.items()
                           if (have.get(subnet) != gateway or subnet in other_form)
                           and subnet not in made])
        # nexthops of ours no route uses (their routes replaced or deleted by hand), and those
        # of routes just made plain
        self._remove_orphans(orphans + [nhid for subnet, nhid in other_form.items()
                                        if nhid and subnet in want])

    def _put_missing(self, missing) -> None:
        refused = direct_routes.put_all(missing, self.state.ext.index)
        if refused:
            self._refused(refused, len(missing), "")

    def _remove_orphans(self, orphans) -> None:
        if orphans:
            log.info("Removing %d nexthop object(s) of proto %d that no direct route uses",
                     len(orphans), direct_routes.PROTO)
            for nhid, code in direct_routes.delete_nexthops(orphans)[:1]:
                log.warning("Removing nexthop id %d: %s (%s)", nhid, os.strerror(code),
                            netlink_batch.errno_name(code))

    def _route(self, split, family, before=None, made=None):
        """The kernel's direct routes of ``family`` to the subnets of it of ``split.route``
        made, over one netlink socket; returns ``split``, or, when the kernel refused some,
        ``split`` with those peers through the engine (control/direct.py refused). With
        ``before`` (direct_routes.listing()), a route already there in the form this kernel
        gets is kept as it is; the subnets routed go into ``made``."""
        leases = split.route[family]
        if not leases:
            return split
        st = self.state
        routes = [(dst(lease, family), via(lease, family)) for lease in leases]
        if before is not None and (before[0] or before[1]):     # (none there: none to keep)
            have, other_form, _ = before
            routes = [(subnet, gateway) for subnet, gateway in routes
                      if have.get(subnet) != gateway or subnet in other_form]
        refused = direct_routes.put_all(routes, st.ext.index)
        if made is not None:
            made.update(subnet for subnet, _ in routes)
            made.difference_update(subnet for subnet, _, _ in refused)
        if not refused:
            self._refusals.ok("direct routes are added again")
            return split
        by_dst = {dst(lease, family): lease for lease in leases}
        subnets = {by_dst[subnet].subnet for subnet, _, _ in refused}
        split = st.direct.refused(split, family, subnets, st.peers[4])
        self._refused(refused, len(leases), "; those peers go through flannel0 meanwhile")
        return split

    def _refused(self, refused, asked: int, meanwhile: str) -> None:
        """Routes the kernel refused to add, ``(subnet, via, errno)``: counted, and said once
        per errno (then a slow reminder) with what to do."""
        self.direct_routes_refused += len(refused)
        subnet, gateway, code = refused[0]
        self._refusals.fail(
            f"{len(refused)} of {asked} route(s), the first {subnet} via {gateway} dev "
            f"{self.state.ext.name} proto {direct_routes.PROTO}: {os.strerror(code)} "
            f"({netlink_batch.errno_name(code)}){meanwhile}",
            _REFUSED_ADVICE.get(code, _REFUSED_ADVICE[None]), key=code)

    def _unroute(self, leases, family) -> None:
        """The kernel's direct routes of ``family`` to ``leases``' subnets of it removed (those
        already gone are no error), over one netlink socket."""
        if not leases:
            return
        self._remove(dst(lease, family) for lease in leases)

    def _remove(self, subnets) -> None:
        """Our direct routes to ``subnets`` removed; a refusal logged (a route left behind)."""
        refused = direct_routes.remove_all(subnets)
        if not refused:
            return
        self.direct_routes_refused += len(refused)
        subnet, code = refused[0]
        self._refusals.fail(
            f"removing {len(refused)} route(s), the first {subnet} proto {direct_routes.PROTO}: "
            f"{os.strerror(code)} ({netlink_batch.errno_name(code)})",
            "remove them by hand (`ip route del <subnet> proto 153`) or with `flannel-udp "
            "cleanup` once the daemon is stopped", key=("del", code))


# What to do when the kernel refuses a direct route, by errno (None: any other)
_REFUSED_ADVICE = {
    errno.ENETUNREACH: "the PublicIP is no longer on the external interface's link (an address "
                       "or route changed meanwhile): the peer is decided again when the host's "
                       "addresses or routes settle",
    errno.EEXIST: "another route of that prefix is in the main table (not ours: proto 153): "
                  "remove it, or turn DirectRouting off",
    errno.EPERM: "the daemon lacks CAP_NET_ADMIN",
    errno.ENODEV: "the external interface is gone: restart the daemon once it is back",
    None: "check the external interface's addresses and routes (`ip route get <PublicIP>`); the "
          "peer is decided again when they change",
}


def _part(lease, family) -> str:
    """How the log names the subnet of ``family`` of ``lease`` after its IPv4 subnet."""
    return "" if family is V4 else f" its IPv6 part {lease.ipv6_subnet}"


def _give_back_memory() -> None:
    """The first listing's temporaries (etcd's response, the parse, the lists the table was
    built from) are freed by now, but the C allocator keeps their pages in the middle of its
    heap: malloc_trim returns them (1.5-4 MB of the idle RSS at 16,000 peers, perf/README.md)."""
    malloc.give_back()


def _engine(routes) -> tuple:
    """The engine's routes of control's (control/routes.py PeerRoute, typed already: the
    table checks them as it is built)."""
    return routes_of(routes)
