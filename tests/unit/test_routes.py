"""The route step (control/routes.py) over the peer snapshot (control/peerset.py): peer leases -> routes."""
from __future__ import annotations

import logging
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

import pytest

from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.control.peerset import PeerChange, PeerSnapshot
from dataplane.control.routes import Ipv6Parts, PeerRoute, route_changes, route_table

OWN = "10.5.1.0/24"


def lease(subnet: str, ip: str) -> Lease:
    return Lease(IPv4Network(subnet), LeaseAttrs(IPv4Address(ip)))


def route(subnet: str, ip: str, port: int, mtu: int = 0) -> PeerRoute:
    return PeerRoute(ip_network(subnet), ip_address(ip), port, mtu)


CASES = [
    # (id, leases, own, port, expected routes)
    ("empty", [], OWN, 8285, []),
    ("only-own", [lease(OWN, "192.168.77.1")], OWN, 8285, []),
    ("own-excluded", [lease(OWN, "192.168.77.1"), lease("10.5.2.0/24", "192.168.77.2")], OWN, 8285,
     [route("10.5.2.0/24", "192.168.77.2", 8285)]),
    ("one-per-peer-sorted", [lease("10.5.3.0/24", "192.168.77.3"), lease("10.5.2.0/24", "192.168.77.2")],
     OWN, 8285, [route("10.5.2.0/24", "192.168.77.2", 8285), route("10.5.3.0/24", "192.168.77.3", 8285)]),
    ("config-port", [lease("10.5.2.0/24", "192.168.77.2")], OWN, 9000,
     [route("10.5.2.0/24", "192.168.77.2", 9000)]),
    ("duplicate-subnet-last-wins", [lease("10.5.2.0/24", "192.168.77.2"), lease("10.5.2.0/24", "192.168.77.9")],
     OWN, 8285, [route("10.5.2.0/24", "192.168.77.9", 8285)]),
    ("two-subnets-one-host", [lease("10.5.2.0/24", "192.168.77.2"), lease("10.5.4.0/24", "192.168.77.2")],
     OWN, 8285, [route("10.5.2.0/24", "192.168.77.2", 8285), route("10.5.4.0/24", "192.168.77.2", 8285)]),
    ("no-own-subnet-yet", [lease(OWN, "192.168.77.1")], None, 8285, [route(OWN, "192.168.77.1", 8285)]),
]


