"""The peers' first table, built in one pass over a listing (control/peers.py, claims.py,
routes.py, engine/route_array.py: ints for keys and columns, perf/README.md#peer-table), is the
table the same leases give one event at a time, and the routes and arrays are what the
constructors and ipaddress's own methods give: on a varied listing (conflicts over a subnet, an
IPv6 part and a PublicIP, our own PublicIP, bad keys and values, leases outside the Network,
both families, /31 and /32 subnets, unknown create revisions). No etcd, no root."""
from __future__ import annotations

import random
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network


from dataplane.control.etcd_watch import WatchEvent
from dataplane.control.lease import LeaseAttrs, leases_of_kvs, lease_from_kv, LeaseFormatError
from dataplane.control.peers import PeerWatcher
from dataplane.control.registry import BadLease
from dataplane.control.routes import Ipv6Parts, route_table
from dataplane.engine.api import Route
from dataplane.engine.pytable import RouteTable
from dataplane.engine.route_array import RouteArray, route_arrays, routes_of
from dataplane.host.family import V4, V6
from tests.unit.test_peer_batches import PREFIX, FakeRegistry

NETWORK = IPv4Network("10.0.0.0/8")
NETWORK6 = IPv6Network("fc00::/32")
OWN, OWN_IP = IPv4Network("10.5.1.0/24"), "192.168.77.1"


def value(ip: str, ip6: str | None = None, forwards_ipv6: bool = False) -> bytes:
    return LeaseAttrs(IPv4Address(ip), public_ipv6=IPv6Address(ip6) if ip6 else None,
                      forwards_ipv6=forwards_ipv6).to_json()


def kvs(seed: int) -> list:
    """(key, value, create revision) of a varied listing, shuffled by ``seed``."""
    out = []
    for i in range(2, 250):
        name = f"10.5.{i}.0-24"
        if i % 3 == 0:
            name += f"&fc00:0:{i:x}::-64"
        # IPv6 parts: over the IPv6 underlay (i % 6 == 0), the IPv4 one, or no route (% 9)
        out.append((name, value(f"192.168.{i // 200}.{i % 200 + 10}",
                                f"fd00::{i:x}" if i % 6 == 0 else None, i % 9 != 0), i))
    out += [
        ("10.5.3.0-24&fc00:0:ee::-64", value("192.168.50.3"), 400),     # IPv4 subnet held
        ("10.6.3.0-24&fc00:0:6::-64", value("192.168.50.4"), 401),      # IPv6 part held
        ("10.6.4.0-24", value("192.168.0.12"), 402),                    # PublicIP held (10.5.2)
        ("10.6.5.0-24", value("192.168.0.13"), 0),                      # ... rev unknown: last
        ("10.6.6.0-24", value(OWN_IP), 403),                            # our own PublicIP
        ("10.5.1.0-24", value(OWN_IP), 1),                              # our own lease
        ("10.6.7.0-31", value("192.168.60.1"), 404),
        ("10.6.8.1-32", value("192.168.60.2"), 405),
        ("11.0.0.0-24", value("192.168.60.3"), 406),                    # outside the Network
        ("10.6.9.0-24", value("10.9.9.9"), 407),                        # PublicIP in the Network
        ("10.6.10.0-24", value("127.0.0.1"), 408),                      # loopback PublicIP
        ("10.6.13.0-24", value("224.0.0.5"), 412),                      # multicast
        ("10.6.14.0-24", value("239.255.255.255"), 413),
        ("10.6.15.0-24", value("255.255.255.255"), 414),                # broadcast
        ("10.6.16.0-24", value("0.0.0.0"), 415),
        ("10.6.17.0-24", value("240.0.0.1"), 416),                      # a peer
        ("10.0.0.0-7", value("192.168.60.6"), 417),                     # wider than the Network
        ("10.6.11.0-24", b"not json", 409),                             # bad value
        ("10.6.12.7-24", value("192.168.60.4"), 410),                   # host bits set
        ("nonsense", value("192.168.60.5"), 411),                       # bad key
    ]
    random.Random(seed).shuffle(out)
    return out


