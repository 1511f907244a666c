"""DirectRouting's decisions (control/direct.py) and what the lease and the config carry of it,
with a fake of the kernel's on-link answer; each family decided on its own."""
from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from dataplane.control.config import ConfigError, parse_config
from dataplane.control.direct import DirectRouting
from dataplane.host.family import V4, V6
from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.control.peerset import PeerChange, PeerSnapshot
from dataplane.control.routes import Ipv6Parts, route_changes

OWN = IPv4Network("10.5.1.0/24")
ON_LINK = {IPv4Address("192.168.77.2"), IPv4Address("192.168.77.3"),
           IPv6Address("fd77::2"), IPv6Address("fd77::3")}
NET6 = IPv6Network("fc00:5::/56")


def lease(n: int, ip: str, direct: bool = True) -> Lease:
    return Lease(IPv4Network(f"10.5.{n}.0/24"), LeaseAttrs(IPv4Address(ip), direct_routing=direct))


def lease6(n: int, ip: str, ip6: str | None, direct: bool = True, part: int | None = None,
           forwards: bool = True) -> Lease:
    """A dual-stack lease: its IPv6 part fc00:5:0:<part or n>::/64."""
    return Lease(IPv4Network(f"10.5.{n}.0/24"),
                 LeaseAttrs(IPv4Address(ip), IPv6Address(ip6) if ip6 else None,
                            direct_routing=direct, forwards_ipv6=forwards),
                 ipv6_subnet=IPv6Network(f"fc00:5:0:{part if part is not None else n:x}::/64"))


def routing(enabled=True, on_link=ON_LINK):
    parts = Ipv6Parts(NET6, IPv6Network("fc00:5:0:1::/64"))
    return DirectRouting(enabled, lambda ip: ip in on_link, ipv6_part=parts.why_not)


def first(dr, leases):
    snap = PeerSnapshot.of(leases, OWN)
    return dr.apply(PeerChange.between(PeerSnapshot(OWN), snap), PeerSnapshot(OWN))


def test_only_peers_on_the_link_that_route_directly_back_go_direct():
    dr = routing()
    a, b, c = lease(2, "192.168.77.2"), lease(3, "192.168.77.3", direct=False), \
        lease(4, "192.168.78.4")
    split = first(dr, [a, b, c])
    assert split.route[V4] == (a,) and split.unroute[V4] == ()
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
    assert split.engine is change and split.route[V4] == () and split.unroute[V4] == ()


def test_a_peer_that_loses_directrouting_comes_back_to_the_engine_before_its_route_goes():
    dr = routing()
    a = lease(2, "192.168.77.2")
    split = first(dr, [a])
    engine = split.engine.snapshot
    b = lease(2, "192.168.77.2", direct=False)            # flanneld took the lease over
    after = PeerSnapshot.of([b], OWN)
    split = dr.apply(PeerChange.between(PeerSnapshot.of([a], OWN), after), engine)
    assert split.unroute[V4] == (a,) and split.route[V4] == ()
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
    assert split.route[V4] == (a,) and split.engine.removed == (a,)
    assert split.engine.snapshot.peers == {}
    removed, added = route_changes(split.engine, 8285)
    assert removed == (a.subnet,) and added == ()
    assert dr.reconsider(PeerSnapshot.of([a], OWN), split.engine.snapshot).route[V4] == ()


def test_a_removed_direct_peer_loses_its_route_and_never_touches_the_engine():
    dr = routing()
    a, b = lease(2, "192.168.77.2"), lease(3, "192.168.78.3")
    split = first(dr, [a, b])
    before = PeerSnapshot.of([a, b], OWN)
    split = dr.apply(PeerChange.between(before, PeerSnapshot.of([b], OWN)), split.engine.snapshot)
    assert split.unroute[V4] == (a,) and split.engine.removed == () and split.engine.added == ()


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


