"""A lease move that fails halfway (daemon/lease_move.py): logged with what to do, counted, retried
on the next tick from where it stopped, and never leaving the daemon with a closed engine.

The daemon is the real one with its host parts faked: netlink (flannel0's address and route), the
engine factory and the peer watcher. What the real kernel or etcd would add is covered by
tests/integration/test_lease_move.py (a move that succeeds).
"""
from __future__ import annotations

import errno
import ipaddress
import logging
import os
from types import SimpleNamespace

import pytest

from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.control.peerset import PeerChange, PeerSnapshot
from dataplane.daemon import lease_move, startup
from dataplane.daemon.main import Daemon
from dataplane.daemon.metrics import make_registry
from dataplane.daemon.state import DaemonSource
from dataplane.daemon.options import Options
from dataplane.daemon.peer_log import PeerLog

OLD, NEW = ipaddress.IPv4Network("10.5.3.0/24"), ipaddress.IPv4Network("10.5.9.0/24")
PEER = ipaddress.IPv4Network("10.5.4.0/24")
ME = ipaddress.IPv4Address("192.168.77.1")


def lease(subnet, ip=ME):
    return Lease(subnet, LeaseAttrs(ip), expiration=None)


class FakeTable(tuple):
    """A route table as the daemon keeps it (table_type.of / updated), as a tuple of Routes."""

    @classmethod
    def of(cls, routes=()):
        return cls(routes)

    def updated(self, removed=(), added=()):
        gone = set(removed) | {r.subnet for r in added}
        return FakeTable([r for r in self if r.subnet not in gone] + list(added))


class FakeEngine:
    name = "python"
    table_type = FakeTable

    def __init__(self, fail_start=None):
        self.fail_start = fail_start
        self.started = self.closed = False
        self.routes = None

    def start(self):
        if self.fail_start:
            raise self.fail_start
        self.started = True

    def close(self):
        self.closed = True

    def set_routes(self, routes):
        self.routes = tuple(routes)

    def set_table(self, table):
        self.routes = tuple(table)

    def stats(self):
        return {}

    def __len__(self):
        return 1


class FakeWatcher:
    """set_own_subnet reports the snapshot for the new subnet, as the real watcher does."""

    bad_total = 0
    watch_loop = None

    def __init__(self, daemon):
        self.daemon = daemon

    def bad(self):
        return {}

    def set_own_subnet(self, subnet):
        leases = [lease(PEER, ipaddress.IPv4Address("192.168.77.2")), lease(subnet)]
        self.daemon.peer_routes.on_peers(PeerChange(PeerSnapshot.of(leases, subnet)))


class Host:
    """flannel0's addresses and routes as netlink would keep them; `fail` holds the errors the
    next calls raise, by function name."""

    def __init__(self, monkeypatch):
        self.addrs = {f"{OLD.network_address}/32"}
        self.routes = {"10.5.0.0/16"}
        self.fail = {}
        from dataplane.host import netconf
        for name in ("configure_tun", "remove_address", "add_network_route"):
            monkeypatch.setattr(netconf, name, getattr(self, name))

    def _maybe_fail(self, name):
        errs = self.fail.get(name)
        if errs:
            raise errs.pop(0)

    def configure_tun(self, dev, addr, mtu):
        self._maybe_fail("configure_tun")
        self.addrs.add(addr)

    def remove_address(self, dev, addr):
        self._maybe_fail("remove_address")
        if addr not in self.addrs:
            raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
        self.addrs.discard(addr)
        if not self.addrs:
            self.routes.clear()

    def add_network_route(self, network, dev):
        self._maybe_fail("add_network_route")
        self.routes.add(str(network))
        return True


class Factory:
    """startup.new_engine: each call takes the next item of `script` (an exception to raise, or
    the start error of the engine it makes), then makes engines that work."""

    def __init__(self, monkeypatch, *script):
        self.script = list(script)
        self.made = []
        monkeypatch.setattr(startup, "new_engine", self)

    def __call__(self, cls, opts, tun_fds, sockets, subnets, mtu, offload_flags, own_sources):
        step = self.script.pop(0) if self.script else None
        if isinstance(step, startup.StartupError):
            raise step
        engine = FakeEngine(fail_start=step)
        engine.subnet = subnets[0]
        self.made.append(engine)
        return engine


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    d = Daemon(Options(subnet_file=str(tmp_path / "subnet.env")))
    d.state.lease = lease(OLD)
    d.state.ext = SimpleNamespace(tun_mtu=1472)
    d.state.config = SimpleNamespace(network=ipaddress.IPv4Network("10.5.0.0/16"),
                                     backend_port=8285, ipv6_network=None,
                                     enable_ipv6=False)
    d.state.dataplane.tun_name = "flannel0"
    d.state.engine = FakeEngine()
    d.state.engine.start()
    d.state.engine_cls = FakeEngine
    d.peer_routes.peer_log = PeerLog(8285)
    d.state.peer_watcher = FakeWatcher(d)
    return d


def failures_metric(d) -> float:
    reg = make_registry(DaemonSource(d.state))
    return reg.get_sample_value("flannel_udp_lease_move_failures_total")


def _tick(d):
    """What the serve loop does with a pending lease on each monitor tick."""
    with d.state.lock:
        pending, d.lease_keeper.pending = d.lease_keeper.pending, None
    if pending is not None:
        d.lease_keeper.move_to(pending)


def adopt(d, new) -> bool:
    """One attempt of the daemon to take ``new``: True when it did (the host is on its subnet),
    False when the move failed (it is pending again, for the next tick)."""
    with d.state.lock:
        d.lease_keeper.pending = None
    d.lease_keeper.move_to(new)
    return d.lease_keeper.pending is None and d.state.lease is new


