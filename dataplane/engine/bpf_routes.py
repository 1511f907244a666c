"""The kernel path's routes and peers: the engines' route set written into the programs' maps.

RouteMaps is KernelPath's (bpf_path.py) share that keeps ``fu_routes4``/``fu_routes6``
(subnet -> peer and MTU, the LPM tries) and ``fu_peers4``/``fu_peers6`` (the senders step 2
accepts) equal to the routes the engines are given, as the engines' tables hold them:
``set_routes`` a whole set, ``change_routes`` a change of one (a peer's lease), each writing
only what differs from what the maps hold. Its host class gives it ``map_fd``, ``_cfg`` (the
config: whether an IPv6 underlay is there), ``_update``/``_delete`` and ``error`` (the
exception a route set the programs cannot hold raises).

Writes go in batches, one syscall per map and step (BPF_MAP_UPDATE_BATCH /
BPF_MAP_DELETE_BATCH: 16,000 routes cost one call, not 32,000), where the kernel has them for
the map's type (asked once per map), else one element at a time; new routes and senders first,
gone ones after, so a peer that stays never misses. The keys and values are packed as bytes,
checked at import against maps.h's layouts (bpf_contract's cdef).

Where the engines and the programs would differ, the engines win:
* several routes of one subnet in one set: the last is the route, and every one's peer a
  sender (csrc/routes.c keeps the replaced duplicate's peer); a table derived from a change
  knows the peers of its routes only, and so do the maps after ``change_routes``;
* a route via 0.0.0.0, which the programs would read as the IPv6 underlay's ``::``: it stays
  in the map with an MTU no packet fits (every packet of it goes to the engine, which answers
  as it does alone), counted in ``engine_routes`` and said once.
"""
from __future__ import annotations

import ipaddress
import logging
import struct
from array import array
from collections import Counter

from . import bpf_contract as bc
from .bpf_lib import batch_supported, delete_batch, ffi, update_batch
from .route_array import be_words

log = logging.getLogger(__name__)

# A route's MTU in the map where the programs must hand every packet to the engine (a peer
# they cannot send to: RouteMaps._hop_bytes): no packet is that short.
UNSENDABLE_MTU = 1


def _hop_mtu(peer_ip: int, mtu: int) -> int:
    """The MTU written for a route via the IPv4 ``peer_ip``: 0.0.0.0 cannot be sent to."""
    return mtu if peer_ip else UNSENDABLE_MTU


ANY4 = ipaddress.IPv4Address(0)
# fu_key4 (prefixlen, addr) and fu_hop (peer_ip, mtu, peer_ip6[16]) as uint32 words, for the
# IPv4 routes packed by whole columns with array (no numpy: its import was ~0.1 s of a start);
# addresses in network order, the rest native (checked against maps.h's layouts at the bottom)
_KEY4_WORDS, _HOP_WORDS = 2, 6
assert array("I").itemsize == 4


