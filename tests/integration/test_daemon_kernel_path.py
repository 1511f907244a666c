"""The daemon's default path: the kernel path's tc programs with the C engine as the slow path.

Two daemons with the default engine choice (auto) on a dual-stack config, real etcd and hosts:
each says in its log that the kernel path runs, pings cross both ways in both inner families
(IPv6 over the IPv4 underlay) carried by the programs (their counters move, the engines send
and write nothing), /metrics labels the series by datapath and `flannel-udp status` names the
path; a third host that joins later is reached through the kernel path (the maps follow the
peer watch), and once killed, the C engine started alone in its place removes the path it left,
pinned (its filters would swallow the peers' datagrams); a daemon that stops leaves its path
forwarding (docs/kernel-path.md#restarts, test_daemon_kernel_restart.py). Then a host where the
programs cannot be built (clang made unreachable through
$BPF_CLANG, which the build honours: engine/bpf_build.py): `--engine kernel` fails at start
saying why, auto falls back to the C engine saying why (docs/kernel-path.md, "The choice").
"""
from __future__ import annotations

import ipaddress
import re
import signal
import subprocess
import sys

import pytest

from dataplane.host.child import cli_argv
from dataplane.testbed import netns as ns
from dataplane.testbed.overlay import parse_ping
from dataplane.testbed.wait import wait_for
from tests.conftest import require_bpf, require_engine
from tests.integration.conftest import overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.67.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:67::/56",
          "Backend": {"Type": "udp"}}
NO_CLANG = {"BPF_CLANG": "/nonexistent/clang"}
SAYS_KERNEL = "kernel path: the tc programs forward on flannel0"


@pytest.fixture
def ov():
    require_bpf()
    require_engine("c")
    yield from overlay_of("auto", ("auto", "auto"), config=CONFIG, ipv6=True)


def ping(netns: str, dst: str, count: int = 3) -> dict:
    six = ["-6"] if ":" in dst else []
    r = subprocess.run(ns.exec_argv(netns, ["ping", *six, "-n", "-q", "-c", str(count), "-i",
                                            "0.2", "-W", "1", "-w", "5", dst]),
                       capture_output=True, text=True, timeout=20)
    return parse_ping(r.stdout, r.returncode)


def subnet6(ov, h) -> ipaddress.IPv6Network:
    return ipaddress.IPv6Interface(ov.subnet_env(h)["FLANNEL_IPV6_SUBNET"]).network


def carried(ov, h) -> dict:
    """What h's programs and h's engine sent and wrote, from /metrics."""
    m = ov.metrics(h)
    return {f"{dp}_{path}": m.get(f'flannel_udp_packets_total{{datapath="{dp}",path="{path}"}}', 0)
            for dp in ("kernel", "engine") for path in ("udp_tx", "tun_tx")}


def status(ov, h) -> str:
    r = ov.exec(h, cli_argv("status", "--status-socket", ov.status_socket(h)))
    return r.stdout + r.stderr


