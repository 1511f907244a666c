"""A route table derived from a change (``table.updated(removed, added)``) is the table a whole build
gives, for both engines' tables; both refuse the same routes; several queues get one table at once."""
from __future__ import annotations

import ipaddress
import random
import socket

import pytest

from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.control.peerset import PeerChange, PeerSnapshot
from dataplane.control.routes import route_changes, route_table
from dataplane.engine import Route, engine_class, multi
from dataplane.engine.pytable import RouteTable
from dataplane.engine.route_array import RouteArray, route_arrays, route_columns
from tests.conftest import require_engine, wait_until

TABLES = [RouteArray, RouteTable]


def route(i: int, peer: int, port: int = 8285, plen: int = 24, v6: bool = False) -> Route:
    if v6:
        net = ipaddress.IPv6Network(((0xFC00_0066 << 96) + (i << (128 - plen)), plen))
    else:
        net = ipaddress.IPv4Network((0x0A000000 + (i << (32 - plen)), plen))
    return Route(net, ipaddress.IPv4Address(0x7F000002 + peer), port)


def engine_routes(routes) -> list:
    """The engine's routes of control's, as the daemon makes them (daemon/peer_routes.py)."""
    return [Route(*r) for r in routes]


def same(table, routes) -> None:
    """``table`` holds exactly ``routes`` (a later route of a subnet wins)."""
    want = {r.subnet: r for r in routes}
    if isinstance(table, RouteArray):           # the rows as the C engine reads them
        for arr, full in zip((table.array, table.array6), route_arrays(want.values())):
            assert sorted(arr.tobytes()[i:i + arr.itemsize] for i in range(0, arr.nbytes, arr.itemsize)) \
                == sorted(full.tobytes()[i:i + full.itemsize] for i in range(0, full.nbytes, full.itemsize))
    else:
        full = RouteTable(want.values())
        assert (table.lens, table.lens6, table.peers, len(table)) == \
            (full.lens, full.lens6, full.peers, len(full))


@pytest.mark.parametrize("cls", TABLES)
def test_random_changes_equal_a_whole_build(cls):
    rnd = random.Random(17)
    current: dict = {}
    table = cls.of()
    for step in range(400):
        removed = rnd.sample(sorted(current, key=lambda n: (n.version, n)),
                             min(len(current), rnd.randrange(4)))
        removed.append(route(500 + step, 0).subnet)                    # no route: ignored
        # few peers and subnets, so that moves, shared peers and re-adds happen
        added = [route(rnd.randrange(60), rnd.randrange(8), plen=rnd.choice((24, 24, 16, 32)))
                 for _ in range(rnd.randrange(5))]
        added += [route(rnd.randrange(60), rnd.randrange(8), plen=rnd.choice((64, 64, 56, 128)),
                        v6=True) for _ in range(rnd.randrange(3))]
        for subnet in removed:
            current.pop(subnet, None)
        for r in added:
            current[r.subnet] = r
        table = table.updated(removed, added)
        same(table, current.values())
        if cls is RouteArray:                       # no stale duplicate row behind the index
            assert len({tuple(r[:2]) for r in table.array.rows()}) == len(table.array)
            assert len({(r[0], r[2]) for r in table.array6.rows()}) == len(table.array6)


@pytest.mark.parametrize("cls", TABLES)
def test_an_update_leaves_the_old_table_as_it_was(cls):
    old = cls.of([route(1, 1), route(2, 2)])
    new = old.updated([route(1, 1).subnet], [route(2, 9), route(3, 3)])
    same(old, [route(1, 1), route(2, 2)])
    same(new, [route(2, 9), route(3, 3)])


@pytest.mark.parametrize("cls", TABLES)
def test_a_whole_build_with_duplicates_then_a_removal(cls):
    """The last duplicate wins in a whole build (whose peer set keeps the replaced route's peer,
    as csrc/routes.c does); a table derived from it knows the peers of its routes only."""
    t = cls.of([route(1, 1), route(1, 2), route(2, 2)])
    derived = t.updated([route(1, 0).subnet])
    same(derived, [route(2, 2)])
    if cls is RouteTable:
        assert t.peers == {"127.0.0.3", "127.0.0.4"} and derived.peers == {"127.0.0.4"}