def test_each_family_goes_direct_on_its_own_address():
    dr = routing()
    both = lease6(2, "192.168.77.2", "fd77::2")
    v4_only = lease6(3, "192.168.77.3", None)               # no PublicIPv6: IPv6 in the engine
    v6_only = lease6(4, "192.168.78.4", "fd77::3")          # PublicIP behind a gateway
    far = lease6(5, "192.168.78.5", "fd78::5")
    split = first(dr, [both, v4_only, v6_only, far])
    assert split.route[V4] == (both, v4_only) and split.route[V6] == (both, v6_only)
    assert split.unroute[V4] == split.unroute[V6] == ()
    # the engine's IPv4 share: the encapsulated subnets only
    assert set(split.engine.snapshot.peers) == {v6_only.subnet, far.subnet}
    assert dr.mode(v4_only.subnet) == "direct" and dr.mode(v4_only.subnet, V6) == "encapsulated"
    assert dr.mode(v6_only.subnet) == "encapsulated" and dr.mode(v6_only.subnet, V6) == "direct"
    assert dr.why_not(v4_only, V6) == "its lease has no PublicIPv6"
    assert "its PublicIPv6 fd78::5 is reached through a gateway" in dr.why_not(far, V6)
    assert "its PublicIP 192.168.78.5 is reached through a gateway" in dr.why_not(far)


def test_an_ipv6_part_the_engines_would_not_route_never_goes_direct():
    dr = routing()
    unmarked = lease6(2, "192.168.77.2", "fd77::2", forwards=False)    # flanneld's udp
    outside = replace(lease6(3, "192.168.77.3", "fd77::3"),
                      ipv6_subnet=IPv6Network("fc00:6::/64"))
    ours = lease6(4, "192.168.77.2", "fd77::2", part=1)
    no_flag = lease6(5, "192.168.77.3", "fd77::3", direct=False)
    split = first(dr, [unmarked, outside, ours, no_flag])
    assert split.route[V6] == () and dr.direct[V6] == {}
    assert "ForwardsIPv6" in dr.why_not(unmarked, V6)
    assert "outside the IPv6Network" in dr.why_not(outside, V6)
    assert "overlaps this host's own IPv6 part" in dr.why_not(ours, V6)
    assert "no DirectRouting in its lease" in dr.why_not(no_flag, V6)
    assert routing(enabled=False).why_not(lease6(2, "192.168.77.2", "fd77::2"), V6) \
        == "DirectRouting is off in the network config"
    # a DirectRouting made without IPv6 (an IPv4-only config) routes no part
    assert "IPv6 is off" in DirectRouting(True, lambda ip: True).why_not(unmarked, V6)


def test_reconsidering_flips_one_family_and_leaves_the_other():
    on_link = set(ON_LINK) - {IPv6Address("fd77::2")}
    dr = routing(on_link=on_link)
    a = lease6(2, "192.168.77.2", "fd77::2")
    split = first(dr, [a])
    assert split.route[V4] == (a,) and split.route[V6] == ()
    snap, engine = PeerSnapshot.of([a], OWN), split.engine.snapshot
    on_link.add(IPv6Address("fd77::2"))                 # an IPv6 prefix of the link appeared
    split = dr.reconsider(snap, engine)
    assert split.route[V6] == (a,) and split.route[V4] == split.unroute[V4] == split.unroute[V6] == ()
    assert not split.engine                             # nothing for the engine's IPv4 share
    on_link.discard(IPv4Address("192.168.77.2"))        # IPv4 goes through a gateway now
    split = dr.reconsider(snap, split.engine.snapshot)
    assert split.unroute[V4] == (a,) and split.engine.added == (a,)
    assert split.route[V6] == split.unroute[V6] == ()
    assert dr.mode(a.subnet) == "encapsulated" and dr.mode(a.subnet, V6) == "direct"


