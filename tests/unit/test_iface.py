"""External interface selection with flanneld's rules, against a fake netlink view (no root)
(docs/flannel-compat.md#interface)."""
from __future__ import annotations

import ipaddress

import pytest

from dataplane.host.iface import (IFA_F_DEPRECATED, IFA_F_PERMANENT, IFA_F_SECONDARY, Addr, IfaceError,
                                  Link, NetlinkView, StaticView, is_global_unicast, select_interface,
                                  usable_ipv4s)

DYNAMIC = 0                              # a DHCP lease's address: IFA_F_PERMANENT clear
STATIC = IFA_F_PERMANENT

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
    # "1" occurs in eth1's name and in many addresses; the IP walk comes first, over usable
    # addresses only: lo's 127.0.0.1 is none, eth0's first in preference order is 10.0.0.5
    e = pick(regexes=[r"^192\.168"])
    assert e.name == "eth1" and str(e.iface_addr) == "192.168.77.3"
    e = pick(regexes=[r"^eth1$"])
    assert e.name == "eth1"
    e = pick(regexes=["1"])
    assert e.name == "eth0" and str(e.iface_addr) == "10.0.0.5"
    with pytest.raises(IfaceError, match="could not match pattern"):
        pick(regexes=[r"^127\."])            # lo's loopback address is no candidate


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


# -- the address as flanneld v0.28.9 orders an interface's addresses ---------------------------------
def one(*addrs, **kw):
    """The address chosen on a single default-route interface holding ``addrs`` in kernel order."""
    v = StaticView([Link("eth0", 2, 1500, tuple(addrs))], 2)
    return str(select_interface(view=v, **kw).iface_addr)


def test_plain_strings_are_permanent():
    assert Link("x", 1, 1500, ("10.0.0.1",)).addrs == (Addr("10.0.0.1", IFA_F_PERMANENT),)


def test_permanent_before_dynamic_whatever_the_kernel_order():
    assert one(Addr("10.1.0.5", DYNAMIC), Addr("10.2.0.5", STATIC)) == "10.2.0.5"
    assert one(Addr("10.2.0.5", STATIC), Addr("10.1.0.5", DYNAMIC)) == "10.2.0.5"


def test_global_before_link_local_even_when_only_the_link_local_is_permanent():
    assert one(Addr("169.254.7.7", STATIC), Addr("10.1.0.5", DYNAMIC)) == "10.1.0.5"


def test_link_local_when_nothing_global():
    """flanneld falls back to a link-local address rather than fail."""
    assert one("169.254.7.7") == "169.254.7.7"
    assert one(Addr("169.254.7.7", DYNAMIC), "127.0.0.2") == "169.254.7.7"


def test_non_temporary_before_temporary():
    # for IPv4 the "temporary" bit is the kernel's secondary flag: a second address in a subnet
    assert one(Addr("10.1.0.5", STATIC | IFA_F_SECONDARY), Addr("10.1.0.6", STATIC)) == "10.1.0.6"
    assert one(Addr("10.1.0.5", DYNAMIC), Addr("10.1.0.6", DYNAMIC | IFA_F_SECONDARY)) == "10.1.0.5"


def test_permanent_outranks_the_secondary_bit():
    assert one(Addr("10.1.0.5", DYNAMIC), Addr("10.1.0.6", STATIC | IFA_F_SECONDARY)) == "10.1.0.6"


def test_ties_keep_kernel_order():
    assert one("10.0.0.9", "10.0.0.3") == "10.0.0.9"
    assert one(Addr("10.0.0.9", DYNAMIC), Addr("10.0.0.3", DYNAMIC)) == "10.0.0.9"
    link = Link("eth0", 2, 1500, tuple(f"10.0.{i}.1" for i in range(12)))
    assert [str(a) for a in usable_ipv4s(link)] == [f"10.0.{i}.1" for i in range(12)]


def test_deprecated_is_skipped():
    assert one(Addr("10.2.0.5", STATIC | IFA_F_DEPRECATED), Addr("10.1.0.5", DYNAMIC)) == "10.1.0.5"
    with pytest.raises(IfaceError, match="failed to find an IPv4 address for interface eth0"):
        one(Addr("10.2.0.5", DYNAMIC | IFA_F_DEPRECATED))


