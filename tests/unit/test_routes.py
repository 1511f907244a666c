"""The route step (control/routes.py) over the peer snapshot (control/peerset.py): peer leases -> routes."""
from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.control.peerset import PeerChange, PeerSnapshot
from dataplane.control.routes import route_table
from dataplane.engine import Route

OWN = "10.5.1.0/24"


def lease(subnet: str, ip: str) -> Lease:
    return Lease(IPv4Network(subnet), LeaseAttrs(IPv4Address(ip)))


def route(subnet: str, ip: str, port: int) -> Route:
    return Route.make(subnet, ip, port)


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
