"""An IPv6 underlay that carries nothing (issue 44): two dual-stack hosts with IPv6 underlay
addresses, each engine on one of them, a real etcd. Pods' IPv6 goes over IPv6 UDP; then h1's
firewall drops IPv6 UDP to the port (as one opened for it on IPv4 only does), so h0's IPv6
datagrams to h1 vanish while h1's still reach h0. h0's probes go unanswered and within 30 s
(here the probe interval is 1 s instead of 5 s) its pods' IPv6 to h1 goes over the IPv4
underlay: said once in its log, in `flannel-udp status` and in /metrics. Once the rule is gone,
h0 goes back to the IPv6 underlay (docs/operating.md#ipv6-underlay-fallback).
"""
from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import time

import pytest

from dataplane.daemon.underlay_fallback import PROBE_EVERY_ENV
from dataplane.host.child import cli_argv
from dataplane.testbed.wait import wait_for
from dataplane.testbed.overlay import parse_ping
from tests.conftest import require
from tests.integration.conftest import other_engine, overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.66.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:66::/56",
          "Backend": {"Type": "udp"}}
PORT = 8285                     # the backend's default port
FELL_BACK = "carries nothing back"
CAME_BACK = "works again"


@pytest.fixture
def ov(engine_kind, monkeypatch):
    """h0 (the engine under test) and h1 (the other one), both with an IPv6 underlay address
    (their PublicIPv6), probing every second."""
    require(shutil.which("ip6tables") is not None, "needs ip6tables (apt-get install iptables)")
    monkeypatch.setenv(PROBE_EVERY_ENV, "1")
    yield from overlay_of(engine_kind, ((kind, {"underlay6": True})
                                        for kind in (engine_kind, other_engine(engine_kind))),
                          config=CONFIG, ipv6=True)


def replies(ov, where, dst: str, count: int = 3) -> int:
    """Echo replies to ``count`` ping6s from ``where`` (a pod's namespace) to ``dst``."""
    r = ov.tb.exec(where, ["ping", "-6", "-n", "-q", "-c", str(count), "-i", "0.2", "-W", "1",
                           "-w", "4", dst], timeout=20)
    return parse_ping(r.stdout, r.returncode)["received"]


def status(ov, h) -> dict:
    r = subprocess.run(cli_argv("status", "--json", "--status-socket", ov.status_socket(h)),
                       capture_output=True, text=True, timeout=30)
    return json.loads(r.stdout)


def drop_ipv6_udp(ov, h, on: bool) -> None:
    r = ov.exec(h, ["ip6tables", "-I" if on else "-D", "INPUT", "-p", "udp", "--dport",
                    str(PORT), "-j", "DROP"])
    assert r.returncode == 0, r.stderr


def test_a_peer_whose_ipv6_underlay_carries_nothing_goes_over_ipv4_and_back(ov, figure):
    h0, h1 = ov.hosts
    six0, six1 = (ipaddress.IPv6Interface(ov.subnet_env(h)["FLANNEL_IPV6_SUBNET"]).network
                  for h in (h0, h1))
    pod0 = ov.tb.add_pod(h0, "p", f"{six0.network_address + 2}/64", str(six0.network_address + 1))
    pod1_addr = str(six1.network_address + 2)
    ov.tb.add_pod(h1, "p", f"{pod1_addr}/64", str(six1.network_address + 1))
    assert wait_for(lambda: replies(ov, pod0, pod1_addr, 1) == 1, 10,
                    interval=0.2), "pod0 -> pod1 over IPv6"
    # over the IPv6 underlay
    v4, v6 = ov.tb.udp_out(h0)
    assert replies(ov, pod0, pod1_addr) == 3
    v4_after, v6_after = ov.tb.udp_out(h0)
    assert v6_after - v6 >= 3 and v4_after - v4 < 3, (v4, v4_after, v6, v6_after)

    # h1 drops IPv6 UDP to the port: h0's datagrams vanish, h1's still reach h0
    log_from = len(ov.daemon(h0).log_text())
    drop_ipv6_udp(ov, h1, True)
    t0 = time.monotonic()
    assert replies(ov, pod0, pod1_addr, 1) == 0, "the drop rule drops nothing"
    # within 30 s the pods' IPv6 goes over the IPv4 underlay
    assert wait_for(lambda: replies(ov, pod0, pod1_addr, 1) == 1, 30,
                    interval=0.2), "pod0 -> pod1 over IPv6 never came back within 30 s"
    figure(f"{ov.kind}: pods' IPv6 back after h1 dropped IPv6 UDP (probes every 1 s)",
           f"{time.monotonic() - t0:.1f} s")
    v4, _ = ov.tb.udp_out(h0)
    assert replies(ov, pod0, pod1_addr) == 3
    assert ov.tb.udp_out(h0)[0] - v4 >= 3
    # said once, with the peer and why
    said = ov.daemon(h0).log_text()[log_from:]
    lines = [line for line in said.splitlines() if FELL_BACK in line]
    assert len(lines) == 1, said[-3000:]
    assert f"Subnet {ov.subnet(h1)}: the IPv6 underlay to {h1.ip6} {FELL_BACK}" in lines[0], lines
    assert "probes in a row unanswered" in lines[0] and str(six1) in lines[0], lines
    doc = status(ov, h0)["ipv6_underlay_fallback"]
    assert [(p["subnet"], p["public_ipv6"], p["public_ip"]) for p in doc["on_ipv4"]] == \
        [(str(ov.subnet(h1)), h1.ip6, h1.ip)], doc
    assert doc["fallbacks"] == 1 and doc["probed"] == 1, doc
    # h1 finds the same: its probes' answers come back over h0's way to it, dropped too (both
    # hosts route each other's flannel0 address over the IPv6 underlay, the probes' way)
    assert ov.wait_log(h1, f"Subnet {ov.subnet(h0)}: the IPv6 underlay to {h0.ip6} {FELL_BACK}",
                       timeout=10)
    text = subprocess.run(cli_argv("status", "--status-socket", ov.status_socket(h0)),
                          capture_output=True, text=True, timeout=30).stdout
    assert f"{ov.subnet(h1)}: IPv6 over IPv4 to {h1.ip}" in text, text
    m = ov.metrics(h0)
    assert m["flannel_udp_peers_ipv6_underlay_fallback"] == 1, m
    assert m["flannel_udp_ipv6_underlay_fallbacks_total"] == 1, m

    # the rule gone, h0 goes back to the IPv6 underlay
    drop_ipv6_udp(ov, h1, False)
    assert ov.wait_log(h0, f"Subnet {ov.subnet(h1)}: the IPv6 underlay to {h1.ip6} {CAME_BACK}",
                       timeout=20), ov.daemon(h0).log_text()[-3000:]
    assert status(ov, h0)["ipv6_underlay_fallback"]["on_ipv4"] == []
    assert ov.metrics(h0)["flannel_udp_peers_ipv6_underlay_fallback"] == 0
    v4, v6 = ov.tb.udp_out(h0)
    assert replies(ov, pod0, pod1_addr) == 3
    v4_after, v6_after = ov.tb.udp_out(h0)
    assert v6_after - v6 >= 3 and v4_after - v4 < 3, (v4, v4_after, v6, v6_after)
    assert [line for line in ov.daemon(h0).log_text()[log_from:].splitlines()
            if FELL_BACK in line] == lines
