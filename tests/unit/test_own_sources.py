"""host/own_sources.py: what the engine is told of this host's own sources, and when (no
root: a fake engine and a fake netlink)."""
from __future__ import annotations

import ipaddress

from dataplane.host.own_sources import OwnSources

NET = ipaddress.IPv4Network("10.5.1.0/24")
OTHER = ipaddress.IPv4Network("10.5.9.0/24")


class FakeEngine:
    def __init__(self):
        self.told = []

    def set_local(self, own_subnets, addrs):
        subnet, own_subnet6 = (next((n for n in own_subnets if n.version == v), None)
                               for v in (4, 6))
        self.told.append((subnet, list(addrs)) if own_subnet6 is None
                         else (subnet, list(addrs), own_subnet6))


class FakeNetlink:
    def __init__(self, *addrs):
        self.addrs = [ipaddress.ip_address(a) for a in addrs]
        self.error = None

    def __call__(self):
        if self.error:
            raise self.error
        return list(self.addrs)


def ips(*a):
    return [ipaddress.IPv4Address(x) for x in a]


def test_a_new_engine_is_told_then_only_changes():
    nl = FakeNetlink("192.168.50.2", "10.5.1.0", "192.168.50.2")
    own, e = OwnSources(nl), FakeEngine()
    assert own.refresh(e, [NET]) is True
    assert e.told == [(NET, ips("10.5.1.0", "192.168.50.2"))]      # sorted, once each
    assert own.refresh(e, [NET]) is False
    nl.addrs.append(ipaddress.IPv4Address("172.17.0.1"))           # a bridge came up
    assert own.refresh(e, [NET]) is True
    assert e.told[-1] == (NET, ips("10.5.1.0", "172.17.0.1", "192.168.50.2"))
    assert own.refresh(e, [OTHER]) is True                          # the lease moved
    assert e.told[-1][0] == OTHER and len(e.told) == 3


def test_a_replaced_engine_is_told_again():
    nl = FakeNetlink("192.168.50.2")
    own, first, second = OwnSources(nl), FakeEngine(), FakeEngine()
    own.refresh(first, [NET])
    assert own.refresh(second, [NET]) is True
    assert second.told == first.told


def test_netlink_failing_keeps_the_last_addresses(caplog):
    nl = FakeNetlink("192.168.50.2")
    own, e = OwnSources(nl), FakeEngine()
    own.refresh(e, [NET])
    nl.error = OSError(105, "No buffer space available")
    assert own.refresh(e, [NET]) is False and own.refresh(e, [NET]) is False
    assert e.told == [(NET, ips("192.168.50.2"))]
    assert sum("cannot list this host's addresses" in r.message for r in caplog.records) == 1
    fresh = FakeEngine()
    own.refresh(fresh, [NET])
    assert fresh.told == [(NET, ips("192.168.50.2"))]


def test_netlink_failing_from_the_start_leaves_the_subnet():
    nl = FakeNetlink()
    nl.error = OSError(1, "Operation not permitted")
    own, e = OwnSources(nl), FakeEngine()
    assert own.refresh(e, [NET]) is True
    assert e.told == [(NET, [])]


def test_dual_stack_addresses_and_the_ipv6_part_are_told():
    """Both families' addresses, IPv4 first (they do not compare), and the lease's IPv6 part;
    a reshape that changes only the IPv6 part tells the engine again."""
    net6 = ipaddress.IPv6Network("fc00:66:0:62::/64")
    nl = FakeNetlink("fc00:66:0:62::", "192.168.50.2", "2001:db8::7", "10.5.1.0")
    own, e = OwnSources(nl), FakeEngine()
    assert own.refresh(e, [NET, net6]) is True
    assert e.told == [(NET, [ipaddress.ip_address(a) for a in
                             ("10.5.1.0", "192.168.50.2", "2001:db8::7", "fc00:66:0:62::")], net6)]
    assert own.refresh(e, [NET, net6]) is False
    assert own.refresh(e, [NET, ipaddress.IPv6Network("fc00:66:0:63::/64")]) is True
    assert e.told[-1][2] == ipaddress.IPv6Network("fc00:66:0:63::/64")