class _KV:
    def __init__(self, key, value, created):
        self.key, self.value, self.lease = (PREFIX + key).encode(), value, 0
        self.mod_revision = self.create_revision = created


def listing(seed: int):
    def general(kv):
        try:
            return lease_from_kv(kv.key.decode(), kv.value, mod_revision=kv.mod_revision,
                                 create_revision=kv.create_revision)
        except LeaseFormatError as exc:
            return BadLease(kv.key.decode(), str(exc), kv.mod_revision)
    out = leases_of_kvs([_KV(*kv) for kv in kvs(seed)], general)
    bad = [x for x in out if isinstance(x, BadLease)]
    assert len(bad) == 3            # (the watcher's own check skips the others)
    return [x for x in out if not isinstance(x, BadLease)], bad, 1000


def watcher(**kw) -> PeerWatcher:
    return PeerWatcher(FakeRegistry(), OWN, None, network=NETWORK,
                       own_ips=[IPv4Address(OWN_IP)], **kw)


def one_at_a_time(seed: int) -> PeerWatcher:
    """The same listing as watch events, applied one by one (Claims.put, the index's _hold)."""
    w = watcher(listing=([], (), 1))
    w._snapshot()
    for n, (key, val, created) in enumerate(kvs(seed)):
        w._apply_events([WatchEvent("put", PREFIX + key, val, created, 0, created)], 10 + n)
    w.flush()
    return w


def reference_routes(snapshot, v6: Ipv6Parts) -> list:
    """route_table as it was: Route per peer from its constructor, in IPv4Network's order."""
    peers = sorted(snapshot.peers.items(), key=lambda kv: kv[0])
    routes = [Route(subnet, lease.public_ip, 8285) for subnet, lease in peers]
    for _, lease in peers:
        part = v6(lease)
        if part is not None:
            routes.append(Route(*v6.route(part, lease, 8285)))
    return routes


def test_a_first_listing_is_the_table_of_its_leases_one_by_one():
    for seed in range(4):
        listed = watcher(listing=listing(seed))
        listed._snapshot()
        events = one_at_a_time(seed)
        assert dict(listed.snapshot().peers) == dict(events.snapshot().peers), seed
        assert listed.bad() == events.bad() and len(listed.bad()) == 16, seed
        assert listed.bad_total == events.bad_total
        assert listed._by_ip == events._by_ip and listed._conflicts == events._conflicts
        assert listed._claims._claimants == events._claims._claimants
        peers = listed.snapshot().peers
        assert IPv4Network("10.6.4.0/24") not in peers and OWN not in peers
        assert IPv4Network("10.5.2.0/24") in peers and len(peers) == 248 + 3


def test_the_routes_and_arrays_are_the_constructors_and_ipaddress_own():
    w = watcher(listing=listing(0))
    w._snapshot()
    snap = w.snapshot()
    v6 = Ipv6Parts(NETWORK6, public6=IPv6Address("fd00::1"), mtu6=1400)
    made = routes_of(route_table(snap, 8285, None, V4) + route_table(snap, 8285, v6, V6))
    want = reference_routes(snap, v6)
    assert list(made) == want and [vars(r) for r in made] == [vars(r) for r in want]
    assert {r.peer_ip.version for r in made if r.subnet.version == 6} == {4, 6}
    arr, arr6 = route_arrays(made)
    v4 = [r for r in want if r.subnet.version == 4]
    assert arr.column("net") == [int(r.subnet.network_address) for r in v4]
    assert arr.column("prefixlen") == [r.subnet.prefixlen for r in v4]
    assert arr.column("peer_ip") == [int(r.peer_ip) for r in v4]
    assert set(arr.column("prefixlen")) == {24, 31, 32}
    assert len(arr6) == len(want) - len(v4) > 0
    old6 = route_arrays(list(want))[1]
    assert arr6.tobytes() == old6.tobytes()
    assert len(RouteArray.of(made)) == len(want)
    assert RouteTable.of(made).lens == RouteTable.of(want).lens
