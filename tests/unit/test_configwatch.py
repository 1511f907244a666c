"""What the daemon says when the network config in etcd changes under it (no etcd: the judge only)."""
from __future__ import annotations

import json
import logging

from dataplane.control.config import parse_config
from dataplane.control.configwatch import ConfigWatcher, config_changes

RUNNING = parse_config('{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}')


class _Registry:
    config_key = "/coreos.com/network/config"


def test_changes_are_named_field_by_field():
    new = parse_config('{"Network":"10.6.0.0/16","SubnetLen":25,"Backend":{"Type":"UDP","Port":9000}}')
    changes = config_changes(RUNNING, new)
    assert "Network 10.5.0.0/16 -> 10.6.0.0/16" in changes and "SubnetLen 24 -> 25" in changes
    assert "Port 8285 -> 9000" in changes
    assert not any(c.startswith("Backend Type") for c in changes)      # udp == UDP
    same = parse_config('{"Network":"10.5.0.0/16","Backend":{"Type":"udp","Port":8285}}')
    assert config_changes(RUNNING, same) == []
    direct = parse_config('{"Network":"10.5.0.0/16","Backend":{"Type":"udp","DirectRouting":true}}')
    assert config_changes(RUNNING, direct) == ["DirectRouting False -> True"]


def test_dual_stack_keys_are_changes():
    """Switching IPv6 on, or its network, changes the lease key, flannel0 and the firewall: the
    running daemon keeps the old ones until a restart, so the watch must not call it a match."""
    dual = parse_config('{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00:5::/56",'
                        '"Backend":{"Type":"udp"}}')
    changes = config_changes(RUNNING, dual)
    assert "EnableIPv6 False -> True" in changes
    assert "IPv6Network None -> fc00:5::/56" in changes and "IPv6SubnetLen 0 -> 64" in changes
    other = parse_config('{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00:6::/56",'
                         '"IPv6SubnetLen":60,"Backend":{"Type":"udp"}}')
    assert [c.split()[0] for c in config_changes(dual, other)] == [
        "IPv6Network", "IPv6SubnetLen", "IPv6SubnetMin", "IPv6SubnetMax"]
    assert config_changes(dual, dual) == []


def test_each_state_is_logged_once_with_the_key_and_bounded(caplog):
    w = ConfigWatcher(_Registry(), RUNNING)
    states = [b"not json", b"not json", b'{"Network":"' + b"1" * (1 << 20) + b'"}',
              b"[" * 100000, json.dumps({"Network": "10.5.0.0/16",
                                         "Backend": {"Type": "vxlan"}}).encode(), None]
    with caplog.at_level(logging.INFO, logger="dataplane.control.configwatch"):
        for value in states:
            w.check(value)
            assert w.mismatch
        w.check(json.dumps(RUNNING.raw).encode())
        assert not w.mismatch
        w.check(json.dumps(RUNNING.raw).encode())
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 6                                     # the repeated states said once
    assert all(_Registry.config_key in m and len(m) < 1000 for m in msgs)
    assert "invalid JSON" in msgs[0] and "nested too deeply" in msgs[2]
    assert "unknown backend type: vxlan" in msgs[3] and "deleted" in msgs[4]
    assert "matches the running config again" in msgs[5]
    assert all("keeps running with" in m for m in msgs[:5])


def test_enable_nftables_change_needs_a_restart(caplog):
    """EnableNFTables moves the firewall rules between iptables and nftables: the running daemon keeps
    the tool it started with, and says that a restart applies the new value."""
    nft = json.dumps({"Network": "10.5.0.0/16", "Backend": {"Type": "udp"}, "EnableNFTables": True})
    assert config_changes(RUNNING, parse_config(nft)) == ["EnableNFTables False -> True"]
    w = ConfigWatcher(_Registry(), RUNNING)
    with caplog.at_level(logging.INFO, logger="dataplane.control.configwatch"):
        w.check(nft.encode())
        assert w.mismatch
        w.check(json.dumps(RUNNING.raw).encode())
        assert not w.mismatch
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 2
    assert "EnableNFTables False -> True" in msgs[0] and "restart the daemons to apply it" in msgs[0]
    assert caplog.records[0].levelno == logging.WARNING
    assert "matches the running config again" in msgs[1]


def test_networks_key_change_is_no_change():
    """`Networks` is an unknown key in flanneld v0.28.9 (docs/flannel-compat.md#network-config): adding
    it changes nothing the daemon runs with."""
    extra = parse_config('{"Network":"10.5.0.0/16","Backend":{"Type":"udp"},"Networks":["10.9.0.0/16"]}')
    assert config_changes(RUNNING, extra) == []
