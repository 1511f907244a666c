"""The daemon's kernel path outlives the daemon (docs/kernel-path.md#restarts).

Two daemons on the kernel path (dual-stack config, real etcd, hosts in namespaces), each with
its own --bpf-pins (the testbed's). Ping streams both ways in both inner families run while
host A's daemon is SIGKILLed: its programs, pinned, and its flannel0, persistent, carry them
with no process. Meanwhile host C joins. A's daemon started again adopts the pinned path (its
log says so; the maps are written by difference, the programs left on their hooks) and
reaches C through it, the streams losing nothing. SIGTERM: the path stays, `flannel-udp
status` says it runs without a daemon and pings still cross; `flannel-udp cleanup
--kernel-path` leaves nothing attached, pinned or persistent, and the external interface's
offloads the first daemon turned off on again; then `--engine c` starts on the same host and
forwards.
"""
from __future__ import annotations

import ipaddress
import json
import os
import signal
import time

import pytest

from dataplane.host.child import cli_argv
from dataplane.testbed.ping_stream import PingStream
from dataplane.testbed.wait import wait_for
from tests.conftest import require_bpf, require_engine
from tests.integration.conftest import overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.68.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:68::/56",
          "Backend": {"Type": "udp"}}


@pytest.fixture
def ov():
    require_bpf()
    require_engine("c")
    yield from overlay_of("kernel", ("kernel", "kernel"), config=CONFIG, ipv6=True)


def addrs(ov, h) -> tuple:
    six = ipaddress.IPv6Interface(ov.subnet_env(h)["FLANNEL_IPV6_SUBNET"]).network
    return ov.flannel_ip(h), str(six.network_address)


def answers(ov, src, dst: str) -> bool:
    return ov.ping(src, dst, count=1, wait=0.5)["received"] == 1


def filters(ov, h) -> str:
    return "".join(ov.exec(h, ["tc", "filter", "show", "dev", dev, hook]).stdout
                   for dev, hook in ((h.iface, "ingress"), ("flannel0", "egress")))


# what a veth has on and the kernel path turns off (host/tunnel_gso.py)
TURNED_OFF = ("tx-udp_tnl-segmentation", "tx-udp_tnl-csum-segmentation", "tx-checksum-ip-generic")


def offloads(ov, h) -> dict:
    out = ov.exec(h, ["ethtool", "-k", h.iface]).stdout
    return {f: v.split()[0] for f, _, v in (line.strip().partition(": ")
                                            for line in out.splitlines()) if f in TURNED_OFF}


