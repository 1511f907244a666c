"""etcd testbed: a 3-member cluster on loopback (the client fails over), and etcd inside a namespace."""
from __future__ import annotations

import time
from ipaddress import IPv4Address, IPv4Network

import pytest

from dataplane.control.lease import LeaseAttrs
from dataplane.control.peers import PeerWatcher
from dataplane.control.lease_manager import LeaseManager
from dataplane.testbed.etcd import EtcdCluster
from tests.conftest import require_etcd, wait_until

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


@pytest.fixture
def cluster():
    require_etcd()
    c = EtcdCluster(3)
    try:
        c.start()
        yield c
    finally:
        c.close()


def test_failover_keeps_acquiring_renewing_and_watching(cluster, make_registry):
    reg = make_registry(cluster)                    # all three endpoints
    other = make_registry(cluster, prefix=reg.prefix, config=None)
    mgr = LeaseManager(reg, "192.168.77.1", lease_ttl=4, renew_margin_s=3.0, retry_interval=0.3,
                      watch_retry_interval=0.3)
    own = mgr.acquire()
    mgr.start()
    watcher = PeerWatcher(reg, own.subnet, None, retry_interval=0.3)
    watcher.start()
    try:
        assert watcher.wait_ready(10)
        peer1 = LeaseManager(other, "192.168.77.2").acquire()
        wait_until(lambda: peer1.subnet in watcher.peers(), what="first peer")

        in_use = reg.endpoints.index(reg.current_endpoint)
        cluster.stop_member(in_use, kill=True)
        t0 = time.monotonic()
        # Unary calls fail over to a live member...
        assert reg.get_config().network == IPv4Network("10.5.0.0/16")
        assert reg.current_endpoint != cluster.members[in_use].client_url
        # ...a third node joins through the other client (which may also have used the dead member)...
        peer2 = LeaseManager(other, "192.168.77.3").acquire()
        # ...and the watch resumes on a live member without losing the event.
        wait_until(lambda: peer2.subnet in watcher.peers(), timeout=15, what="peer seen after failover")
        print(f"\nwatch failed over in {time.monotonic() - t0:.2f}s")
        renewals = mgr.renewals
        wait_until(lambda: mgr.renewals >= renewals + 2, timeout=10, what="renewals after failover")
        assert mgr.lease.subnet == own.subnet and mgr.reacquisitions == 0

        # The stopped member comes back and catches up; then another member goes away.
        cluster.start_member(in_use)
        second = reg.endpoints.index(reg.current_endpoint)
        cluster.stop_member(second)
        reg.put(f"{reg.subnets_prefix}10.5.250.0-24", LeaseAttrs(IPv4Address("192.168.77.4")).to_json())
        wait_until(lambda: IPv4Network("10.5.250.0/24") in watcher.peers(), timeout=15,
                   what="peer seen after second failover")
        leases, _ = reg.list_leases()
        assert {l.subnet for l in leases} - {own.subnet} == set(watcher.peers())
    finally:
        watcher.stop()
        mgr.stop()


def test_server_inside_a_namespace_on_an_underlay_address():
    """The testbed runs etcd inside a namespace on an underlay address; reach it from that namespace."""
    import os
    import subprocess

    from dataplane.testbed.etcd import EtcdServer
    from tests.conftest import require_root

    require_etcd()
    require_root()
    ns = f"fu-etcd-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", ns, "addr", "add", "192.168.250.1/24", "dev", "lo"], check=True)
        with EtcdServer(host="192.168.250.1", netns=ns) as etcd:
            assert etcd.client_url.startswith("http://192.168.250.1:")
            etcd.etcdctl("put", "/fu/k", "v")
            rev = etcd.revision()
            assert rev >= 2 and etcd.compact() == rev
            pid = etcd.pid
            etcd.restart()
            assert etcd.pid != pid and etcd.revision() == rev
            r = etcd.etcdctl("get", "/fu/k", "--print-value-only")
            assert r.stdout.strip() == "v"
        assert not os.path.exists(etcd.base_dir)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