@pytest.mark.parametrize("leases,own,port,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_route_table(leases, own, port, expected):
    snapshot = PeerSnapshot.of(leases, IPv4Network(own) if own else None)
    assert list(route_table(snapshot, port)) == expected
    assert len(snapshot) == len(expected)


def test_snapshot_is_read_only():
    snapshot = PeerSnapshot.of([lease("10.5.2.0/24", "192.168.77.2")], IPv4Network(OWN))
    with pytest.raises(TypeError):
        snapshot.peers[IPv4Network("10.5.3.0/24")] = lease("10.5.3.0/24", "192.168.77.3")
    with pytest.raises(AttributeError):
        snapshot.own = None


def test_change_between_snapshots():
    own = IPv4Network(OWN)
    before = PeerSnapshot.of([lease("10.5.2.0/24", "192.168.77.2"), lease("10.5.3.0/24", "192.168.77.3")], own)
    after = PeerSnapshot.of([lease("10.5.3.0/24", "192.168.77.33"), lease("10.5.4.0/24", "192.168.77.4")], own)
    change = PeerChange.between(before, after)
    assert change.snapshot is after
    assert [str(l.subnet) for l in change.added] == ["10.5.3.0/24", "10.5.4.0/24"]   # new, and a moved peer
    assert [str(l.subnet) for l in change.removed] == ["10.5.2.0/24"]
    assert not PeerChange.between(after, PeerSnapshot.of(after.peers, own))


# -- dual stack: the peers' IPv6 parts ------------------------------------------------------
NET6 = IPv6Network("fc00:66::/56")


def lease6(subnet: str, ip: str, part: str | None, forwards: bool = True,
           pub6: str | None = None) -> Lease:
    return Lease(IPv4Network(subnet), LeaseAttrs(IPv4Address(ip), forwards_ipv6=forwards,
                                                 public_ipv6=IPv6Address(pub6) if pub6 else None),
                 ipv6_subnet=IPv6Network(part) if part else None)


def apply(table: dict, removed, added) -> dict:
    """The kept table's update (engine/route_array.py, engine/pytable.py) as a dict: removed
    subnets go (one with no route is ignored), then added routes replace by subnet."""
    table = dict(table)
    for subnet in removed:
        table.pop(subnet, None)
    for r in added:
        table[r.subnet] = r
    return table


def as_dict(routes) -> dict:
    return {r.subnet: r for r in routes}


def test_ipv6_parts_are_routes_only_when_marked_and_inside_the_network(caplog):
    caplog.set_level(logging.INFO)
    parts = Ipv6Parts(NET6, own6=IPv6Network("fc00:66:0:1::/64"))
    leases = [lease6("10.5.2.0/24", "192.168.77.2", "fc00:66:0:2::/64"),
              lease6("10.5.3.0/24", "192.168.77.3", "fc00:66:0:3::/64", forwards=False),  # flanneld
              lease6("10.5.4.0/24", "192.168.77.4", "fc00:99:0:4::/64"),      # outside
              lease6("10.5.5.0/24", "192.168.77.5", "fc00:66::/48"),           # wider than it
              lease6("10.5.6.0/24", "192.168.77.6", "fc00:66:0:1::/64"),       # ours
              lease6("10.5.7.0/24", "192.168.77.7", None)]                     # v4-only key
    routes = route_table(PeerSnapshot.of(leases, IPv4Network(OWN)), 8285, parts)
    v4 = [r for r in routes if r.subnet.version == 4]
    assert len(v4) == 6, "a part that is no route costs that part only"
    assert [r for r in routes if r.subnet.version == 6] == [
        route("fc00:66:0:2::/64", "192.168.77.2", 8285)]
    said = [r.getMessage() for r in caplog.records]
    assert any("10.5.3.0/24" in m and "ForwardsIPv6" in m for m in said)
    assert any("10.5.4.0/24" in m and "outside the IPv6Network" in m for m in said)
    assert any("10.5.5.0/24" in m and "outside the IPv6Network" in m for m in said)
    assert any("10.5.6.0/24" in m and "own IPv6 part" in m for m in said)
    n = len(caplog.records)
    route_table(PeerSnapshot.of(leases, IPv4Network(OWN)), 8285, parts)
    assert len(caplog.records) == n, "said once"
    # IPv6 off in our config: no IPv6 route at all
    assert all(r.subnet.version == 4 for r in route_table(
        PeerSnapshot.of(leases, IPv4Network(OWN)), 8285, Ipv6Parts(None)))


def test_a_reshaped_key_with_the_same_value_is_a_change():
    """The IPv6 part alone changed (same IPv4 subnet, same value bytes): the peer is added
    again, its old part's route goes, the new one comes."""
    parts = Ipv6Parts(NET6)
    old = lease6("10.5.2.0/24", "192.168.77.2", "fc00:66:0:2::/64")
    new = lease6("10.5.2.0/24", "192.168.77.2", "fc00:66:0:9::/64")
    assert old.attrs == new.attrs
    before, after = PeerSnapshot.of([old], None), PeerSnapshot.of([new], None)
    change = PeerChange.between(before, after)
    assert change.added == (new,) and not change.removed
    removed, added = route_changes(change, 8285, parts, before=before)
    table = apply(as_dict(route_table(before, 8285, parts)), removed, added)
    assert table == as_dict(route_table(after, 8285, parts))
    assert IPv6Network("fc00:66:0:2::/64") not in table and IPv6Network("fc00:66:0:9::/64") in table


@pytest.mark.parametrize("public6", [None, "fd00:99::1"], ids=["ipv4-underlay", "ipv6-underlay"])
def test_route_changes_keep_a_dual_stack_table_equal_to_the_snapshots(public6):
    """Snapshot after snapshot (peers come, go, gain, lose and move their IPv6 part, lose
    their mark, gain, lose and change their PublicIPv6), the kept table stays
    route_table(snapshot), underlay and MTU included."""
    import random
    rng = random.Random(37)
    parts = Ipv6Parts(NET6, public6=IPv6Address(public6) if public6 else None, mtu6=1452)
    snap = PeerSnapshot.of([], IPv4Network(OWN))
    table: dict = {}
    for _ in range(300):
        peers = dict(snap.peers)
        for _ in range(rng.randint(1, 4)):
            i = rng.randint(2, 12)
            subnet = f"10.5.{i}.0/24"
            roll = rng.random()
            if roll < 0.25:
                peers.pop(IPv4Network(subnet), None)
                continue
            part = (None if roll < 0.35 else
                    f"fc00:99:0:{i}::/64" if roll < 0.4 else
                    # the allocator never gives a part twice: each subnet draws from its own
                    f"fc00:66:0:{i * 16 + rng.randint(0, 3):x}::/64")
            pub6 = rng.choice([None, None, f"fd00:99::{rng.randint(2, 5)}", "fe80::1",
                               f"fc00:66::{i}"])
            peers[IPv4Network(subnet)] = lease6(subnet, f"192.168.77.{rng.randint(2, 5)}", part,
                                                forwards=rng.random() < 0.8, pub6=pub6)
        after = PeerSnapshot.of(peers, IPv4Network(OWN))
        change = PeerChange.between(snap, after)
        table = apply(table, *route_changes(change, 8285, parts, before=snap))
        assert table == as_dict(route_table(after, 8285, parts))
        snap = after


def test_ipv6_parts_go_over_ipv6_when_both_hosts_have_a_public_ipv6(caplog):
    """The IPv6 underlay (docs/operating.md#dual-stack): a part goes to the peer's PublicIPv6
    with the inner MTU over IPv6 when we have one too; else, or when the peer's address cannot
    carry the overlay (said once), IPv4-mapped to its PublicIP at flannel0's MTU (0)."""
    caplog.set_level(logging.INFO)
    leases = [lease6("10.5.2.0/24", "192.168.77.2", "fc00:66:0:2::/64", pub6="fd00:99::2"),
              lease6("10.5.3.0/24", "192.168.77.3", "fc00:66:0:3::/64"),             # no v6
              lease6("10.5.4.0/24", "192.168.77.4", "fc00:66:0:4::/64", pub6="fc00:66::4"),
              lease6("10.5.5.0/24", "192.168.77.5", "fc00:66:0:5::/64", pub6="fd00:99::1")]
    snap = PeerSnapshot.of(leases, IPv4Network(OWN))
    ours = Ipv6Parts(NET6, public6=IPv6Address("fd00:99::1"), mtu6=1452)
    six = {str(r.subnet): r for r in route_table(snap, 8285, ours) if r.subnet.version == 6}
    assert six["fc00:66:0:2::/64"] == route("fc00:66:0:2::/64", "fd00:99::2", 8285, mtu=1452)
    for i in (3, 4, 5):
        assert six[f"fc00:66:0:{i}::/64"] == route(f"fc00:66:0:{i}::/64", f"192.168.77.{i}",
                                                        8285)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("10.5.4.0/24" in m and "inside the IPv6Network" in m for m in said), said
    assert any("10.5.5.0/24" in m and "this host's own" in m for m in said), said
    n = len(caplog.records)
    route_table(snap, 8285, ours)
    assert len(caplog.records) == n, "said once"
    # without an IPv6 underlay of our own, every part goes over IPv4
    plain = route_table(snap, 8285, Ipv6Parts(NET6))
    assert all(r.peer_ip.version == 4 or r.peer_ip.ipv4_mapped for r in plain)
    assert all(getattr(r, "mtu", 0) == 0 for r in plain)
    # the peer's PublicIPv6 alone changes: a change, and its part moves underlay
    after = PeerSnapshot.of([lease6("10.5.2.0/24", "192.168.77.2", "fc00:66:0:2::/64")]
                            + leases[1:], IPv4Network(OWN))
    change = PeerChange.between(snap, after)
    assert [str(l.subnet) for l in change.added] == ["10.5.2.0/24"]
    removed, added = route_changes(change, 8285, ours, before=snap)
    assert route("fc00:66:0:2::/64", "192.168.77.2", 8285) in added
