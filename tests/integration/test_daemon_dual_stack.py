"""Daemons on a dual-stack network config (`EnableIPv6`), both engines, real etcd and hosts.

What this version does with it (docs/flannel-compat.md, docs/operating.md#dual-stack): each host
takes flanneld's dual-stack lease, one key naming both parts, so that flanneld hosts of the same
cluster start beside it (a v4-only key made flanneld v0.20.2 panic at its start); IPv4 is
forwarded as on any config; IPv6 is not yet, and the daemon says so, shows the held part in its
status, and leaves FLANNEL_IPV6_* out of subnet.env (pods given IPv6 addresses that go nowhere
would be worse than none).
"""
from __future__ import annotations

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
            overlay.add_host(engine=kind, wait=False)
        for h in overlay.hosts:
            overlay.wait_ready(h)
        yield overlay
    finally:
        overlay.close()


def test_dual_stack_leases_ipv4_forwarded_ipv6_said_not_to_be(ov):
    h0, h1 = ov.hosts
    keys = ov.etcdctl("get", "--prefix", f"{ov.prefix}/subnets/", "--keys-only").stdout.split()
    parts = [KEY.match(k) for k in keys]
    assert len(keys) == 2 and all(parts), keys
    assert len({p.group(2) for p in parts}) == 2, f"two hosts, one IPv6 part: {keys}"
    for h in (h0, h1):
        value = ov.etcdctl("get", "--prefix", f"{ov.prefix}/subnets/{ov.subnet(h).network_address}-",
                           "--print-value-only").stdout.strip()
        assert value == json.dumps({"PublicIP": h.ip, "PublicIPv6": None}, separators=(",", ":"))
        # flanneld's udp backend's subnet.env: no IPv6 lines while IPv6 is not forwarded
        env = ov.subnet_env(h)
        assert env["FLANNEL_SUBNET"] == f"{ov.subnet(h).network_address + 1}/24"
        assert not any(k.startswith("FLANNEL_IPV6") for k in env), env
        assert "this version forwards IPv4 only" in ov.daemon(h).log_text()
    assert ov.ping(h0, ov.flannel_ip(h1))["received"] > 0
    assert ov.ping(h1, ov.flannel_ip(h0))["received"] > 0

    doc = json.loads(subprocess.run(cli_argv("status", "--json", "--status-socket",
                                             ov.status_socket(h0)),
                                    capture_output=True, text=True, timeout=30).stdout)
    ours = next(p for p in parts if p.group(1) == f"{ov.subnet(h0).network_address}-24")
    assert doc["lease"]["ipv6_subnet"] == ours.group(2).replace("-", "/")