@pytest.mark.parametrize("bad", [Route(ipaddress.IPv4Network("10.5.3.0/24"), "127.0.0.2", 8285),
                                 Route(ipaddress.IPv4Network("10.5.3.0/24"),
                                       ipaddress.IPv4Address("127.0.0.2"), 0)])
def test_both_tables_refuse_the_same_changes(bad):
    errors = set()
    for cls in TABLES:
        t = cls.of([route(1, 1)])
        with pytest.raises((TypeError, ValueError)) as exc:
            t.updated([], [route(2, 2), bad])
        errors.add((type(exc.value), str(exc.value)))
        same(t, [route(1, 1)])
    assert len(errors) == 1


@pytest.mark.parametrize("cls", TABLES)
def test_a_change_converts_its_routes_not_the_tables(cls, monkeypatch):
    """One peer replaced at 20,000 peers: only the change's routes are converted and checked, not
    the table's (what an update costs in time is measured by perf/route_publish.py)."""
    from dataplane.engine import pytable, route_array as route_array_module
    big = cls.of([route(i, i) for i in range(20000)])
    big.updated([], [route(30000, 1)])               # the first update indexes a whole build
    converted = []

    def counting(routes):
        routes = list(routes)
        converted.append(len(routes))
        return route_columns(routes)
    monkeypatch.setattr(route_array_module, "route_columns", counting)
    monkeypatch.setattr(pytable, "route_columns", counting)
    for i in range(20):
        big = big.updated([route(i, i).subnet], [route(40000 + i, i)])
    assert converted == [1] * 20
    assert len(big) == 20000


def lease(i: int, peer: int) -> Lease:
    r = route(i, peer)
    return Lease(r.subnet, LeaseAttrs(r.peer_ip))


@pytest.mark.parametrize("cls", TABLES)
def test_route_changes_keep_the_table_equal_to_the_snapshots(cls):
    """The daemon's step: snapshot after snapshot, the kept table is route_table(snapshot)."""
    rnd = random.Random(5)
    own = route(0, 0).subnet
    leases: dict = {}
    snap, table = PeerSnapshot.of((), own), cls.of()
    for _ in range(150):
        for _ in range(rnd.randrange(4)):
            i = rnd.randrange(40)
            if rnd.random() < 0.4:
                leases.pop(route(i, 0).subnet, None)
            else:
                leases[route(i, 0).subnet] = lease(i, rnd.randrange(5))
        after = PeerSnapshot.of(leases, own)
        change = PeerChange.between(snap, after)
        removed, added = route_changes(change, 8285)
        table, snap = table.updated(removed, engine_routes(added)), after
        same(table, engine_routes(route_table(snap, 8285)))


@pytest.mark.parametrize("kind", ["c", "python"])
def test_every_queue_gets_the_one_table(kind):
    """set_table on several queues: one table, built before any queue switches (the C engine
    builds each queue's copy first, then publishes them all), or none when it is refused."""
    require_engine(kind)
    n = 3
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(n)]
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    engine = multi.create(engine_class(kind), [p[0].fileno() for p in pairs],
                          [s.fileno() for s in socks], tun_addr="10.5.1.0", mtu=1472)
    try:
        cls = engine.table_type
        table = cls.of([route(i, i) for i in range(100)])
        engine.set_table(table)
        if kind == "python":
            assert all(q._published is table for q in engine.queues)
        with pytest.raises(TypeError):
            engine.set_table(RouteArray.of() if cls is RouteTable else RouteTable())
        engine.start()
        wait_until(lambda: all(q["route_swaps"] >= 1 for q in engine.queue_stats()), 5, 0.01,
                   "every queue to adopt the table")
        assert [q["route_swaps"] for q in engine.queue_stats()] == [1] * n
        engine.set_table(table.updated([route(0, 0).subnet], [route(200, 1)]))
        wait_until(lambda: all(q["route_swaps"] >= 2 for q in engine.queue_stats()), 5, 0.01,
                   "every queue to adopt the updated table")
        assert [q["route_swaps"] for q in engine.queue_stats()] == [2] * n
    finally:
        engine.close()
        for a, b in pairs:
            a.close()
            b.close()
        for s in socks:
            s.close()
