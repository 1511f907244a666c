"""`flannel-udp status` and `flannel-udp cleanup` against daemons on simulated hosts, real etcd.

One overlay for the module: h0 runs the C engine, h1 the Python engine, both with
``--healthz-port 0`` (status must not need HTTP) and ``--ip-masq`` (both chains installed).
Each daemon answers on its own status socket (the testbed's per-host path). The not-ready
daemon and the host that leaves the overlay are added by their tests and removed after.
"""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from dataplane.host.child import cli_argv
from dataplane.testbed.wait import wait_for
from tests.conftest import ENGINES, require_overlay

pytestmark = [pytest.mark.root, pytest.mark.etcd]

DAEMON_ARGS = ("--healthz-port=0", "--ip-masq")


@pytest.fixture(scope="module")
def ov():
    require_overlay()
    from dataplane.testbed.overlay import Overlay
    overlay = Overlay(hosts=0, engine="c")
    try:
        for kind in ENGINES:
            overlay.add_host(engine=kind, args=DAEMON_ARGS, wait=False)
        for h in overlay.hosts:
            overlay.wait_ready(h)
        yield overlay
    finally:
        overlay.close()


def _host_of(ov, engine):
    return next(h for h in ov.hosts if ov.daemon(h).engine == engine)


def _cli(*args, timeout=30) -> subprocess.CompletedProcess:
    """The command from the test's own namespace: the status socket is a path, reachable from
    any namespace, as an operator's shell reaches the daemon's."""
    return subprocess.run(cli_argv(*args), capture_output=True, text=True, timeout=timeout)


def _cleanup(ov, h, *args) -> subprocess.CompletedProcess:
    """`cleanup` inside the host, with the daemon's own command line (as from its unit's
    environment file) and the host's socket paths."""
    run_flags = ov.daemon_command(h, "c")[1:]
    return ov.exec(h, cli_argv("cleanup", *run_flags, "--status-socket", ov.status_socket(h),
                               "--handover-socket", ov.handover_socket(h), *args), timeout=60)


def _firewall(ov, h) -> str:
    return "".join(ov.exec(h, ["iptables", "-t", t, "-S"], check=True).stdout
                   for t in ("nat", "filter"))


def _links(ov, h) -> str:
    return ov.exec(h, ["ip", "-o", "link", "show"], check=True).stdout


@pytest.mark.parametrize("engine", ENGINES)
def test_status_of_a_ready_daemon_without_http(ov, engine):
    h = _host_of(ov, engine)
    text = _cli("status", "--status-socket", ov.status_socket(h))
    assert text.returncode == 0, text.stdout + text.stderr
    subnet = str(ov.subnet(h))
    assert "ready" in text.stdout.splitlines()[0] and "NOT READY" not in text.stdout
    for want in (subnet, ov.subnet_file(h), "current", "subnets connected"):
        assert want in text.stdout, f"{want!r} not in:\n{text.stdout}"
    for row in (rf"engine +{engine} ", r"peers +1$"):
        assert re.search(rf"^ +{row}", text.stdout, re.M), f"{row!r} not in:\n{text.stdout}"

    js = _cli("status", "--json", "--status-socket", ov.status_socket(h))
    assert js.returncode == 0, js.stderr
    doc = json.loads(js.stdout)
    assert doc["ready"] is True and all(v is None for v in doc["checks"].values())
    assert doc["pid"] == ov.daemon(h).pid
    assert doc["lease"]["subnet"] == subnet
    assert doc["lease"]["public_ip"] == h.ip
    assert doc["lease"]["expiration"] > doc["time"]
    assert doc["subnet_file"] == {"path": ov.subnet_file(h), "current": True, "problem": None,
                                  "write_failures": 0}
    assert doc["engine"]["engine"] == engine
    assert doc["queues"] >= 1 and doc["peers"] == 1
    assert doc["etcd"]["connected"] is True and doc["etcd"]["watches"]["subnets"]["connected"]
    assert doc["etcd"]["endpoints"] == [ov.etcd_url]
    assert isinstance(doc["drops"], dict) and doc["drops"], "no drop reasons reported"
    assert isinstance(doc["warnings"], list)
    # the socket is root's only
    assert oct(os.stat(ov.status_socket(h)).st_mode & 0o777) == "0o600"


def test_status_answers_from_the_daemon_that_took_over(ov):
    h = _host_of(ov, "c")
    old = ov.daemon(h).pid
    new, rc = ov.handover_daemon(h)
    assert rc == 0
    # the old daemon exits after the new one bound the path anew: it must leave that one alone
    r = _cli("status", "--json", "--status-socket", ov.status_socket(h))
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["pid"] == new.pid != old