def test_full_order_of_every_rule():
    link = Link("eth0", 2, 1500, (
        Addr("169.254.1.1", DYNAMIC), Addr("10.0.0.4", DYNAMIC | IFA_F_SECONDARY),
        Addr("10.0.0.3", DYNAMIC), Addr("10.0.0.2", STATIC | IFA_F_SECONDARY),
        Addr("10.0.0.9", STATIC | IFA_F_DEPRECATED), Addr("169.254.1.2", STATIC),
        Addr("10.0.0.1", STATIC)))
    assert [str(a) for a in usable_ipv4s(link)] == [
        "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "169.254.1.2", "169.254.1.1"]


def test_flanneld_sort_steps_with_an_address_neither_global_nor_link_local():
    """flanneld's comparison says nothing of 127.x against a link-local address and puts it before a
    dynamic global one, so sorted by insertion, as flanneld sorts few addresses, the link-local
    address stays first."""
    assert one(Addr("169.254.1.1", STATIC), Addr("127.0.0.2", STATIC),
               Addr("10.1.0.5", DYNAMIC)) == "169.254.1.1"


def test_every_rule_that_picks_an_address_uses_the_order():
    static, dhcp = Addr("192.168.9.9", STATIC), Addr("10.1.0.5", DYNAMIC)
    v = StaticView([Link("lo", 1, 65536, ("127.0.0.1",)), Link("eth0", 2, 1500, (dhcp, static))], 2,
                   {"8.8.8.8": (2, None), "9.9.9.9": (2, "10.1.0.5")})
    chosen = [select_interface(view=v, **kw) for kw in (
        {}, {"ifaces": ["eth0"]}, {"regexes": ["^eth"]}, {"regexes": [r"\."]},
        {"can_reach": "8.8.8.8"})]
    assert [str(e.iface_addr) for e in chosen] == ["192.168.9.9"] * 5
    assert all(e.ext_addr == e.iface_addr for e in chosen)
    # an address named by IP is kept, whatever its flags; so is the source of the route
    assert str(select_interface(view=v, ifaces=["10.1.0.5"]).iface_addr) == "10.1.0.5"
    assert str(select_interface(view=v, public_ip="10.1.0.5").iface_addr) == "10.1.0.5"
    assert str(select_interface(view=v, can_reach="9.9.9.9").iface_addr) == "10.1.0.5"
    # the regex is matched against the usable addresses in their order: the DHCP one when only
    # it matches
    assert str(select_interface(view=v, regexes=[r"^10\."]).iface_addr) == "10.1.0.5"


def test_deprecated_address_by_ip_is_still_found():
    v = StaticView([Link("eth0", 2, 1500, (Addr("10.1.0.5", DYNAMIC | IFA_F_DEPRECATED),
                                           "10.2.0.5"))], 2)
    assert str(select_interface(view=v, ifaces=["10.1.0.5"]).iface_addr) == "10.1.0.5"
    with pytest.raises(IfaceError):
        select_interface(view=v, regexes=[r"^10\.1\."])       # not a candidate for a regex


def test_real_netlink_view_reads_flags():
    """Every address read from this host carries its flags; lo's 127.0.0.1 is permanent."""
    with NetlinkView() as v:
        lo = next(l for l in v.links() if l.name == "lo")
    assert all(isinstance(a, Addr) for a in lo.addrs)
    assert any(str(a) == "127.0.0.1" and a.flags & IFA_F_PERMANENT for a in lo.addrs)


# -- the IPv6 underlay's address (docs/operating.md#dual-stack) ------------------------------
from dataplane.host.iface import ENCAP_OVERHEAD6, preferred_ipv6, underlay6  # noqa: E402

LINKS6 = [
    Link("eth0", 2, 1500, ("10.0.0.5",),
         (Addr("fe80::5", STATIC), Addr("2001:db8::dead", IFA_F_SECONDARY),   # temporary
          Addr("2001:db8::d", DYNAMIC), Addr("2001:db8::beef", IFA_F_DEPRECATED | STATIC),
          Addr("fd00:99::5", STATIC))),
    Link("eth1", 3, 1500, ("192.168.77.3",), ("fe80::3",)),
    Link("eth2", 4, 1500, ("192.168.78.3",), ("::ffff:10.1.1.1", "2001:db8:2::2")),
]


def test_the_ipv6_underlay_address_is_flanneld_order_global_only():
    """flanneld's order for IPv6 (permanent before dynamic, non-temporary before temporary,
    deprecated out); a link-local address is never it (it names no peer without a scope), nor
    an IPv4-mapped one."""
    eth0, eth1, eth2 = LINKS6
    assert str(preferred_ipv6(eth0)) == "fd00:99::5"
    assert preferred_ipv6(eth1) is None
    assert str(preferred_ipv6(eth2)) == "2001:db8:2::2"
    e = select_interface(view=StaticView(LINKS6, 2))
    assert str(e.iface_addr6) == "fd00:99::5" and e.mtu - ENCAP_OVERHEAD6 == 1452
    assert select_interface(view=StaticView(LINKS6, 3)).iface_addr6 is None


def test_public_ipv6_is_bound_when_held_else_the_interface_address():
    e = select_interface(view=StaticView(LINKS6, 2))
    assert tuple(map(str, underlay6(e))) == ("fd00:99::5", "fd00:99::5")
    # held by the interface, though not its first: bound as given
    assert tuple(map(str, underlay6(e, "2001:db8::d"))) == ("2001:db8::d", "2001:db8::d")
    # not held (a NATed address, as --public-ip): written in the lease, the own one bound
    assert tuple(map(str, underlay6(e, "2001:db8:9::9"))) == ("2001:db8:9::9", "fd00:99::5")
    bare = select_interface(view=StaticView(LINKS6, 3))
    assert underlay6(bare) == (None, None)
    pub, bind = underlay6(bare, "2001:db8:9::9")
    assert str(pub) == "2001:db8:9::9" and bind is None
    with pytest.raises(IfaceError, match="--public-ipv6 fe80::1 is not a global unicast"):
        underlay6(e, "fe80::1")