@pytest.mark.timeout(150)
def test_default_daemon_forwards_through_the_kernel_path(ov):
    h0, h1 = ov.hosts
    for h in (h0, h1):
        log = ov.daemon(h).log_text()
        assert SAYS_KERNEL in log and "the c engine is the slow path" in log, log[-3000:]
    before = {h.name: carried(ov, h) for h in (h0, h1)}
    dsts = {h.name: (ov.flannel_ip(h), str(subnet6(ov, h).network_address)) for h in (h0, h1)}
    # IPv6 through a carrier-less route may need a moment (docs/kernel-path.md): the first
    # answer is waited for, then counted pings
    for src, dst in ((h0, h1), (h1, h0)):
        for addr in dsts[dst.name]:
            assert wait_for(lambda: ping(src.netns, addr, count=1)["received"] == 1, 10,
                            interval=0.2), f"{src.name} -> {addr}"
            assert ping(src.netns, addr)["received"] == 3, f"{src.name} -> {addr}"
    after = {h.name: carried(ov, h) for h in (h0, h1)}
    for h in (h0, h1):
        moved = {k: after[h.name][k] - before[h.name][k] for k in after[h.name]}
        # 2 x 3 pings sent and 2 x 3 answers, each way: by the programs
        assert moved["kernel_udp_tx"] >= 12 and moved["kernel_tun_tx"] >= 12, moved
        assert moved["engine_udp_tx"] <= 1 and moved["engine_tun_tx"] <= 1, moved
    m = ov.metrics(h0)
    assert m.get('flannel_udp_datapath_info{datapath="kernel"}') == 1, m
    # a sum over datapath: the host's total
    assert m['flannel_udp_packets_total{path="udp_tx"}'] >= \
        m['flannel_udp_packets_total{datapath="kernel",path="udp_tx"}'] >= 12
    out = status(ov, h0)
    assert re.search(r"\n  path +kernel \(", out) and "udp_tx_packets" in out, out
    assert "tx-udp_tnl-segmentation" in out, out

    # a peer that joins later: the programs' maps follow the peer watch
    h2 = ov.add_host(engine="auto")
    k0 = carried(ov, h0)["kernel_udp_tx"]
    assert wait_for(lambda: ping(h0.netns, ov.flannel_ip(h2), count=1)["received"] == 1, 10,
                    interval=0.2)
    assert ping(h0.netns, ov.flannel_ip(h2))["received"] == 3
    assert carried(ov, h0)["kernel_udp_tx"] - k0 >= 4

    # a daemon killed leaves its path (pinned, on its hooks), which would take the peers'
    # datagrams from an engine: the engine that starts alone in its place removes it, and
    # hears its peers
    ov.stop_daemon(h2, sig=signal.SIGKILL)
    ov.start_daemon(h2, engine="c")
    log = ov.daemon(h2).log_text()
    assert "Removed the kernel path pinned at" in log, log[-3000:]
    assert "flannel0 goes with the daemon again (no longer persistent)" in log, log[-3000:]
    assert "fu_ingress" not in ov.exec(h2, ["tc", "filter", "show", "dev", h2.iface,
                                            "ingress"]).stdout
    assert wait_for(lambda: ping(h1.netns, ov.flannel_ip(h2), count=1)["received"] == 1, 10,
                    interval=0.2)

    # a daemon that stops leaves the programs on their hooks (a stop and a restart look
    # alike to it), the segmentation off as they need it
    d0 = ov.daemon(h0)
    ov.stop_daemon(h0)
    assert "the kernel path keeps forwarding without a daemon" in d0.log_text()
    r = ov.exec(h0, ["tc", "filter", "show", "dev", h0.iface, "ingress"])
    assert "fu_ingress" in r.stdout, r.stdout
    r = ov.exec(h0, [sys.executable, "-c", "from dataplane.host.tunnel_gso import active; "
                     f"a = active({h0.iface!r}); print(a['tx-udp_tnl-segmentation'], "
                     "a['tx-checksum-ip-generic'])"])
    assert r.stdout.split() == ["False", "False"], r.stdout + r.stderr
    assert ping(h1.netns, ov.flannel_ip(h0))["received"] == 3


@pytest.mark.timeout(90)
def test_forced_kernel_fails_at_start_auto_falls_back(ov):
    h = ov.add_host(start=False)
    ov.start_daemon(h, engine="kernel", wait=False, env=NO_CLANG)
    assert ov.wait_exit(h, timeout=30) == 1
    log = ov.daemon(h).log_text()
    assert "--engine kernel: the kernel path cannot run here" in log, log[-3000:]
    assert "cannot run /nonexistent/clang" in log and "apt-get install clang" in log, log[-3000:]
    ov.stop_daemon(h)
    ov.start_daemon(h, engine="auto", env=NO_CLANG)
    log = ov.daemon(h).log_text()
    assert "kernel path: not used: cannot run /nonexistent/clang" in log, log[-3000:]
    assert "the C engine forwards alone" in log, log[-3000:]
    assert 'datapath="engine"' in str(ov.metrics(h).keys())
    assert ov.metrics(h).get('flannel_udp_datapath_info{datapath="engine"}') == 1
    assert ping(h.netns, ov.flannel_ip(ov.hosts[0]))["received"] == 3