def test_a_moved_ipv6_part_loses_its_old_route_and_a_gone_peer_both():
    dr = routing()
    a = lease6(2, "192.168.77.2", "fd77::2")
    split = first(dr, [a])
    before = PeerSnapshot.of([a], OWN)
    moved = lease6(2, "192.168.77.2", "fd77::2", part=9)       # the same IPv4 subnet, reshaped
    after = PeerSnapshot.of([moved], OWN)
    split = dr.apply(PeerChange.between(before, after), split.engine.snapshot)
    assert split.unroute[V6] == (a,) and split.route[V6] == (moved,)
    # the IPv4 subnet is routed again (a replace: its PublicIP may have changed)
    assert split.route[V4] == (moved,) and split.unroute[V4] == ()
    new_ip = replace(moved, attrs=replace(moved.attrs, public_ipv6=IPv6Address("fd77::3")))
    split = dr.apply(PeerChange.between(after, PeerSnapshot.of([new_ip], OWN)),
                     split.engine.snapshot)
    assert split.route[V6] == (new_ip,) and split.unroute[V6] == ()      # a replace of the same part
    gone = dr.apply(PeerChange.between(PeerSnapshot.of([new_ip], OWN), PeerSnapshot(OWN)),
                    split.engine.snapshot)
    assert gone.unroute[V4] == (new_ip,) and gone.unroute[V6] == (new_ip,)
    assert dr.direct[V4] == dr.direct[V6] == {}
    # a PublicIPv6 that went from the lease takes the part back to the engine
    dr = routing()
    first(dr, [a])
    bare = lease6(2, "192.168.77.2", None)
    split = dr.apply(PeerChange.between(before, PeerSnapshot.of([bare], OWN)), PeerSnapshot(OWN))
    assert split.unroute[V6] == (a,) and split.route[V6] == () and split.route[V4] == (bare,)


def test_a_change_asks_the_kernel_once_for_all_its_peers_addresses():
    """With on_link_all, a listing of thousands asks in one batch, not per peer."""
    asked = []

    def on_link_all(ips):
        asked.append(list(ips))
        return {ip for ip in ips if ip in ON_LINK}

    parts = Ipv6Parts(NET6, IPv6Network("fc00:5:0:1::/64"))
    dr = DirectRouting(True, lambda ip: pytest.fail(f"{ip} asked on its own"),
                       ipv6_part=parts.why_not, on_link_all=on_link_all)
    both, far, flat = lease6(2, "192.168.77.2", "fd77::2"), lease(4, "192.168.78.4"), \
        lease(5, "192.168.77.3", direct=False)
    split = first(dr, [both, far, flat])
    assert len(asked) == 1 and set(asked[0]) == {both.public_ip, IPv6Address("fd77::2"),
                                                 far.public_ip}
    assert split.route[V4] == (both,) and split.route[V6] == (both,)
    assert dr.reconsider(PeerSnapshot.of([both, far, flat], OWN), split.engine.snapshot) \
        .route[V4] == () and len(asked) == 2


def test_a_peer_whose_route_the_kernel_refused_goes_through_the_engine_and_is_tried_again():
    dr = routing()
    a, b = lease(2, "192.168.77.2"), lease(3, "192.168.77.3")
    split = first(dr, [a, b])
    assert split.route[V4] == (a, b) and split.engine.added == ()
    split = dr.refused(split, V4, {b.subnet}, PeerSnapshot(OWN))
    assert split.route[V4] == (a,)
    assert split.engine.added == (b,) and set(split.engine.snapshot.peers) == {b.subnet}
    assert dr.mode(a.subnet) == "direct" and dr.mode(b.subnet) == "encapsulated"
    # the host's routes change: b is decided again, and goes direct
    again = dr.reconsider(PeerSnapshot.of([a, b], OWN),
                          split.engine.snapshot)
    assert again.route[V4] == (b,) and again.engine.removed == (b,)
    assert dr.mode(b.subnet) == "direct"
