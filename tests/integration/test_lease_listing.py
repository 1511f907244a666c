"""A start lists the leases once: the acquisition's listing is the peer watch's first table.

With 16,000 leases a listing is the start's largest cost (etcd's answer, a parse of every key and
value); the lease manager keeps the one it chose from (LeaseManager.take_listing) and the peer
watch starts from it and watches from its revision on, so that what was written after it (our own
key, a peer's) still comes in as events.
"""
from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from dataplane.control.lease import LeaseAttrs
from dataplane.control.lease_manager import LeaseManager
from dataplane.control.peers import PeerWatcher
from dataplane.control.registry import Registry
from tests.conftest import wait_until

pytestmark = pytest.mark.etcd
NETWORK = IPv4Network("10.5.0.0/16")
ME = IPv4Address("192.168.77.1")


class CountingRegistry(Registry):
    """A registry that counts its listings of every lease (gets of the subnets prefix)."""

    listings = 0

    def get(self, key, prefix=False):
        if prefix and key == self.subnets_prefix:
            self.listings += 1
        return super().get(key, prefix=prefix)


def peer(i: int) -> tuple[IPv4Network, LeaseAttrs]:
    return IPv4Network(f"10.5.{100 + i}.0/24"), LeaseAttrs(IPv4Address(f"192.168.78.{i + 1}"))


def test_the_peer_watch_starts_from_the_acquisitions_listing(shared_etcd, make_registry):
    base = make_registry(shared_etcd)
    for i in range(20):
        base.create_lease(*peer(i), ttl=600)
    reg = CountingRegistry([shared_etcd.client_url], prefix=base.prefix)
    watcher = None
    try:
        mgr = LeaseManager(reg, ME, config=reg.get_config())
        lease = mgr.acquire()
        listing = mgr.take_listing()
        assert mgr.take_listing() is None                    # handed on once, then let go
        leases, bad, rev = listing
        assert len(leases) == 20 and not bad and reg.listings == 1
        assert lease.mod_revision > rev                      # ours was written after it
        base.create_lease(*peer(20), ttl=600)                # a peer's, after it too
        reports = []
        watcher = PeerWatcher(reg, lease.subnet, reports.append, network=NETWORK, listing=listing)
        watcher.start()
        assert watcher.wait_ready(10)
        wait_until(lambda: len(watcher.snapshot()) == 21, timeout=10,
                   what="the peer written after the listing, from the watch")
        assert lease.subnet not in watcher.peers()
        assert reg.listings == 1                             # listed once, by the allocation
    finally:
        if watcher is not None:
            watcher.stop()
        reg.close()
