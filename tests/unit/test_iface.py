"""External interface selection with flanneld's rules, against a fake netlink view (no root)."""
from __future__ import annotations

import ipaddress

import pytest

from dataplane.host.iface import (IfaceError, Link, NetlinkView, StaticView, is_global_unicast,
                             select_interface)

LINKS = [
    Link("lo", 1, 65536, ("127.0.0.1",)),
    Link("eth0", 2, 1500, ("169.254.1.1", "10.0.0.5", "10.0.0.6")),
    Link("eth1", 3, 9000, ("192.168.77.3",)),
    Link("enp5s0", 4, 1400, ()),
    Link("zero", 5, 0, ("172.16.0.1",)),
]


def view(default=2, routes=None):
    return StaticView(LINKS, default, routes or {"8.8.8.8": (3, "192.168.77.3")})


def pick(**kw):
    v = kw.pop("v", None) or view()
    return select_interface(view=v, **kw)


def test_default_route_interface_and_first_global_address():
    e = pick()
    assert (e.name, str(e.iface_addr), str(e.ext_addr), e.mtu, e.tun_mtu) == \
        ("eth0", "10.0.0.5", "10.0.0.5", 1500, 1472)


def test_no_default_route_is_an_error():
    with pytest.raises(IfaceError, match="default route"):
        pick(v=view(default=None))


def test_public_ip_alone_selects_its_interface():
    e = pick(public_ip="192.168.77.3")
    assert e.name == "eth1" and str(e.ext_addr) == "192.168.77.3"


def test_public_ip_overrides_ext_addr_only():
    e = pick(ifaces=["eth1"], public_ip="203.0.113.9")
    assert str(e.iface_addr) == "192.168.77.3" and str(e.ext_addr) == "203.0.113.9"


def test_iface_by_ip_uses_that_address():
    e = pick(ifaces=["10.0.0.6"])
    assert e.name == "eth0" and str(e.iface_addr) == "10.0.0.6"


def test_iface_first_match_wins():
    e = pick(ifaces=["nosuch", "eth1", "eth0"])
    assert e.name == "eth1"


def test_iface_without_ipv4_is_skipped_for_next():
    e = pick(ifaces=["enp5s0", "eth0"])
    assert e.name == "eth0"


def test_iface_mtu_zero_rejected():
    with pytest.raises(IfaceError, match="MTU"):
        pick(ifaces=["zero"])


def test_regex_matches_ips_before_names():
    # "1" occurs in eth1's name and in many addresses; the IP walk comes first: lo's 127.0.0.1
    e = pick(regexes=[r"^192\.168"])
    assert e.name == "eth1" and str(e.iface_addr) == "192.168.77.3"
    e = pick(regexes=[r"^eth1$"])
    assert e.name == "eth1"
    e = pick(regexes=["1"])
    assert e.name == "lo"


def test_regex_after_ifaces_then_can_reach():
    e = pick(ifaces=["nosuch"], regexes=["^nomatch$", "^eth0$"])
    assert e.name == "eth0"
    e = pick(ifaces=["nosuch"], regexes=["^nomatch$"], can_reach="8.8.8.8")
    assert e.name == "eth1" and str(e.iface_addr) == "192.168.77.3"


def test_nothing_matches_lists_what_exists():
    with pytest.raises(IfaceError) as ei:
        pick(ifaces=["nosuch"], regexes=["^nomatch$"])
    msg = str(ei.value)
    assert "nosuch" in msg and "nomatch" in msg and "eth1:192.168.77.3" in msg


def test_can_reach_unroutable():
    with pytest.raises(IfaceError, match="9.9.9.9"):
        pick(can_reach="9.9.9.9")


@pytest.mark.parametrize("ip,ok", [("10.1.2.3", True), ("192.168.1.1", True), ("8.8.8.8", True),
                                   ("127.0.0.1", False), ("169.254.3.4", False),
                                   ("224.0.0.1", False), ("0.0.0.0", False),
                                   ("255.255.255.255", False)])
def test_global_unicast_like_go(ip, ok):
    assert is_global_unicast(ip) is ok


def test_real_netlink_view_reads_this_host():
    """Reading links and routes needs no root; the result must be self-consistent: the
    interface picked is the default route's, and with no default route the choice fails
    saying so (as with the fake view above), so every host checks something."""
    with NetlinkView() as v:
        links = v.links()
        assert any(l.name == "lo" for l in links)
        idx = v.default_route_ifindex()
    if idx is None:
        with pytest.raises(IfaceError, match="default route"):
            select_interface()
        return
    e = select_interface()
    assert e.index == idx and ipaddress.IPv4Address(e.iface_addr)
