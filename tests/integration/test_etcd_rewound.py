"""etcd restored from an older backup under a running peer watch (real etcd, no root).

The restored etcd is at a revision below the watch's cursor: a watch resumed from the cursor would
wait for revisions etcd hands out again with other contents, and would keep the leases written after
the backup, which are gone. The watch must see the rewind and list anew.
"""
from __future__ import annotations

import shutil
from ipaddress import IPv4Address, IPv4Network

import pytest

from dataplane.control.lease import LeaseAttrs
from dataplane.control.peers import PeerWatcher
from tests.conftest import wait_until
from tests.integration.conftest import reach_again

pytestmark = [pytest.mark.etcd]

OWN = IPv4Network("10.5.1.0/24")


def key(reg, third: int) -> str:
    return f"{reg.subnets_prefix}10.5.{third}.0-24"


def attrs(third: int) -> bytes:
    return LeaseAttrs(IPv4Address(f"192.168.77.{third}")).to_json()


def test_a_watch_lists_anew_when_etcd_was_restored_from_an_older_backup(etcd, make_registry,
                                                                         caplog):
    reg = make_registry(etcd)
    reg.put(key(reg, 2), attrs(2))
    w = PeerWatcher(reg, OWN, None, retry_interval=0.2)
    w.start()
    try:
        assert w.wait_ready(10)
        wait_until(lambda: set(w.peers()) == {IPv4Network("10.5.2.0/24")}, what="the first list")
        etcd.stop()
        backup = etcd.data_dir + ".backup"
        shutil.copytree(etcd.data_dir, backup)
        etcd.start()
        reach_again(reg)
        for third in (3, 4, 5, 6):           # written after the backup: gone after the restore
            reg.put(key(reg, third), attrs(third))
        wait_until(lambda: len(w.peers()) == 5, what="the watch to see the later leases")
        cursor = w.revision
        etcd.stop()
        shutil.rmtree(etcd.data_dir)
        shutil.move(backup, etcd.data_dir)
        etcd.start()
        reach_again(reg)
        reg.put(key(reg, 9), attrs(9))       # a revision the old cursor had seen already
        assert reg.current_revision() < cursor
        wait_until(lambda: set(w.peers()) == {IPv4Network("10.5.2.0/24"),
                                              IPv4Network("10.5.9.0/24")},
                   timeout=15, what=f"the peers of the restored etcd (have {sorted(w.peers())})")
        assert w.watch_loop.resyncs >= 1
        assert any("behind our cursor" in r.getMessage() for r in caplog.records)
    finally:
        w.stop()