def test_status_of_a_daemon_without_a_lease_is_1_with_the_failing_checks(ov):
    # A prefix with no network config: the daemon waits for it, before any lease.
    h = ov.add_host(engine="c", args=(*DAEMON_ARGS, "--etcd-prefix=/fu-noconfig/network"),
                    wait=False)
    try:
        path = ov.status_socket(h)
        seen = []
        assert wait_for(lambda: seen.append(_cli("status", "--status-socket", path, timeout=15))
                        or seen[-1].returncode != 2, 20), "the waiting daemon never answered"
        r = seen[-1]
        assert r.returncode == 1, r.stdout + r.stderr
        assert "NOT READY" in r.stdout
        assert "[-] lease: no lease acquired yet" in r.stdout
        assert "[-] engine: not started yet" in r.stdout
        doc = json.loads(_cli("status", "--json", "--status-socket", path).stdout)
        assert doc["ready"] is False and doc["lease"] is None and doc["engine"] is None
        # the daemon says why it waits, and status shows its warnings
        assert wait_for(lambda: any("config" in w["message"] for w in json.loads(
            _cli("status", "--json", "--status-socket", path).stdout)["warnings"]), 10), \
            "the waiting daemon's warning is not in its status"
    finally:
        ov.remove_host(h, delete_lease=False)


def test_status_without_a_daemon_is_2(ov, tmp_path):
    r = _cli("status", "--status-socket", str(tmp_path / "nobody.sock"))
    assert r.returncode == 2
    assert "no daemon answers" in r.stderr and str(tmp_path / "nobody.sock") in r.stderr
    # a socket file a dead daemon left: nobody listens on it either
    import socket
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(tmp_path / "dead.sock"))
    dead.close()
    assert _cli("status", "--json", "--status-socket", str(tmp_path / "dead.sock")).returncode == 2


def test_cleanup_refuses_while_a_daemon_runs_then_removes_what_it_left(ov):
    h = ov.add_host(engine="c", args=DAEMON_ARGS)
    others = {s: ip for s, ip in ov.leases().items() if ip != h.ip}
    try:
        subnet = ov.subnet(h)
        rules = _firewall(ov, h)
        assert "FLANNEL-POSTRTG" in rules and "FLANNEL-FWD" in rules

        r = _cleanup(ov, h)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "a daemon runs on this host" in r.stderr and "status socket" in r.stderr
        assert _firewall(ov, h) == rules and os.path.exists(ov.subnet_file(h))

        assert ov.stop_daemon(h) == 0
        # SIGTERM keeps the rules, subnet.env and the lease (docs/operating.md#what-it-does);
        # flannel0 went with the daemon's fds, so a leftover one (kept by a persistent flag, as
        # a crashed daemon under systemd's fd store or another tool leaves it) is made here.
        ov.exec(h, ["ip", "tuntap", "add", "dev", "flannel0", "mode", "tun"], check=True)
        assert ov.leases().get(subnet) == h.ip

        dry = _cleanup(ov, h, "--dry-run", "--release-lease")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        key = f"{ov.prefix}/subnets/{subnet.network_address}-{subnet.prefixlen}"
        for want in ("-D POSTROUTING", "-X FLANNEL-POSTRTG", "-D FORWARD", "-X FLANNEL-FWD",
                     "ip link del flannel0", f"rm {ov.subnet_file(h)}", key):
            assert any(line.startswith("would: ") and want in line
                       for line in dry.stdout.splitlines()), f"{want!r} not in:\n{dry.stdout}"
        assert _firewall(ov, h) == rules
        assert "flannel0" in _links(ov, h)
        assert os.path.exists(ov.subnet_file(h))
        assert ov.leases().get(subnet) == h.ip

        done = _cleanup(ov, h)
        assert done.returncode == 0, done.stdout + done.stderr
        left = _firewall(ov, h)
        assert "FLANNEL" not in left and "flanneld" not in left, left
        assert "flannel0" not in _links(ov, h)
        assert not os.path.exists(ov.subnet_file(h))
        assert ov.leases().get(subnet) == h.ip, "the lease went without --release-lease"

        released = _cleanup(ov, h, "--release-lease")
        assert released.returncode == 0, released.stdout + released.stderr
        assert key in released.stdout
        leases = ov.leases()
        assert subnet not in leases
        assert {s: ip for s, ip in leases.items() if ip != h.ip} == others

        again = _cleanup(ov, h, "--release-lease")
        assert again.returncode == 0 and "nothing to clean up" in again.stdout, again.stdout

        # a dual-stack key (EnableIPv6) names both parts: that key is the one deleted
        dual = f"{key}&fc00:5:0:7::-64"
        grant = re.search(r"lease (\w+) granted", ov.etcdctl("lease", "grant", "600").stdout)
        ov.etcdctl("put", f"--lease={grant.group(1)}", dual,
                   json.dumps({"PublicIP": h.ip, "PublicIPv6": None}))
        released = _cleanup(ov, h, "--release-lease")
        assert released.returncode == 0 and f"delete the lease {dual}" in released.stdout, \
            released.stdout
        assert json.loads(ov.etcdctl("get", dual, "-w", "json").stdout).get("kvs") is None
    finally:
        ov.remove_host(h, delete_lease=False)
