"""The preflight's firewall tool check once the network config is read (daemon/preflight.py
firewall_tools): each family the config asks rules for, with the tool the config chooses, named
with the package that has it; the binaries' presence is faked (the netns test
test_preflight.py runs the daemon against a real PATH without ip6tables)."""
from __future__ import annotations

import shutil
from ipaddress import IPv4Network, IPv6Network
from types import SimpleNamespace

import pytest

from dataplane.daemon import preflight


def config(ipv6=False, nftables=False):
    return SimpleNamespace(network=IPv4Network("10.5.0.0/16"), enable_ipv6=ipv6,
                           ipv6_network=IPv6Network("fc00:5::/56"), enable_nftables=nftables)


@pytest.mark.parametrize("found, cfg, legacy, said", [
    ({"iptables", "ip6tables"}, config(ipv6=True), False, None),
    ({"iptables"}, config(), False, None),
    ({"iptables"}, config(ipv6=True), False,
     "--ip-masq for the IPv6Network fc00:5::/56 (\"EnableIPv6\": true) needs ip6tables"),
    ({"iptables", "nft"}, config(ipv6=True), False, None),
    ({"iptables", "ip6tables"}, config(nftables=True), False, "apt-get install nftables"),
    ({"iptables", "ip6tables"}, config(ipv6=True), True,
     "ip6tables here is ip6tables-legacy, which needs CAP_NET_RAW"),
], ids=["both", "ipv4 only", "no ip6tables", "nft for ipv6", "EnableNFTables without nft",
        "ip6tables-legacy without CAP_NET_RAW"])
def test_each_family_s_tool(monkeypatch, found, cfg, legacy, said):
    monkeypatch.setattr(shutil, "which", lambda n: f"/x/{n}" if n in found else None)
    monkeypatch.setattr(preflight, "effective_caps", lambda: 0)
    monkeypatch.setattr(preflight, "_iptables_legacy", lambda binary="iptables": legacy)
    opts = SimpleNamespace(ip_masq=True)
    if said is None:
        preflight.firewall_tools(opts, cfg)
        return
    with pytest.raises(preflight.PreflightError) as e:
        preflight.firewall_tools(opts, cfg)
    assert said in str(e.value) and "nothing was written to etcd" in str(e.value)
    preflight.firewall_tools(SimpleNamespace(ip_masq=False), cfg)   # forward rules alone: warned
