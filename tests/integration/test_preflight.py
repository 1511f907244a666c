"""A host that cannot run the daemon learns it before anything is written to etcd (root,
namespaces, a real etcd and the real daemon): each lack below makes `flannel-udp run` exit 1
naming it and its fix, with no key under the prefix's subnets/ (a lease written by a daemon that
cannot forward would hold a subnet for 24 hours).

::

      hN (netns, a new one per test)  flannel-udp run --iface <veth>   exits 1
       |                                  (setpriv / a read-only mount / a PATH wrapped around it)
      switch: etcd with the network config, and no lease ever
"""
from __future__ import annotations

import itertools
import os
import shutil

import pytest

from dataplane.testbed.overlay import Overlay
from tests.conftest import require, require_etcd, require_root
from tests.integration.daemon_checks import PortHolder

pytestmark = [pytest.mark.root, pytest.mark.etcd]

EXIT_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def ov():
    require_root()
    require_etcd()
    overlay = Overlay(hosts=0)
    try:
        yield overlay
    finally:
        overlay.close()


_names = itertools.count()


@pytest.fixture
def host(ov):
    """A host of its own, named anew: its directory, and the log there, hold this test's daemon
    only (a removed host's index, and with it its default name, is given again)."""
    h = ov.add_host(start=False, name=f"p{next(_names)}")
    try:
        yield h
    finally:
        ov.remove_host(h, delete_lease=False)


def refused(ov, host, monkeypatch, *, args=(), env=None, wrap=()) -> str:
    """Run the daemon on ``host`` (its argv after ``wrap``): it must exit 1 with nothing under
    subnets/; returns its log."""
    if wrap:
        argv = ov.daemon_argv
        monkeypatch.setattr(ov, "daemon_argv", lambda h, e, a=(): [*wrap, *argv(h, e, a)])
    d = ov.start_daemon(host, args=args, env=env, wait=False)
    rc = ov.wait_exit(host, EXIT_TIMEOUT_S)
    log = d.log_text()
    assert rc == 1, f"exit status {rc}:\n{log[-3000:]}"
    assert "nothing was written to etcd" in log, log[-3000:]
    keys = ov.etcdctl("get", "--prefix", "--keys-only", f"{ov.prefix}/subnets/").stdout
    assert keys.strip() == "", f"keys under subnets/: {keys}\n{log[-3000:]}"
    assert "Lease acquired" not in log
    return log


def test_udp_port_taken_in_the_namespace(ov, host, monkeypatch):
    with PortHolder(ov, host):
        log = refused(ov, host, monkeypatch)
    # read after the config (which names the port), and flannel0 never made
    assert log.index("Network config:") < log.index(f"UDP {host.ip}:8285")
    assert "is in use" in log and "still running" in log
    assert "Opened flannel0" not in log


def test_subnet_file_under_a_regular_file(ov, host, monkeypatch):
    blocker = os.path.join(ov.tb.workdir, f"{host.name}-a-file")
    with open(blocker, "w") as f:
        f.write("not a directory\n")
    log = refused(ov, host, monkeypatch,
                  args=("--subnet-file", os.path.join(blocker, "flannel", "subnet.env")))
    assert f"{blocker} is not a directory" in log and "--subnet-file" in log


def test_subnet_file_under_a_read_only_bind_mount(ov, host, monkeypatch):
    ro = os.path.join(ov.tb.workdir, f"{host.name}-ro")
    os.makedirs(ro)
    # `ip netns exec` gives the daemon a mount namespace of its own (a slave of the machine's):
    # the read-only bind mount made there goes with it
    wrap = ["sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && '
            'exec "$@"', ro]
    log = refused(ov, host, monkeypatch, wrap=wrap,
                  args=("--subnet-file", os.path.join(ro, "subnet.env")))
    assert f"writing in {ro} failed: a read-only file system" in log
    assert os.listdir(ro) == []


def test_ip_masq_without_a_firewall_tool_on_the_path(ov, host, monkeypatch):
    # host/firewall.py finds iptables and nft on the PATH; `ip` stays for `ip netns exec`
    bin_dir = os.path.join(ov.tb.workdir, f"{host.name}-bin")
    os.makedirs(bin_dir)
    os.symlink(shutil.which("ip"), os.path.join(bin_dir, "ip"))
    log = refused(ov, host, monkeypatch, args=("--ip-masq",), env={"PATH": bin_dir})
    assert "--ip-masq needs iptables or nftables" in log and "apt-get install iptables" in log


def test_ip_masq_with_enable_ipv6_and_iptables_but_no_ip6tables(ov, host, monkeypatch):
    """iptables alone (no ip6tables, no nft): the IPv4 rules could go in, the IPv6 ones not, which
    is known only once the config says EnableIPv6, still before the lease."""
    bin_dir = os.path.join(ov.tb.workdir, f"{host.name}-bin")
    os.makedirs(bin_dir)
    for tool in ("ip", "iptables", "iptables-save", "iptables-restore"):
        os.symlink(shutil.which(tool), os.path.join(bin_dir, tool))
    ov.put_config(dict(ov.config, EnableIPv6=True, IPv6Network="fc00:7::/56"))
    try:
        log = refused(ov, host, monkeypatch, args=("--ip-masq",), env={"PATH": bin_dir})
    finally:
        ov.put_config(ov.config)
    assert "--ip-masq for the IPv6Network fc00:7::/56" in log, log[-3000:]
    assert "neither `ip6tables` nor `nft`" in log and "apt-get install iptables" in log


def test_root_without_cap_net_admin(ov, host, monkeypatch):
    setpriv = shutil.which("setpriv")
    require(setpriv is not None, "needs setpriv (util-linux)")
    # root keeps its uid, but a bounding set without CAP_NET_ADMIN (and no inheritable caps)
    # leaves it out of what the daemon's exec gets, as CapabilityBoundingSet= or
    # `docker --cap-drop` would
    wrap = [setpriv, "--inh-caps=-all", "--bounding-set=-net_admin", "--"]
    log = refused(ov, host, monkeypatch, wrap=wrap)
    assert "running as root without CAP_NET_ADMIN" in log and "CapabilityBoundingSet=" in log
    # said before etcd was asked anything
    assert "Network config:" not in log