def test_engine_factory_failing_once_keeps_the_old_engine_running_then_moves(daemon, monkeypatch,
                                                                            caplog):
    caplog.set_level(logging.INFO)
    host = Host(monkeypatch)
    Factory(monkeypatch, startup.StartupError("failed to create the python engine: EMFILE"))
    old_engine = daemon.state.engine
    daemon.lease_keeper.move_to(lease(NEW))
    assert daemon.state.engine is old_engine and old_engine.started and not old_engine.closed
    assert daemon.state.lease.subnet == OLD and daemon.lease_keeper.pending.subnet == NEW
    assert failures_metric(daemon) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "EMFILE" in errors[0] and "old engine keeps forwarding" in errors[0]
    assert not os.path.exists(daemon.state.opts.subnet_file)

    _tick(daemon)                                 # the next monitor tick: the move completes
    assert daemon.state.lease.subnet == NEW and daemon.lease_keeper.pending is None
    engine = daemon.state.engine
    assert engine is not old_engine and engine.started and old_engine.closed
    assert daemon.state.engine.subnet == NEW
    assert [str(r.subnet) for r in daemon.state.engine.routes] == [str(PEER)]
    assert host.addrs == {f"{NEW.network_address}/32"} and host.routes == {"10.5.0.0/16"}
    assert "FLANNEL_SUBNET=10.5.9.1/24" in open(daemon.state.opts.subnet_file).read()
    assert "recovered after" in caplog.text and "the host is on 10.5.9.0/24" in caplog.text
    assert failures_metric(daemon) == 1


def test_engine_that_does_not_start_is_closed_and_the_old_one_kept_with_the_new_table(
        daemon, monkeypatch, caplog):
    Host(monkeypatch)
    factory = Factory(monkeypatch, OSError(errno.ENOMEM, "Cannot allocate memory"))
    old_engine = daemon.state.engine
    assert not adopt(daemon, lease(NEW))
    failed = factory.made[0]
    assert failed.closed and not failed.started
    assert daemon.state.engine is old_engine and not old_engine.closed
    # the old engine forwards with the table for the new subnet (the watcher's last report)
    assert [str(r.subnet) for r in old_engine.routes] == [str(PEER)]
    assert "did not start" in caplog.text and "restart the daemon" in caplog.text
    assert adopt(daemon, lease(NEW))
    engine = daemon.state.engine
    assert engine is factory.made[1] and engine.started and old_engine.closed


def test_netlink_failure_moves_nothing_and_is_retried(daemon, monkeypatch, caplog):
    host = Host(monkeypatch)
    factory = Factory(monkeypatch)
    moved_rules = []
    daemon.state.rules = SimpleNamespace(update_subnet=lambda subnets: moved_rules.append(subnets[0]))
    host.fail["configure_tun"] = [OSError(errno.EPERM, "Operation not permitted")] * 3
    old_engine = daemon.state.engine
    daemon.lease_keeper.move_to(lease(NEW))
    _tick(daemon)
    _tick(daemon)
    assert failures_metric(daemon) == 3 and daemon.lease_keeper.pending.subnet == NEW
    assert host.addrs == {f"{OLD.network_address}/32"} and moved_rules == [] and factory.made == []
    assert daemon.state.engine is old_engine and not old_engine.closed
    # one error line for three attempts with the same reason, saying what to check
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "CAP_NET_ADMIN" in errors[0] and "ip addr show flannel0" in errors[0]
    _tick(daemon)
    assert daemon.state.lease.subnet == NEW and moved_rules == [NEW] and old_engine.closed
    assert host.addrs == {f"{NEW.network_address}/32"}


def test_route_failure_after_the_address_moved_is_finished_by_the_retry(daemon, monkeypatch):
    host = Host(monkeypatch)
    Factory(monkeypatch)
    host.fail["add_network_route"] = [OSError(errno.ENOBUFS, "No buffer space available")]
    assert not adopt(daemon, lease(NEW))
    assert host.addrs == {f"{NEW.network_address}/32"} and daemon.state.lease.subnet == OLD
    assert adopt(daemon, lease(NEW))       # the old address is gone already: fine
    assert host.routes == {"10.5.0.0/16"} and daemon.state.lease.subnet == NEW


def test_a_newer_lease_wins_over_the_retry(daemon, monkeypatch):
    Host(monkeypatch)
    Factory(monkeypatch, startup.StartupError("no engine"))
    newest = lease(ipaddress.IPv4Network("10.5.11.0/24"))
    lease_move_move = lease_move.move

    def move_while_the_manager_hands_over_another(*args):
        daemon.lease_keeper.on_lease_change(newest)            # the lease manager's thread, meanwhile
        return lease_move_move(*args)
    monkeypatch.setattr(lease_move, "move", move_while_the_manager_hands_over_another)
    daemon.lease_keeper.move_to(lease(NEW))
    assert daemon.lease_keeper.pending is newest


def test_unexpected_error_is_logged_and_counted_not_raised(daemon, monkeypatch, caplog):
    Host(monkeypatch)
    Factory(monkeypatch)

    def broken(subnet):
        raise KeyError("bug")
    daemon.state.peer_watcher.set_own_subnet = broken
    old_engine = daemon.state.engine
    assert not adopt(daemon, lease(NEW))
    assert daemon.state.engine is old_engine and not old_engine.closed
    assert failures_metric(daemon) == 1 and "did not start" in caplog.text


def test_same_subnet_changes_nothing(daemon, monkeypatch):
    Host(monkeypatch)
    factory = Factory(monkeypatch)
    renewed = Lease(OLD, LeaseAttrs(ME), expiration=1e9, lease_id=7)
    assert adopt(daemon, renewed)
    assert daemon.state.lease is renewed and factory.made == [] and failures_metric(daemon) == 0
