"""Daemons on a dual-stack network config (`EnableIPv6`), both engines, real etcd and hosts.

What this version does with it (docs/flannel-compat.md, docs/operating.md#dual-stack): each host
takes flanneld's dual-stack lease, one key naming both parts, so that flanneld hosts of the same
cluster start beside it (a v4-only key made flanneld v0.20.2 panic at its start), and marks its
value `ForwardsIPv6` (peers route its IPv6 part only then: flanneld's udp hosts take the same
keys but route no IPv6); IPv4 is forwarded as on any config, and IPv6 too
(tests/integration/test_dual_stack_netns.py pings over it); the status shows the held part,
subnet.env has flanneld's FLANNEL_IPV6_* lines and ip6tables flanneld's rules for IPv6Network
(--ip-masq, --iptables-forward-rules). The hosts here disable IPv6 by sysctl
(net.ipv6.conf.{all,default}.disable_ipv6=1, the testbed's default): flannel0 gets it all the same,
per device, as the CNI plugins enable it on the pods' interfaces. Last, EnableIPv6 switched off
under a handover: one key without an IPv6 part, no IPv6 rule left.
"""
from __future__ import annotations

import ipaddress
import json
import re
import subprocess

import pytest

from dataplane.host.child import cli_argv
from tests.conftest import require_overlay
from tests.integration.conftest import other_engine

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.66.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:66::/56",
          "Backend": {"Type": "udp"}}
KEY = re.compile(r"^/coreos\.com/network/subnets/(10\.66\.\d+\.0-24)&(fc00:66:0:[0-9a-f]+::-64)$")


@pytest.fixture
def ov(engine_kind):
    require_overlay()
    from dataplane.testbed.overlay import Overlay
    overlay = Overlay(hosts=0, engine=engine_kind, config=CONFIG)
    try:
        for kind in (engine_kind, other_engine(engine_kind)):
            overlay.add_host(engine=kind, wait=False, args=("--ip-masq",))
        for h in overlay.hosts:
            overlay.wait_ready(h)
        yield overlay
    finally:
        overlay.close()


def test_dual_stack_leases_marked_ipv4_forwarded_ipv6_lines_written(ov):
    h0, h1 = ov.hosts
    keys = ov.etcdctl("get", "--prefix", f"{ov.prefix}/subnets/", "--keys-only").stdout.split()
    parts = [KEY.match(k) for k in keys]
    assert len(keys) == 2 and all(parts), keys
    assert len({p.group(2) for p in parts}) == 2, f"two hosts, one IPv6 part: {keys}"
    for h in (h0, h1):
        value = ov.etcdctl("get", "--prefix", f"{ov.prefix}/subnets/{ov.subnet(h).network_address}-",
                           "--print-value-only").stdout.strip()
        # flanneld's udp value, then the mark, which flanneld reads past
        assert value == json.dumps({"PublicIP": h.ip, "PublicIPv6": None, "ForwardsIPv6": True},
                                   separators=(",", ":"))
        # flanneld's subnet.env lines (docs/flannel-compat.md#subnet-env)
        env = ov.subnet_env(h)
        part = next(p.group(2) for p in parts if p.group(1) == f"{ov.subnet(h).network_address}-24")
        six = ipaddress.IPv6Network(part.replace("-", "/"))
        assert env["FLANNEL_SUBNET"] == f"{ov.subnet(h).network_address + 1}/24"
        assert env["FLANNEL_IPV6_NETWORK"] == CONFIG["IPv6Network"]
        assert env["FLANNEL_IPV6_SUBNET"] == f"{six.network_address + 1}/64"
        log = ov.daemon(h).log_text()
        # nothing about IPv6 but the host's forwarding, off in a new namespace (the daemon's
        # reminder of it: docs/operating.md#host-forwarding)
        assert "forwards IPv4 only" not in log and not re.search(
            r"WARNING (?!dataplane\.daemon\.host_forwarding:).*IPv6", log), log
        addrs = ov.exec(h, ["ip", "-6", "-o", "addr", "show", "dev", "flannel0"]).stdout
        assert f"inet6 {six.network_address}/128" in addrs, addrs
        # --ip-masq and --iptables-forward-rules for IPv6Network too (host/firewall_stack.py)
        nat6 = ov.exec(h, ["ip6tables-save", "-t", "nat"]).stdout
        assert f"-A FLANNEL-POSTRTG -s {six} -d fc00:66::/56 " in nat6, nat6
        assert "-A FLANNEL-POSTRTG -s fc00:66::/56 ! -d ff00::/8 " in nat6, nat6
        fwd6 = ov.exec(h, ["ip6tables-save", "-t", "filter"]).stdout
        assert "-A FLANNEL-FWD -d fc00:66::/56 " in fwd6, fwd6
    assert ov.ping(h0, ov.flannel_ip(h1))["received"] > 0
    assert ov.ping(h1, ov.flannel_ip(h0))["received"] > 0

    doc = json.loads(subprocess.run(cli_argv("status", "--json", "--status-socket",
                                             ov.status_socket(h0)),
                                    capture_output=True, text=True, timeout=30).stdout)
    ours = next(p for p in parts if p.group(1) == f"{ov.subnet(h0).network_address}-24")
    assert doc["lease"]["ipv6_subnet"] == ours.group(2).replace("-", "/")
    part = doc["lease"]["ipv6_subnet"]
    assert doc["ipv6"] == {"tun_address": part.replace("/64", "/128"), "route": "fc00:66::/56"}

    # EnableIPv6 switched off as h0's daemon hands over: the new one starts afresh (the config
    # changed), keeps the IPv4 subnet under a key without an IPv6 part and removes the IPv6
    # rules. The old one let go before that (docs/restarts-and-upgrades.md#checks): its lease
    # watch takes no dual key back beside the new one's, its resync puts no IPv6 rule back.
    # One engine: neither is the engine's.
    if ov.engine != "c":
        return
    subnet = ov.subnet(h0)
    ov.put_config({k: v for k, v in CONFIG.items() if k not in ("EnableIPv6", "IPv6Network")})
    new, rc = ov.handover_daemon(h0)
    assert rc == 0 and "starting afresh" in new.log_text()
    keys = ov.etcdctl("get", "--prefix", f"{ov.prefix}/subnets/", "--keys-only").stdout.split()
    ours = [k for k in keys if k.rsplit("/", 1)[1].startswith(f"{subnet.network_address}-")]
    assert ours == [f"{ov.prefix}/subnets/{subnet.network_address}-24"], keys
    assert ov.subnet(h0) == subnet and "FLANNEL_IPV6_SUBNET" not in ov.subnet_env(h0)
    rules6 = ov.exec(h0, ["ip6tables-save"]).stdout
    assert "FLANNEL" not in rules6, rules6
    assert ov.ping(h0, ov.flannel_ip(h1))["received"] > 0