class RouteMaps:
    """The route and peer maps of a KernelPath (the module says what the host class gives)."""
    error: type = RuntimeError

    def _init_route_maps(self) -> None:
        self._routes: dict = {}          # subnet -> (peer_ip, mtu) as written
        self._peers: dict = {}           # peer (either underlay) -> how many routes name it
        self._extra: set = set()         # peers in the maps that only a replaced duplicate
                                         # of the last set_routes names
        self._batch_ok: dict = {}        # map -> whether it takes batched writes
        self.engine_routes = 0           # routes whose packets go to the engine (_hop_bytes)
        self.engine_routes_said = False

    def _wanted(self, routes) -> tuple[dict, set]:
        """{subnet: (peer, mtu)} of the routes the programs can hold (set_routes, change_routes),
        the last of a subnet's routes winning as in the engines' tables, and the peers of the
        routes a later one of the same subnet replaced (the engines keep them as senders).
        A route's peer says its underlay, as for the engines: an IPv6 peer takes the IPv6 one
        (which needs configure's own_ip6), its mtu the route's (the link's less 48)."""
        routes = list(routes)
        if not any(self._cfg.own_ip6):
            for r in routes:
                if r.peer_ip.version == 6:
                    raise self.error(f"route {r.subnet} via {r.peer_ip}: the IPv6 underlay needs "
                                     "own PublicIPv6 (configure(own_ip6=...))")
        # (a subnet's hash is the dear part: one per route where no subnet repeats)
        want = {r.subnet: (r.peer_ip, r.mtu) for r in routes}
        shadowed = set()
        if len(want) != len(routes):
            last: dict = {}
            for r in routes:
                old = last.get(r.subnet)
                if old is not None:
                    shadowed.add(old.peer_ip)
                last[r.subnet] = r
        return want, shadowed

    def set_routes(self, routes) -> None:
        """The engines' routes (api.Route), replacing the last set: new and changed routes
        written first, then the gone ones deleted, so a peer that stays never misses. Several
        routes of one subnet: the last one is the route, and every one's peer a sender (a
        table made whole, as the engines build it)."""
        want, shadowed = self._wanted(routes)
        if len(want) > bc.ROUTES_MAX:
            raise self.error(f"{len(want)} routes: the kernel path holds {bc.ROUTES_MAX}")
        # Each address hashed once where it can be (ipaddress's __hash__ is a Python call:
        # 16,000 peers at a start): counted in C, and the dicts copied with their hashes.
        peers = dict(Counter([peer for peer, _ in want.values()]))
        senders = set(peers) | shadowed
        written = self._peers.keys() | self._extra
        if written:
            self._put_peers([(p, peers.get(p, 1)) for p in senders - written])
        else:                           # a first set: every sender is new
            self._put_peers(list(peers.items()) + [(p, 1) for p in shadowed if p not in peers])
        if self._routes:
            old = self._routes
            self._put_routes([(s, hop) for s, hop in want.items() if old.get(s) != hop])
            self._delete_routes([s for s in old if s not in want])
        else:                           # a first set: nothing to compare with
            self._put_routes(want.items())
        self._delete_peers(written - senders)
        # (not shadowed - peers.keys(): a set less a dict's keys hashes every key again)
        self._routes, self._peers = want, peers
        self._extra = {p for p in shadowed if p not in peers}
        self._note_engine_routes()

    def change_routes(self, removed=(), added=()) -> None:
        """set_routes of the last set less the subnets ``removed``, plus the Routes ``added``,
        in the work of the change rather than of the table (a burst of peer changes on a table
        of thousands): new and changed routes first, the gone ones after. As the engines'
        tables derived from a change, the peers are then those of the routes (a replaced
        duplicate's, of the last set_routes or of ``added``, no more)."""
        want, _ = self._wanted(added)
        gone = [s for s in set(removed) if s in self._routes and s not in want]
        # (the work of the change only: no set operation over the table's keys)
        if len(self._routes) - len(gone) + sum(s not in self._routes for s in want) > \
                bc.ROUTES_MAX:
            raise self.error(f"more than {bc.ROUTES_MAX} routes: the kernel path holds "
                             f"{bc.ROUTES_MAX}")
        unused, puts, new_peers = [], [], {}
        for subnet, hop in want.items():
            old = self._routes.get(subnet)
            if old == hop:
                continue
            peer = hop[0]
            if peer not in self._peers:
                new_peers[peer] = 1
            self._peers[peer] = self._peers.get(peer, 0) + 1
            puts.append((subnet, hop))
            self._routes[subnet] = hop
            if old is not None:
                unused.append(old[0])
        self._put_peers(list(new_peers.items()))
        self._put_routes(puts)
        self._delete_routes(gone)
        unused += [self._routes.pop(subnet)[0] for subnet in gone]
        dead = set()
        for peer in unused:
            self._peers[peer] -= 1
            if not self._peers[peer]:
                del self._peers[peer]
                dead.add(peer)
        self._delete_peers(dead | {p for p in self._extra if p not in self._peers})
        self._extra = set()
        self._note_engine_routes()

    # the maps' keys and values as bytes, for batches (checked against maps.h's layouts below)
    _KEY4, _KEY6 = struct.Struct("=I4s"), struct.Struct("=I16s")
    _HOP4, _HOP6 = struct.Struct("=4sI16x"), struct.Struct("=4xI16s")

    def _batches(self, m: str) -> bool:
        """Whether map ``m`` takes batched writes and deletes (asked once per map)."""
        ok = self._batch_ok.get(m)
        if ok is None:
            fd = self.map_fd[m]
            ok = self._batch_ok[m] = batch_supported(fd) and batch_supported(fd, delete=True)
        return ok

    def _write_many(self, m: str, keys: bytes, values: bytes, n: int) -> None:
        """``n`` elements (their keys and values packed one after another) written in one
        call where the map takes batches, else one by one."""
        if n > 1 and self._batches(m):
            update_batch(self.map_fd[m], keys, values, n, f"writing {m}")
            return
        ks, vs = len(keys) // max(n, 1), len(values) // max(n, 1)
        for i in range(n):
            self._update(m, ffi.from_buffer(keys[i * ks:(i + 1) * ks]),
                         ffi.from_buffer(values[i * vs:(i + 1) * vs]))

    def _delete_many(self, m: str, keys: list) -> None:
        if len(keys) > 1 and self._batches(m):
            delete_batch(self.map_fd[m], b"".join(keys), len(keys), len(keys[0]),
                         f"deleting from {m}")
            return
        for k in keys:
            self._delete(m, ffi.from_buffer(k))

    @classmethod
    def _route_bytes(cls, subnet) -> bytes:
        k = cls._KEY4 if subnet.version == 4 else cls._KEY6
        return k.pack(subnet.prefixlen, subnet.network_address.packed)

    @classmethod
    def _hop_bytes(cls, peer, mtu: int) -> bytes:
        """A route's value (maps.h's fu_hop): the peer's PublicIP, or (peer_ip 0) its PublicIPv6
        for the IPv6 underlay, and the route's MTU. A peer the programs cannot send to (the
        IPv4 0.0.0.0, which they would read as the IPv6 underlay's ::) gets an MTU of 1: every
        packet of the route is then handed to the engine, which answers it as it does alone,
        and a shorter route around the subnet never takes it."""
        if peer.version == 4:
            return cls._HOP4.pack(peer.packed, _hop_mtu(int(peer), mtu))
        return cls._HOP6.pack(mtu, peer.packed)

    def _put_routes(self, items) -> None:
        """(subnet, (peer, mtu)) written, each family's in one batch: the IPv4 subnets' (the
        many; their peers are IPv4) packed by columns, the IPv6 ones' one by one."""
        v4, v6 = [], []
        for item in items:
            (v4 if item[0]._version == 4 else v6).append(item)     # (.version: a Python call)
        if v4:
            n = len(v4)
            keys = array("I", bytes(4 * _KEY4_WORDS * n))
            hops = array("I", bytes(4 * _HOP_WORDS * n))
            # ipaddress's own fields (what int() and .prefixlen read, through a Python call each)
            keys[0::_KEY4_WORDS] = array("I", [s._prefixlen for s, _ in v4])
            keys[1::_KEY4_WORDS] = be_words([s.network_address._ip for s, _ in v4])
            peers = [p._ip for _, (p, _) in v4]
            hops[0::_HOP_WORDS] = be_words(peers)
            hops[1::_HOP_WORDS] = array("I", [m if p else UNSENDABLE_MTU   # _hop_mtu, inline
                                              for p, (_, (_, m)) in zip(peers, v4)])
            self._write_many(bc.MAP_ROUTES4, keys.tobytes(), hops.tobytes(), n)
        if v6:
            self._write_many(bc.MAP_ROUTES6, b"".join(self._route_bytes(s) for s, _ in v6),
                             b"".join(self._hop_bytes(*hop) for _, hop in v6), len(v6))

    def _delete_routes(self, subnets) -> None:
        for version, m in ((4, bc.MAP_ROUTES4), (6, bc.MAP_ROUTES6)):
            self._delete_many(m, [self._route_bytes(s) for s in subnets if s.version == version])

    def _put_peers(self, items) -> None:
        """(peer, how many routes name it) written, each underlay's in one batch."""
        v4 = [(p, n) for p, n in items if p._version == 4]
        v6 = [(p, n) for p, n in items if p._version == 6]
        self._write_many(bc.MAP_PEERS4, be_words([p._ip for p, _ in v4]).tobytes(),
                         array("I", [n for _, n in v4]).tobytes(), len(v4))
        self._write_many(bc.MAP_PEERS6, b"".join(p.packed for p, _ in v6),
                         array("I", [n for _, n in v6]).tobytes(), len(v6))

    def _delete_peers(self, peers) -> None:
        for version, m in ((4, bc.MAP_PEERS4), (6, bc.MAP_PEERS6)):
            self._delete_many(m, [p.packed for p in peers if p.version == version])

    def _note_engine_routes(self) -> None:
        """How many routes the programs hand to the engine for a peer they cannot send to
        (``engine_routes``), said once per KernelPath."""
        n = self._peers.get(ANY4, 0)
        if n and not self.engine_routes_said:
            log.warning("kernel path: %d route(s) via 0.0.0.0, which no datagram can be sent to: "
                        "the programs hand their packets to the engine, which answers them as it "
                        "does alone; check the leases' PublicIP", n)
            self.engine_routes_said = True
        self.engine_routes = n


def _check_layouts() -> None:
    """The packed keys and values of the batches (RouteMaps._KEY4 ...) are maps.h's."""
    rm = RouteMaps
    for ctype, st in (("fu_key4", rm._KEY4), ("fu_key6", rm._KEY6), ("fu_hop", rm._HOP4),
                      ("fu_hop", rm._HOP6), ("fu_addr6", struct.Struct("16s")),
                      ("fu_key4", _KEY4_WORDS * 4), ("fu_hop", _HOP_WORDS * 4)):
        size = st.size if isinstance(st, struct.Struct) else st
        assert ffi.sizeof(ctype) == size, (ctype, ffi.sizeof(ctype), size)
    assert ffi.offsetof("fu_key4", "prefixlen") == 0
    assert ffi.offsetof("fu_key4", "addr") == ffi.offsetof("fu_key6", "addr") == 4
    assert (ffi.offsetof("fu_hop", "peer_ip"), ffi.offsetof("fu_hop", "mtu"),
            ffi.offsetof("fu_hop", "peer_ip6")) == (0, 4, 8)


_check_layouts()
