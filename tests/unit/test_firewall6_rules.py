"""The IPv6 rules of a dual-stack host (EnableIPv6), built without touching the host: what
ip6tables and the table ``ip6 flannel-ipv6`` are given, which tool is chosen, what a missing
tool says, and how both families' rules follow a lease move (docs/flannel-compat.md#iptables)."""
from __future__ import annotations

import ipaddress
import logging
import shutil
from types import SimpleNamespace

import pytest

from dataplane.host import firewall, firewall_stack
from dataplane.host.family import V4, V6, Part
from dataplane.host.firewall_nft import nft_ruleset
from dataplane.host.firewall_rules import (NAT, forward_rules, in_chain, masq_rules,
                                           removal_commands, restore_text)
from dataplane.host.firewall_tools import MasqError

NET, SUB = "10.5.0.0/16", "10.5.3.0/24"
NET6, SUB6 = "fc00:5::/56", "fc00:5:0:3::/64"
DUAL = [Part(NET, SUB), Part(NET6, SUB6)]
C = ["-m", "comment", "--comment", "flanneld masq"]


def test_ipv6_masquerade_is_the_ipv4_order_with_ipv6_multicast_left_alone():
    rf = ["-j", "MASQUERADE", "--random-fully"]
    assert masq_rules(NET6, SUB6) == [
        ("nat", "POSTROUTING", C + ["-j", "FLANNEL-POSTRTG"]),
        ("nat", "FLANNEL-POSTRTG", ["-m", "mark", "--mark", "0x4000/0x4000"] + C + ["-j", "RETURN"]),
        ("nat", "FLANNEL-POSTRTG", ["-s", SUB6, "-d", NET6] + C + ["-j", "RETURN"]),
        ("nat", "FLANNEL-POSTRTG", ["-s", NET6, "-d", SUB6] + C + ["-j", "RETURN"]),
        ("nat", "FLANNEL-POSTRTG", ["!", "-s", NET6, "-d", SUB6] + C + ["-j", "RETURN"]),
        ("nat", "FLANNEL-POSTRTG", ["-s", NET6, "!", "-d", "ff00::/8"] + C + rf),
        ("nat", "FLANNEL-POSTRTG", ["!", "-s", NET6, "-d", NET6] + C + rf),
    ]
    assert [r[2][:2] for r in forward_rules(NET6)[1:]] == [["-s", NET6], ["-d", NET6]]


def test_a_mixed_family_pair_is_refused():
    with pytest.raises(ValueError):
        masq_rules(NET6, SUB)


def test_ip6tables_restore_text_has_the_ipv6_rules_and_jumps_at_the_top():
    text = restore_text({NAT: in_chain(masq_rules(NET6, SUB6))}, {NAT: []})
    assert "-I POSTROUTING 1 -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG" in text
    assert f"-A FLANNEL-POSTRTG -s {NET6} ! -d ff00::/8" in text and "10.5." not in text


def test_nft_table_ip6_flannel_ipv6_replaced_whole_without_touching_the_ipv4_tables():
    text = nft_ruleset(NET6, SUB6, masq=True, forward=True)
    lines = text.splitlines()
    assert lines[:3] == ["table ip6 flannel-ipv6 {}", "delete table ip6 flannel-ipv6",
                         "table ip6 flannel-ipv6 {"]
    assert "flannel-udp" not in text and "table ip " not in text
    assert f'ip6 saddr {NET6} ip6 daddr != ff00::/8 masquerade fully-random comment ' \
           '"flanneld masq"' in text
    assert f'ip6 saddr != {NET6} ip6 daddr {SUB6} return' in text
    assert f'ip6 daddr {NET6} accept comment "flanneld forward"' in text
    assert " ip saddr" not in text


def test_removal_commands_name_the_family_s_tool_and_table():
    assert all(c.startswith("ip6tables -t ") for c in removal_commands("iptables", V6))
    assert removal_commands("nft", V6) == ["nft delete table ip6 flannel-ipv6"]
    assert removal_commands("iptables", V4) == firewall.REMOVAL_COMMANDS["iptables"]


