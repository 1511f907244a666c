"""ICMPv6 errors over the IPv4 underlay: two daemons on a dual-stack network config
(`EnableIPv6`), each engine on both ends, real etcd and hosts (docs/operating.md#dual-stack).

A pod hangs off a host with an address from FLANNEL_IPV6_SUBNET's range. What a dual-stack host
sets up and pods of three hosts talking over both families: test_dual_stack_hosts.py.
"""
from __future__ import annotations

import ipaddress
import subprocess

import pytest

from dataplane.testbed import netns as ns
from dataplane.testbed.hosts import wait_for
from dataplane.testbed.overlay import parse_ping
from tests.conftest import require_overlay

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.66.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:66::/56",
          "Backend": {"Type": "udp"}}
NET6 = ipaddress.IPv6Network(CONFIG["IPv6Network"])


@pytest.fixture
def ov(engine_kind):
    require_overlay()
    from dataplane.testbed.overlay import Overlay
    overlay = Overlay(hosts=0, engine=engine_kind, config=CONFIG, ipv6=True)
    try:
        for _ in range(2):
            overlay.add_host(engine=engine_kind, wait=False)
        for h in overlay.hosts:
            overlay.wait_ready(h)
        yield overlay
    finally:
        overlay.close()


def subnet6(ov, h) -> ipaddress.IPv6Network:
    return ipaddress.IPv6Interface(ov.subnet_env(h)["FLANNEL_IPV6_SUBNET"]).network


def ping6(netns: str, dst: str, count: int = 3) -> dict:
    r = subprocess.run(ns.exec_argv(netns, ["ping", "-6", "-n", "-q", "-c", str(count), "-i",
                                            "0.2", "-W", "1", "-w", "5", dst]),
                       capture_output=True, text=True, timeout=20)
    return parse_ping(r.stdout, r.returncode)


def ping6_out(netns: str, dst: str, *extra: str) -> str:
    r = subprocess.run(ns.exec_argv(netns, ["ping", "-6", "-n", "-c", "1", "-W", "2", *extra,
                                            dst]), capture_output=True, text=True, timeout=20)
    return r.stdout


def test_icmpv6_errors_reach_the_sender(ov):
    """dataplane.h's "ICMPv6 errors" seen by the senders' kernels: an unleased address inside
    IPv6Network is unreachable, a hop limit of 1 through flannel0 exceeded; both come from
    flannel0's IPv6 address (the kernel takes its own address as an error's source)."""
    h0, h1 = ov.hosts
    six0, six1 = subnet6(ov, h0), subnet6(ov, h1)
    pod0 = ov.tb.add_pod(h0, "p", f"{six0.network_address + 2}/64", str(six0.network_address + 1))
    assert wait_for(lambda: ping6(h0.netns, str(six1.network_address), count=1)["received"] == 1,
                    10, interval=0.2)
    unleased = next(n for n in NET6.subnets(new_prefix=64) if n not in (six0, six1))
    out = ping6_out(pod0, str(unleased.network_address + 5))
    assert f"From {six0.network_address} icmp_seq=1 Destination unreachable" in out, out
    out = ping6_out(h0.netns, str(six1.network_address), "-t", "1")
    assert f"From {six0.network_address} icmp_seq=1 Time exceeded" in out, out
