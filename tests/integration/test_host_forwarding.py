"""A stock host: the kernel's forwarding off, as a new network namespace has it and as Debian 12
ships (docs/operating.md#host-forwarding). Real daemons on a dual-stack config, a real etcd, both
engines. The daemon never switches the sysctls; it says which family is off, what it means and
the fix (`accept_ra=2` first for IPv6 on an interface that takes router advertisements), reminds
while it lasts, says when it is on again, and shows it in /metrics and `flannel-udp status`. A
pod's IPv6 through a host without IPv6 forwarding goes nowhere, without an error: the reason
for all of it.
"""
from __future__ import annotations

import ipaddress
import json
import subprocess

import pytest

from dataplane.host.child import cli_argv
from dataplane.testbed import netns as ns
from dataplane.testbed.wait import wait_for
from dataplane.testbed.overlay import Overlay
from tests.conftest import require_overlay

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.66.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:66::/56",
          "Backend": {"Type": "udp"}}
V4, V6 = "net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"
GAUGE = 'flannel_udp_host_forwarding{family="%s"}'


@pytest.fixture
def ov(engine_kind):
    require_overlay()
    with Overlay(hosts=0, engine=engine_kind, config=CONFIG, ipv6=True) as overlay:
        yield overlay


def sysctl(ov, h, key, value) -> None:
    ns.write_sysctl(h.netns, key, str(value))


def said(ov, h, text: str) -> list[str]:
    return [line for line in ov.daemon(h).log_text().splitlines() if text in line]


def status(ov, h) -> tuple[dict, str]:
    def run(*extra):
        return subprocess.run(cli_argv("status", *extra, "--status-socket", ov.status_socket(h)),
                              capture_output=True, text=True, timeout=30).stdout
    return json.loads(run("--json")), run()


def ping6(netns: str, dst: str) -> str:
    r = subprocess.run(ns.exec_argv(netns, ["ping", "-6", "-n", "-c", "1", "-W", "2", dst]),
                       capture_output=True, text=True, timeout=20)
    return r.stdout


def test_forwarding_off_is_said_with_its_fix_and_on_is_not(ov):
    # h0 as a new namespace is: both families off; h1 switched on before its daemon starts
    h0 = ov.add_host(start=False)
    assert ov.exec(h0, ["sysctl", "-n", V4, V6]).stdout.split() == ["0", "0"]
    # h0's interface takes routes from router advertisements (accept_ra 1, a route of theirs)
    assert ov.exec(h0, ["sysctl", "-n", f"net.ipv6.conf.{h0.iface}.accept_ra"]).stdout == "1\n"
    ov.exec(h0, ["ip", "-6", "route", "add", "2001:db8:99::/64", "dev", h0.iface, "proto", "ra"],
            check=True)
    ov.start_daemon(h0, env={"FLANNEL_UDP_REMIND_EVERY_S": "2"})
    h1 = ov.add_host(start=False)
    for key in (V4, V6):
        sysctl(ov, h1, key, 1)
    ov.start_daemon(h1)

    first = f"Host forwarding: {V4} and {V6} are 0: this host does not forward"
    assert ov.wait_log(h0, first), ov.daemon(h0).log_text()[-3000:]
    line = said(ov, h0, first)[0]
    assert "WARNING" in line and "IPv4 and IPv6 packets" in line, line
    # the fix, IPv6's accept_ra=2 first on the interface that takes advertisements
    assert f"sysctl -w {V4}=1" in line and f"sysctl -w {V6}=1" in line, line
    assert line.index(f"net.ipv6.conf.{h0.iface}.accept_ra=2") < line.index(f"{V6}=1"), line
    # the daemon changed nothing, and reminds while it lasts
    assert ov.exec(h0, ["sysctl", "-n", V4, V6]).stdout.split() == ["0", "0"]
    assert ov.wait_log(h0, "Host forwarding: still failing after"), ov.daemon(h0).log_text()
    m = ov.metrics(h0)
    assert (m[GAUGE % "ipv4"], m[GAUGE % "ipv6"]) == (0, 0), m
    doc, text = status(ov, h0)
    assert doc["host_forwarding"] == {"ipv4": False, "ipv6": False}, doc
    assert "forwarding   IPv4 OFF, IPv6 OFF (the pods' packets" in text, text
    assert any(V6 in w["message"] for w in doc["warnings"]), doc["warnings"]

    # h1: nothing said, both 1
    assert not said(ov, h1, "Host forwarding"), ov.daemon(h1).log_text()[-3000:]
    m = ov.metrics(h1)
    assert (m[GAUGE % "ipv4"], m[GAUGE % "ipv6"]) == (1, 1), m
    assert "forwarding   IPv4 on, IPv6 on\n" in status(ov, h1)[1]

    # the fix, one family at a time: the line names what is still off, then it is over
    sysctl(ov, h0, V6, 1)
    assert ov.wait_log(h0, f"Host forwarding: {V4} is 0"), ov.daemon(h0).log_text()[-2000:]
    assert wait_for(lambda: ov.metrics(h0)[GAUGE % "ipv6"] == 1, 5, interval=0.2)
    sysctl(ov, h0, V4, 1)
    assert ov.wait_log(h0, "Host forwarding: recovered"), ov.daemon(h0).log_text()[-2000:]
    assert status(ov, h0)[0]["host_forwarding"] == {"ipv4": True, "ipv6": True}

    # why it matters: a pod's IPv6 through h0 gets through with forwarding on, and goes nowhere,
    # without an error, with it off (which the daemon says again)
    six = {h.name: ipaddress.IPv6Interface(ov.subnet_env(h)["FLANNEL_IPV6_SUBNET"]).network
           for h in (h0, h1)}
    pod0 = ov.tb.add_pod(h0, "p", f"{six['h0'].network_address + 2}/64",
                         str(six["h0"].network_address + 1))
    pod1 = six["h1"].network_address + 2
    ov.tb.add_pod(h1, "p", f"{pod1}/64", str(six["h1"].network_address + 1))
    assert wait_for(lambda: "1 received" in ping6(pod0, str(pod1)), 10, interval=0.2)
    sysctl(ov, h0, V6, 0)
    out = ping6(pod0, str(pod1))
    assert "0 received" in out and "unreachable" not in out, out
    assert ov.wait_log(h0, f"Host forwarding: {V6} is 0"), ov.daemon(h0).log_text()[-2000:]