@pytest.mark.timeout(150)
def test_the_kernel_path_outlives_the_daemon(ov):
    a, b = ov.hosts
    root = ov.tb.bpf_pins(a)
    pins = os.path.join(root, "flannel0")
    for src, dst in ((a, b), (b, a)):
        for addr in addrs(ov, dst):
            assert wait_for(lambda: answers(ov, src, addr), 10, interval=0.2), (src, addr)
    assert sorted(os.listdir(pins)) == ["fu_config_map", "fu_counters", "fu_egress",
                                        "fu_ingress", "fu_local4", "fu_local6", "fu_offload",
                                        "fu_peers4", "fu_peers6", "fu_routes4", "fu_routes6"]
    assert offloads(ov, a) == {f: "off" for f in TURNED_OFF}
    streams = [PingStream(ov, src, addr, 0.02, 60)
               for src, dst in ((a, b), (b, a)) for addr in addrs(ov, dst)]
    try:
        assert wait_for(lambda: all(s.replies for s in streams), 10), "no replies"
        ov.stop_daemon(a, sig=signal.SIGKILL)
        # no process on A's path: a peer joins meanwhile, which A's maps do not know
        c = ov.add_host(engine="kernel")
        time.sleep(1)
        assert "fu_egress" in filters(ov, a), filters(ov, a)
        d = ov.start_daemon(a, engine="kernel")
        log = d.log_text()
        assert f"kernel path: adopted the one pinned at {pins} (the same programs" in log, \
            log[-3000:]
        assert wait_for(lambda: answers(ov, a, ov.flannel_ip(c)), 10, interval=0.2)
        assert wait_for(lambda: answers(ov, c, addrs(ov, a)[1]), 10, interval=0.2)
        time.sleep(1)
        results = [s.stop() for s in streams]
    finally:
        for s in streams:
            s.stop()
    print("ping streams across the kill and the adoption: "
          + ", ".join(f"{r['replies']} replies, {r['lost']} lost" for r in results))
    for r in results:
        assert r["replies"] > 100 and r["lost"] == 0, results

    # another queue layout than the flannel0 left: made again
    assert ov.stop_daemon(a) == 0
    d = ov.start_daemon(a, engine="kernel", args=("--queues", "1"))
    assert "has another queue layout than --queues 1 asks: made again" in d.log_text()
    assert wait_for(lambda: answers(ov, b, ov.flannel_ip(a)), 10, interval=0.2)

    # a stop leaves the path forwarding; status says so; the lease stays until it expires
    assert ov.stop_daemon(a) == 0
    log = d.log_text()
    assert "the kernel path keeps forwarding without a daemon; `flannel-udp cleanup " \
           "--kernel-path` removes it" in log, log[-3000:]
    assert ov.ping(b, ov.flannel_ip(a))["received"] == 3
    r = ov.exec(a, cli_argv("status", "--status-socket", ov.status_socket(a),
                            f"--bpf-pins={root}"))
    assert r.returncode == 2 and "RUNNING WITHOUT A DAEMON" in r.stdout, r.stdout + r.stderr

    # cleanup --kernel-path: nothing attached, pinned or persistent is left
    r = ov.exec(a, cli_argv("cleanup", "--kernel-path", f"--bpf-pins={root}",
                            f"--status-socket={ov.status_socket(a)}",
                            f"--subnet-file={ov.subnet_file(a)}"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fu_" not in ov.exec(a, ["tc", "filter", "show", "dev", a.iface, "ingress"]).stdout
    assert ov.exec(a, ["ip", "link", "show", "flannel0"]).returncode != 0
    assert not os.path.exists(pins)
    # what the first daemon turned off, three daemons before, is on again
    assert offloads(ov, a) == {f: "on" for f in TURNED_OFF}, r.stdout

    # the engine alone on the same host
    ov.start_daemon(a, engine="c")
    assert wait_for(lambda: answers(ov, a, ov.flannel_ip(b)), 10, interval=0.2)
    assert ov.ping(b, ov.flannel_ip(a))["received"] == 3


@pytest.fixture
def ov_plain():
    require_bpf()
    require_engine("c")
    yield from overlay_of("kernel", ("kernel", "kernel"))


@pytest.mark.timeout(90)
def test_stop_and_start_on_the_kernel_path_loses_nothing(ov_plain, figure):
    """What test_handover's stop + start loses with an engine (flannel0 goes with the process),
    the kernel path does not: the same device, the programs forwarding meanwhile."""
    from tests.integration import restart_traffic
    ov = ov_plain
    a, b = ov.hosts
    before = ov.exec(a, ["cat", "/sys/class/net/flannel0/ifindex"]).stdout
    out = restart_traffic.across(ov.tb, a, b, ov.flannel_ip(a), ov.flannel_ip(b),
                                 lambda: ov.restart_daemon(a))
    figure("kernel: stop + start (SIGTERM, a new daemon adopts the path)", out.summary())
    assert ov.exec(a, ["cat", "/sys/class/net/flannel0/ifindex"]).stdout == before
    assert "kernel path: adopted the one pinned at" in ov.daemon(a).log_text()
    assert out.tcp_problems() == [], out.details()
    assert out.udp_lost() == {"a->b": 0, "b->a": 0}, out.details()


def flannel0_addrs(ov, h) -> set:
    out = ov.exec(h, ["ip", "-j", "addr", "show", "dev", "flannel0"]).stdout
    return {f"{a['local']}/{a['prefixlen']}" for link in json.loads(out)
            for a in link["addr_info"] if a.get("scope") != "link"}


@pytest.mark.timeout(60)
def test_flannel0_taken_up_under_another_lease_keeps_only_its_addresses(ov):
    """The kernel path keeps flannel0 across a restart; a daemon that gets another lease takes
    the old lease's addresses off it (an operator's stays), says so once, and forwards."""
    a, b = ov.hosts
    old, old6 = ov.subnet(a), addrs(ov, a)[1]
    ov.exec(a, ["ip", "addr", "add", "10.68.250.7/32", "dev", "flannel0"], check=True)
    assert ov.stop_daemon(a) == 0
    ov.delete_lease(old)
    new = next(n for n in ("10.68.77.0/24", "10.68.78.0/24") if n != str(old))
    new6 = next(n for n in ("fc00:68:0:fe::/64", "fc00:68:0:fd::/64") if n != f"{old6}/64")
    ov.prefer_subnet(a, new, new6)
    d = ov.start_daemon(a)
    assert str(ov.subnet(a)) == new
    new6_addr = str(ipaddress.ip_network(new6).network_address)
    assert flannel0_addrs(ov, a) == {f"{new[:-3]}/32", "10.68.250.7/32", f"{new6_addr}/128"}
    log = d.log_text()
    assert log.count("held the addresses of another lease: removed "
                     f"{old.network_address}/32, {old6}/128") == 1, log[-3000:]
    for addr in (new[:-3], new6_addr):
        assert wait_for(lambda: answers(ov, b, addr), 10, interval=0.2), addr
