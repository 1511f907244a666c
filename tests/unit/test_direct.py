"""DirectRouting's decisions (control/direct.py) and what the lease and the config carry of it,
with a fake of the kernel's on-link answer."""
from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from dataplane.control.config import ConfigError, parse_config
from dataplane.control.direct import DirectRouting
from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.control.peerset import PeerChange, PeerSnapshot
from dataplane.control.routes import route_changes

OWN = IPv4Network("10.5.1.0/24")
ON_LINK = {IPv4Address("192.168.77.2"), IPv4Address("192.168.77.3")}


def lease(n: int, ip: str, direct: bool = True) -> Lease:
    return Lease(IPv4Network(f"10.5.{n}.0/24"), LeaseAttrs(IPv4Address(ip), direct_routing=direct))


def routing(enabled=True, on_link=ON_LINK):
    return DirectRouting(enabled, lambda ip: ip in on_link)


def first(dr, leases):
    snap = PeerSnapshot.of(leases, OWN)
    return dr.apply(PeerChange.between(PeerSnapshot(OWN), snap), PeerSnapshot(OWN))


def test_only_peers_on_the_link_that_route_directly_back_go_direct():
    dr = routing()
    a, b, c = lease(2, "192.168.77.2"), lease(3, "192.168.77.3", direct=False), \
        lease(4, "192.168.78.4")
    split = first(dr, [a, b, c])
    assert split.route == (a,) and split.unroute == ()
    assert set(split.engine.snapshot.peers) == {b.subnet, c.subnet}
    assert split.engine.added == (b, c)
    assert dr.mode(a.subnet) == "direct" and dr.mode(b.subnet) == "encapsulated"
    assert "no DirectRouting in its lease" in dr.why_not(b)
    assert "through a gateway" in dr.why_not(c)


def test_off_changes_nothing():
    dr = routing(enabled=False)
    leases = [lease(2, "192.168.77.2"), lease(3, "192.168.77.3")]
    change = PeerChange.between(PeerSnapshot(OWN), PeerSnapshot.of(leases, OWN))
    split = dr.apply(change, PeerSnapshot(OWN))
    assert split.engine is change and split.route == () and split.unroute == ()


def test_a_peer_that_loses_directrouting_comes_back_to_the_engine_before_its_route_goes():
    dr = routing()
    a = lease(2, "192.168.77.2")
    split = first(dr, [a])
    engine = split.engine.snapshot
    b = lease(2, "192.168.77.2", direct=False)            # flanneld took the lease over
    after = PeerSnapshot.of([b], OWN)
    split = dr.apply(PeerChange.between(PeerSnapshot.of([a], OWN), after), engine)
    assert split.unroute == (a,) and split.route == ()
    assert split.engine.added == (b,) and split.engine.removed == ()
    assert b.subnet in split.engine.snapshot.peers


def test_a_peer_that_goes_direct_leaves_the_engine_table():
    dr = routing(on_link=set())
    a = lease(2, "192.168.77.2")
    split = first(dr, [a])
    engine = split.engine.snapshot
    assert a.subnet in engine.peers
    dr.on_link = lambda ip: True                      # an address on its link appeared
    split = dr.reconsider(PeerSnapshot.of([a], OWN), engine)
    assert split.route == (a,) and split.engine.removed == (a,)
    assert split.engine.snapshot.peers == {}
    removed, added = route_changes(split.engine, 8285)
    assert removed == (a.subnet,) and added == ()
    assert dr.reconsider(PeerSnapshot.of([a], OWN), split.engine.snapshot).route == ()


def test_a_removed_direct_peer_loses_its_route_and_never_touches_the_engine():
    dr = routing()
    a, b = lease(2, "192.168.77.2"), lease(3, "192.168.78.3")
    split = first(dr, [a, b])
    before = PeerSnapshot.of([a, b], OWN)
    split = dr.apply(PeerChange.between(before, PeerSnapshot.of([b], OWN)), split.engine.snapshot)
    assert split.unroute == (a,) and split.engine.removed == () and split.engine.added == ()


def test_the_lease_value_says_directrouting_only_when_on():
    plain = LeaseAttrs(IPv4Address("192.168.77.2"))
    assert plain.to_json() == b'{"PublicIP":"192.168.77.2","PublicIPv6":null}'
    on = LeaseAttrs(IPv4Address("192.168.77.2"), direct_routing=True)
    assert on.to_json() == b'{"PublicIP":"192.168.77.2","PublicIPv6":null,"DirectRouting":true}'
    assert LeaseAttrs.from_json(on.to_json()) == on
    # Go's case-insensitive names; anything but JSON true is off
    assert LeaseAttrs.from_json(b'{"PublicIP":"1.2.3.4","directrouting":true}').direct_routing
    assert not LeaseAttrs.from_json(b'{"PublicIP":"1.2.3.4","DirectRouting":"yes"}').direct_routing


def test_a_lease_pickles_with_its_flag():
    import pickle
    a = lease(2, "192.168.77.2")
    assert pickle.loads(pickle.dumps(a)).attrs.direct_routing


@pytest.mark.parametrize("backend, want", [
    ({"Type": "udp"}, False),
    ({"Type": "udp", "DirectRouting": True}, True),
    ({"Type": "udp", "directrouting": False}, False),
    ({"Type": "udp", "DirectRouting": None}, False),
])
def test_the_config_reads_directrouting(backend, want):
    import json
    cfg = parse_config(json.dumps({"Network": "10.5.0.0/16", "Backend": backend}))
    assert cfg.direct_routing is want


def test_a_directrouting_that_is_no_bool_is_a_config_error():
    with pytest.raises(ConfigError, match="DirectRouting of type bool"):
        parse_config('{"Network":"10.5.0.0/16","Backend":{"Type":"udp","DirectRouting":"true"}}')
