"""The daemon's readiness and etcd health as /readyz and /metrics read them (no root, no etcd:
the daemon's parts are stand-ins with the attributes the real ones have)."""
from __future__ import annotations

import logging
import threading
import time
from ipaddress import IPv4Network
from types import SimpleNamespace

import pytest

from dataplane.daemon.main import Daemon
from dataplane.daemon.options import Options
from dataplane.engine import OFF_UDP_GRO, OFF_UDP_GSO
from dataplane.engine.api import Ended
from dataplane.host.family import Part
from dataplane.host.offload import Offloads


def watch(connected=True, reconnects=0, resyncs=0):
    ev = threading.Event()
    if connected:
        ev.set()
    return SimpleNamespace(connected=ev, reconnects=reconnects, resyncs=resyncs)


def lease_manager(expiration, own_watch=None, **counts):
    lease = SimpleNamespace(subnet=IPv4Network("10.5.3.0/24"), expiration=expiration)
    return SimpleNamespace(lease=lease, watch_loop=own_watch,
                           **{"renewals": 0, "renew_failures": 0, "reacquisitions": 0,
                              "races_lost": 0, **counts})


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(Options(subnet_file=str(tmp_path / "subnet.env")))
    d.state.subnet_env.want([Part(IPv4Network("10.5.0.0/16"), IPv4Network("10.5.3.0/24"))], 1472)
    d.state.lease_manager = lease_manager(time.time() + 3600, watch())
    d.state.engine = SimpleNamespace(ended=lambda: {})
    d.state.peer_watcher = SimpleNamespace(watch_loop=watch(reconnects=2, resyncs=1))
    d.state.config_watcher = SimpleNamespace(watch_loop=watch())
    d.state.phase = "running"           # READY=1 sent: a stopped queue is not one starting
    return d


def test_ready_when_lease_engine_and_watch_are_fine(daemon):
    assert daemon.source.readiness() == {"lease": None, "engine": None, "etcd_watch": None,
                                         "subnet_file": None}


def test_each_failing_check_says_why(daemon):
    daemon.state.peer_watcher.watch_loop.connected.clear()
    daemon.state.engine = SimpleNamespace(ended=lambda: {1: Ended("stopped")})
    daemon.state.lease_manager.lease.expiration = time.time() - 1
    r = daemon.source.readiness()
    assert "not connected to etcd" in r["etcd_watch"] and "2 reconnect" in r["etcd_watch"]
    assert r["engine"] == "queue(s) 1 stopped"
    assert r["lease"].startswith("lease 10.5.3.0/24 expired")
    daemon.state.dataplane.tun_name = "flannel0"
    daemon.state.engine = SimpleNamespace(ended=lambda: {0: Ended("tun_gone", 77)})
    assert daemon.source.readiness()["engine"] == "flannel0 was deleted"


def test_metrics_show_the_offloads_the_engine_runs_now(daemon):
    """/metrics' flannel_udp_offload_enabled follows the engine: UDP GSO it turned off (the
    kernel answered EIO) is 0 there, not what was decided at start."""
    daemon.state.offloads = Offloads("auto", "c")
    daemon.state.offloads.udp_gso = daemon.state.offloads.udp_gro = True
    in_use = [OFF_UDP_GSO | OFF_UDP_GRO]
    daemon.state.engine = SimpleNamespace(ended=lambda: {}, offloads_in_use=lambda: in_use[0])
    on = daemon.source.offloads_enabled()
    assert on["udp_gso"] and on["udp_gro"]
    in_use[0] = OFF_UDP_GRO
    on = daemon.source.offloads_enabled()
    assert not on["udp_gso"] and on["udp_gro"]
    assert daemon.state.offloads.enabled()["udp_gso"]           # as decided at start


def test_before_startup_nothing_is_ready():
    r = Daemon(Options()).source.readiness()
    assert all(why is not None for why in r.values())
    assert set(r) == {"lease", "engine", "etcd_watch", "subnet_file"}


def test_a_subnet_file_that_cannot_be_written_is_not_ready_until_it_is(tmp_path, caplog):
    """A write that failed leaves the file stale: /readyz and /metrics say so, the log says
    what workloads get, and the daemon's tick writes it as soon as it can."""
    caplog.set_level(logging.INFO)
    d = Daemon(Options(subnet_file=str(tmp_path / "run" / "subnet.env")))
    old, new = IPv4Network("10.5.3.0/24"), IPv4Network("10.5.9.0/24")
    net = IPv4Network("10.5.0.0/16")
    assert d.state.subnet_env.want([Part(net, old)], 1472)
    (tmp_path / "run").rename(tmp_path / "run.away")
    (tmp_path / "run").write_text("a file where the directory was\n")   # writes fail: ENOTDIR
    assert not d.state.subnet_env.want([Part(net, new)], 1472)
    for _ in range(5):
        assert not d.state.subnet_env.retry()
    why = d.source.readiness()["subnet_file"]
    assert "does not name the lease 10.5.9.0/24" in why and "retried" in why
    assert d.source.subnet_file() == (True, 6)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "will not start" in errors[0]   # no file it can read: said once
    (tmp_path / "run").unlink()
    (tmp_path / "run.away").rename(tmp_path / "run")
    # the old file is back in place: now the message would be about its subnet
    assert "still names 10.5.3.0/24" in d.state.subnet_env._consequence(new)
    assert d.state.subnet_env.retry()
    assert "FLANNEL_SUBNET=10.5.9.1/24" in (tmp_path / "run" / "subnet.env").read_text()
    assert d.source.readiness()["subnet_file"] is None and d.source.subnet_file() == (False, 6)
    assert any("recovered" in r.getMessage() for r in caplog.records)


def test_etcd_watches_and_lease_counts_survive_replacements(daemon):
    daemon.state.lease_manager.watch_loop.reconnects = 4
    w = daemon.source.etcd_watches()
    assert w["subnets"] == {"connected": True, "reconnects": 2, "resyncs": 1}
    assert w["own_lease"]["reconnects"] == 4
    daemon.state.lease_manager.renewals = 5
    assert daemon.source.lease_counts() == {"renewals": 5, "renew_failures": 0, "reacquisitions": 0,
                                            "races_lost": 0}
    # SIGHUP: a new lease manager, with a new own-lease watch, counting from 0 again
    daemon.state.lease_manager = lease_manager(time.time() + 3600, watch(reconnects=1), renewals=1)
    assert daemon.source.etcd_watches()["own_lease"]["reconnects"] == 5
    assert daemon.source.lease_counts()["renewals"] == 6
