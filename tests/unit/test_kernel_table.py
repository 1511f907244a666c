"""engine/kernel_engine.py's KernelTable: a change costs its own size (the derived tables share
one dict), and every table, the newest or an older one, a branch or the line, reads its own
routes; a table made whole keeps the routes a later duplicate replaced, for their peers."""
from __future__ import annotations

import random

from dataplane.engine.api import Route
from dataplane.engine.kernel_engine import KernelTable
from dataplane.engine.route_array import RouteArray

Table = KernelTable.over(RouteArray)


def _route(rng) -> Route:
    return Route.make(f"10.{rng.randrange(4)}.{rng.randrange(256)}.0/24",
                      f"192.168.9.{1 + rng.randrange(9)}", 8285)


def test_every_table_reads_its_own_routes():
    rng = random.Random(47)
    first = [_route(rng) for _ in range(400)]
    tables = [(Table.of(first), {r.subnet: r for r in first})]
    for _ in range(300):
        # mostly the newest, sometimes an older one: a branch
        base, want = tables[-1] if rng.random() < 0.8 else rng.choice(tables)
        removed = [r.subnet for r in rng.sample(first, 3)]
        added = [_route(rng) for _ in range(3)]
        want = dict(want)
        for s in removed:
            want.pop(s, None)
        want.update((r.subnet, r) for r in added)
        tables.append((base.updated(removed, added), want))
    for table, want in rng.sample(tables, 60) + tables[:3] + tables[-3:]:
        assert table.routes == want
        assert {r.subnet: r for r in table.whole()} == want     # the last of a subnet wins
        assert len(table) == len(want)


def test_a_change_does_not_copy_the_table():
    routes = [Route.make(f"10.{i // 256}.{i % 256}.0/24", "192.168.9.1", 8285)
              for i in range(5000)]
    t = Table.of(routes)
    head = t._node
    t2 = t.updated([routes[0].subnet], [Route.make("10.99.0.0/24", "192.168.9.2", 8285)])
    assert t2._node is head and t._node[0] is t2 and len(t._node[1]) == 2
    assert t.change is None and t2.change[0] == t.serial


def test_a_whole_table_keeps_a_replaced_duplicate():
    a = Route.make("10.5.2.0/24", "192.168.7.2", 8285)
    b = Route.make("10.5.2.0/24", "192.168.7.3", 8285)
    c = Route.make("10.5.3.0/24", "192.168.7.4", 8285)
    t = Table.of([a, c, b])
    assert t.whole() == [a, b, c] and t.shadowed == (a,)     # the replaced one first
    assert t.routes == {a.subnet: b, c.subnet: c}
    assert t.updated((), ()).shadowed == ()        # derived: the routes' peers only
