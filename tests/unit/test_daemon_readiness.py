"""The daemon's readiness and etcd health as /readyz and /metrics read them (no root, no etcd:
the daemon's parts are stand-ins with the attributes the real ones have)."""
from __future__ import annotations

import threading
import time
from ipaddress import IPv4Network
from types import SimpleNamespace

import pytest

from dataplane.cli.flanneld_flags import Options
from dataplane.daemon.main import Daemon


def watch(connected=True, reconnects=0, resyncs=0):
    ev = threading.Event()
    if connected:
        ev.set()
    return SimpleNamespace(connected=ev, reconnects=reconnects, resyncs=resyncs)


def subnet_manager(expiration, own_watch=None, **counts):
    lease = SimpleNamespace(subnet=IPv4Network("10.5.3.0/24"), expiration=expiration)
    return SimpleNamespace(lease=lease, watch_loop=own_watch,
                           **{"renewals": 0, "reacquisitions": 0, "races_lost": 0, **counts})


@pytest.fixture
def daemon():
    d = Daemon(Options())
    d.subnets = subnet_manager(time.time() + 3600, watch())
    d.engine = SimpleNamespace(ended=lambda: [])
    d.peer_watcher = SimpleNamespace(watch_loop=watch(reconnects=2, resyncs=1))
    d.config_watcher = SimpleNamespace(watch_loop=watch())
    return d


def test_ready_when_lease_engine_and_watch_are_fine(daemon):
    assert daemon.source.readiness() == {"lease": None, "engine": None, "etcd_watch": None}


def test_each_failing_check_says_why(daemon):
    daemon.peer_watcher.watch_loop.connected.clear()
    daemon.engine = SimpleNamespace(ended=lambda: [1])
    daemon.subnets.lease.expiration = time.time() - 1
    r = daemon.source.readiness()
    assert "not connected to etcd" in r["etcd_watch"] and "2 reconnect" in r["etcd_watch"]
    assert r["engine"] == "queue(s) 1 stopped"
    assert r["lease"].startswith("lease 10.5.3.0/24 expired")


def test_before_startup_nothing_is_ready():
    r = Daemon(Options()).source.readiness()
    assert all(why is not None for why in r.values()) and set(r) == {"lease", "engine", "etcd_watch"}


def test_etcd_watches_and_lease_counts_survive_replacements(daemon):
    daemon.subnets.watch_loop.reconnects = 4
    w = daemon.source.etcd_watches()
    assert w["subnets"] == {"connected": True, "reconnects": 2, "resyncs": 1}
    assert w["own_lease"]["reconnects"] == 4
    daemon.subnets.renewals = 5
    assert daemon.source.lease_counts() == {"renewals": 5, "reacquisitions": 0, "races_lost": 0}
    # SIGHUP: a new subnet manager, with a new own-lease watch, counting from 0 again
    daemon.subnets = subnet_manager(time.time() + 3600, watch(reconnects=1), renewals=1)
    assert daemon.source.etcd_watches()["own_lease"]["reconnects"] == 5
    assert daemon.source.lease_counts()["renewals"] == 6