@pytest.mark.parametrize("found, enable, tool, why", [
    ({"iptables", "ip6tables", "nft"}, False, "iptables", "ip6tables rules"),
    ({"iptables", "ip6tables", "nft"}, True, "nft", "table ip6 flannel-ipv6"),
    ({"iptables", "nft"}, False, "nft", "the ip6tables binary is missing"),
    ({"iptables"}, False, None, "neither `ip6tables` nor `nft`"),
], ids=["ip6tables", "EnableNFTables", "no ip6tables: nft", "none"])
def test_ipv6_tool_choice(monkeypatch, found, enable, tool, why):
    monkeypatch.setattr(shutil, "which", lambda n: f"/x/{n}" if n in found else None)
    got, reason = firewall.choose_tool(enable_nftables=enable, fam=V6)
    assert got == tool and why in reason, reason


def test_no_ip6tables_and_no_nft_says_what_to_install(monkeypatch, caplog):
    monkeypatch.setattr(shutil, "which", lambda n: "/x/iptables" if n == "iptables" else None)
    with pytest.raises(MasqError) as e:
        firewall.Rules(NET6, SUB6, masq=True, forward=True)
    msg = str(e.value)
    assert "IPv6Network fc00:5::/56" in msg and "`ip6tables`" in msg
    assert "apt-get install iptables" in msg and "without --ip-masq" in msg
    with caplog.at_level(logging.WARNING, logger=firewall.log.name):
        r = firewall.Rules(NET6, SUB6, masq=False, forward=True)
    assert r.tool is None and "ip6tables not found" in caplog.text and NET6 in caplog.text


class Member:
    """Stands in for one family's Rules."""

    def __init__(self, network, subnet, masq=True, fail=False, **kw):
        self.network, self.subnet, self.masq, self.fail = network, subnet, masq, fail
        self.moves, self.calls = [], []

    def install(self):
        self.calls.append("install")
        if self.fail:
            raise MasqError("ip6tables-restore: could not load the nat table")

    def update_subnet(self, subnet):
        self.moves.append(str(subnet))

    def stop(self):
        self.calls.append("stop")


def test_the_stack_moves_each_family_with_its_part(monkeypatch):
    monkeypatch.setattr(firewall, "Rules", Member)
    s = firewall_stack.Stack(DUAL, masq=True, forward=True)
    s.install()
    assert [m.network for m in s.members] == [NET6, NET]
    s.update_subnet([ipaddress.ip_network(SUB), ipaddress.ip_network("fc00:5:0:9::/64")])
    s.update_subnet([ipaddress.ip_network("10.5.4.0/24")])     # a part gone: kept
    assert s.of(V6).moves == ["fc00:5:0:9::/64"] and s.of(V4).moves == [SUB, "10.5.4.0/24"]
    s.stop()
    assert s.of(V6).calls == s.of(V4).calls == ["install", "stop"]


def test_ipv4_only_has_no_ipv6_member(monkeypatch):
    monkeypatch.setattr(firewall, "Rules", Member)
    s = firewall_stack.Stack([Part(NET, SUB)], masq=True, forward=True)
    assert s.of(V6) is None and [m.network for m in s.members] == [NET]


def test_forward_rules_alone_that_fail_for_ipv6_leave_ipv4_s_in(monkeypatch, caplog):
    monkeypatch.setattr(firewall, "Rules",
                        lambda n, s, masq, **kw: Member(n, s, masq=masq, fail=n == NET6))
    s = firewall_stack.Stack(DUAL, masq=False, forward=True)
    with caplog.at_level(logging.WARNING, logger=firewall_stack.log.name):
        s.install()
    assert s.of(V6) is None and s.of(V4).calls == ["install"] and "fc00:5::/56" in caplog.text
    masq = firewall_stack.Stack(DUAL, masq=True, forward=True)
    with pytest.raises(MasqError):
        masq.install()


def test_an_ipv6_only_reshape_moves_the_ipv6_rules(monkeypatch):
    from dataplane.control.lease import Lease, LeaseAttrs
    from dataplane.daemon import lease_move
    moved = []
    monkeypatch.setattr(lease_move, "_move_flannel0_more", lambda host, lease: None)
    monkeypatch.setattr(lease_move, "_replace_engine", lambda host, subnets: None)
    host = SimpleNamespace(rules=SimpleNamespace(update_subnet=lambda *a: moved.append(a)),
                           subnet_file="/run/flannel/subnet.env")
    sub, old6, new6 = (ipaddress.ip_network(x) for x in (SUB, SUB6, "fc00:5:0:9::/64"))
    attrs = LeaseAttrs("192.168.77.1")
    old = Lease(sub, attrs, expiration=None, ipv6_subnet=old6)
    new = Lease(sub, attrs, expiration=None, ipv6_subnet=new6)
    assert lease_move.move(old, new, host, lease_move.Failures())
    assert moved == [([sub, new6],)]
