"""`flannel-udp run` when things are wrong at startup: what it does and what it tells the operator."""
from __future__ import annotations

import shlex
import signal
import time

import pytest

from dataplane.host.firewall import REMOVAL_COMMANDS
from tests.conftest import require_etcd, require_root
from tests.integration.daemon_checks import PortHolder

pytestmark = [pytest.mark.root, pytest.mark.etcd]


@pytest.fixture(scope="module")
def ov():
    require_root()
    require_etcd()
    from dataplane.testbed.overlay import Overlay
    overlay = Overlay(hosts=0, engine="auto", put_config=False)
    try:
        overlay.add_host(start=False)
        yield overlay
    finally:
        overlay.close()


@pytest.fixture
def host(ov):
    h = ov.hosts[0]
    ov.put_config(ov.config)          # each test starts from a valid config
    yield h
    ov.stop_daemon(h)
    ov.remove_kernel_path(h)                   # auto's kernel path stays after exit too
    for cmd in REMOVAL_COMMANDS["iptables"]:   # the rules stay after exit: start each test clean
        ov.exec(h, shlex.split(cmd))


def test_waits_for_config_and_says_how_to_put_it(ov, host):
    ov.etcdctl("del", f"{ov.prefix}/config")
    ov.start_daemon(host, wait=False)
    assert ov.wait_log(host, "etcdctl put /coreos.com/network/config", 15)
    time.sleep(1.5)
    assert ov.daemon(host).log_text().count("flannel config not found") == 1   # said once
    ov.put_config(ov.config)
    ov.wait_ready(host, timeout=15)
    assert ov.ping(host, ov.flannel_ip(host), count=1)["received"] == 1


def test_sigterm_while_etcd_is_away_exits_0(ov, host):
    ov.stop_etcd()
    try:
        ov.start_daemon(host, wait=False)
        assert ov.wait_log(host, "--etcd-endpoints", 20)
        assert ov.stop_daemon(host, sig=signal.SIGTERM) == 0
    finally:
        ov.start_etcd()


def test_wrong_backend_type_waits_naming_udp(ov, host):
    # flanneld exits on an unknown backend (and systemd restarts it); we keep waiting for a
    # config we can run, saying why, like for any other invalid config.
    ov.put_config({"Network": "10.5.0.0/16", "Backend": {"Type": "vxlan"}})
    try:
        ov.start_daemon(host, wait=False)
        assert ov.wait_log(host, "unknown backend type: vxlan", 15)
        assert "udp" in ov.daemon(host).log_text()
    finally:
        ov.put_config(ov.config)
    ov.wait_ready(host, timeout=15)


def test_unknown_iface_exits_1_listing_interfaces(ov, host):
    ov.start_daemon(host, args=("--iface", "nosuch0"), wait=False)
    assert ov.wait_exit(host, 15) == 1
    log = ov.daemon(host).log_text()
    assert "nosuch0" in log and host.iface in log


def test_port_in_use_exits_1_with_a_hint(ov, host):
    with PortHolder(ov, host, 30):
        ov.start_daemon(host, wait=False)
        assert ov.wait_exit(host, 15) == 1
        log = ov.daemon(host).log_text()
        assert f"{host.ip}:8285" in log and "still running" in log
        # nothing left behind: flannel0 went with the process
        assert ov.exec(host, ["ip", "link", "show", "flannel0"]).returncode != 0


def test_trace_and_metrics_listener(ov, host):
    ov.start_daemon(host, args=("--trace", "--metrics", "127.0.0.1:9285"))
    ov.ping(host, "10.5.250.1", count=1, wait=0.3)      # a packet through the engine
    status, body = ov.healthz(host, "/debug/trace?after=0")
    assert status == 200
    import json
    events = json.loads(body)
    assert events and {"seq", "kind", "len", "addr", "head"} <= set(events[0])
    assert any(e["kind"] in ("route_miss", "tun_read") for e in events)
    status, body = ov.healthz(host, "/metrics", port=9285)
    assert status == 200
    # samples with values, not just the HELP/TYPE lines: no peer (the only host), and the
    # ping's packet read from flannel0 by the engine
    from dataplane.testbed.overlay import parse_metrics
    m = parse_metrics(body)
    assert m.get("flannel_udp_peers") == 0, body
    assert m.get('flannel_udp_packets_total{path="tun_rx"}', 0) >= 1, body
    last = events[-1]["seq"]
    assert all(e["seq"] > last for e in ov.trace_events(host, after=last))


@pytest.mark.parametrize("flag,value", [("-iface-regex", r"^192\.168\.77\."),
                                        ("--iface-can-reach", "192.168.77.254"),
                                        ("--public-ip", None)])
def test_interface_selection_rules(ov, host, flag, value):
    value = value or host.ip
    ov.start_daemon(host, args=(flag, value))
    assert f"Using interface with name {host.iface} and address {host.ip}" in \
        ov.daemon(host).log_text()


def test_flanneld_env_vars_and_sigint(ov, host):
    ov.put_config(ov.config)
    ov.start_daemon(host, env={"FLANNELD_IPTABLES_FORWARD_RULES": "false",
                               "FLANNELD_IP_MASQ": "true",
                               "FLANNELD_HEALTHZ_PORT": "10300"})   # the command line wins
    rules = ov.exec(host, ["iptables-save"]).stdout
    assert "FLANNEL-FWD" not in rules and "FLANNEL-POSTRTG" in rules
    assert ov.subnet_env(host)["FLANNEL_IPMASQ"] == "true"
    assert ov.healthz(host) == (200, "flanneld is running")
    assert ov.stop_daemon(host, sig=signal.SIGINT) == 0
    assert "FLANNEL-POSTRTG" in ov.exec(host, ["iptables-save"]).stdout   # kept, as flanneld


def test_etcd_down_at_start_waits_says_so_and_becomes_ready(ov, host):
    ov.stop_etcd()
    try:
        ov.start_daemon(host, wait=False)
        assert ov.wait_log(host, "is etcd running and are --etcd-endpoints right?", 20)
        time.sleep(3)
        d = ov.daemon(host)
        assert d.running() and d.ready_at is None
        # said when the reason changes, not at every 1 s retry
        assert d.log_text().count("cannot read the network config from etcd") <= 2
    finally:
        ov.start_etcd()
    ov.wait_ready(host, timeout=30)
    assert ov.healthz(host) == (200, "flanneld is running")


def _flannel_rules(ov, host) -> list[str]:
    out = ov.exec(host, ["iptables-save"]).stdout.splitlines()
    return sorted(line for line in out if "FLANNEL" in line and line.startswith("-A"))


def test_sigkill_then_restart_same_subnet_no_stale_tun_no_duplicate_rules(ov, host, engine_kind):
    args = ("-ip-masq",)
    ov.start_daemon(host, engine=engine_kind, args=args)
    subnet = ov.subnet(host)
    rules = _flannel_rules(ov, host)
    assert any("MASQUERADE" in r for r in rules) and any("FLANNEL-FWD" in r for r in rules)
    assert ov.stop_daemon(host, sig=signal.SIGKILL) == -signal.SIGKILL
    # the TUN went with the process (the kernel closed its fd); the rules stay, as after a crash
    assert ov.exec(host, ["ip", "link", "show", "flannel0"]).returncode != 0
    assert _flannel_rules(ov, host) == rules
    ov.start_daemon(host, engine=engine_kind, args=args)
    assert ov.subnet(host) == subnet                       # its lease, found by PublicIP
    assert _flannel_rules(ov, host) == rules               # the same rules, none twice
    assert ov.exec(host, ["ip", "-o", "link", "show", "type", "tun"]).stdout.count("flannel") == 1
    assert ov.stop_daemon(host) == 0
    assert _flannel_rules(ov, host) == rules               # kept at exit, as flanneld


def test_tun_deleted_under_the_daemon_exits_1_for_a_restart(ov, host, engine_kind):
    ov.start_daemon(host, engine=engine_kind)
    rules = _flannel_rules(ov, host)
    t0 = time.monotonic()
    ov.exec(host, ["ip", "link", "del", "flannel0"], check=True)
    assert ov.wait_exit(host, 10) == 1
    seconds = time.monotonic() - t0
    log = ov.daemon(host).log_text()
    assert "flannel0 was deleted from under the daemon" in log and "restarts" in log
    # the engines say so at once (on_end); polling TUNGETIFF every second took ~1.1 s
    assert seconds < 0.75, f"took {seconds:.2f} s to notice"
    print(f"{engine_kind}: exited {seconds * 1000:.0f} ms after ip link del")
    assert _flannel_rules(ov, host) == rules               # kept for the restart, as flanneld
    ov.start_daemon(host, engine=engine_kind)              # what a supervisor does next
    assert ov.exec(host, ["ip", "link", "show", "flannel0"]).returncode == 0
