"""Lease events are coalesced: the peer watcher reports a burst in a few batches, each the net change
of its events in order; the daemon logs a burst as a summary (no etcd, no root)."""
from __future__ import annotations

import logging
import threading
import time
from ipaddress import IPv4Address, IPv4Network

import pytest

from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.control.peers import PeerWatcher
from dataplane.control.peerset import PeerChange, PeerSnapshot
from dataplane.control.etcd_watch import WatchEvent
from dataplane.daemon.peer_log import BUDGET, PeerLog

PREFIX = "/coreos.com/network/subnets/"
OWN = IPv4Network("10.5.1.0/24")


def subnet(i: int) -> IPv4Network:
    return IPv4Network((0x0A050000 + (i << 8), 24))


def put(i: int, ip: str, rev: int) -> WatchEvent:
    value = LeaseAttrs(IPv4Address(ip)).to_json()
    return WatchEvent("put", f"{PREFIX}{subnet(i).network_address}-24", value, rev, 0)


def delete(i: int, rev: int) -> WatchEvent:
    return WatchEvent("delete", f"{PREFIX}{subnet(i).network_address}-24", b"", rev, 0)


class _Loop:
    def __init__(self):
        self.done = threading.Event()

    def run(self):
        self.done.wait(30)

    def cancel(self):
        self.done.set()


class FakeRegistry:
    """The list answers ``leases``; the watch is driven by the test through ``send``."""
    subnets_prefix = PREFIX

    def __init__(self, leases=()):
        self.leases = list(leases)
        self.on_events = None
        self.watching = threading.Event()

    def scan_leases(self):
        return list(self.leases), [], 10

    def watch_loop(self, key, *, prefix, start_revision, on_events, on_compacted, retry_interval, name):
        self.on_events = on_events
        self.start_revision = start_revision
        self.watching.set()
        return _Loop()

    def send(self, *events):
        self.on_events(list(events), events[-1].mod_revision)

    def add_note(self, note):             # what an outage's log lines add: no outage here
        pass

    def remove_note(self, note):
        pass


class Reports:
    def __init__(self):
        self.changes: list[PeerChange] = []
        self.cond = threading.Condition()

    def __call__(self, change):
        with self.cond:
            self.changes.append(change)
            self.cond.notify_all()

    def wait(self, n, timeout=5.0):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.changes) >= n, timeout), self.changes
            return self.changes[n - 1]


@pytest.fixture
def watch():
    started = []

    def start(leases=(), coalesce=60.0):
        """A running watcher whose publisher waits ``coalesce`` s (the tests call flush)."""
        reg, reports = FakeRegistry(leases), Reports()
        w = PeerWatcher(reg, OWN, reports, coalesce=coalesce)
        w.start()
        started.append(w)
        assert w.wait_ready(5) and reg.watching.wait(5)
        return w, reg, reports
    yield start
    for w in started:
        w.stop()


def names(leases):
    return [(str(l.subnet), str(l.public_ip)) for l in leases]


def test_a_burst_is_one_report(watch):
    w, reg, reports = watch(coalesce=1.0)   # 300 sends fit in it on a loaded machine too
    n_before = len(reports.changes)
    for i in range(2, 302):                     # 300 responses, one event each
        reg.send(put(i, f"192.168.{i // 250}.{i % 250 + 1}", 100 + i))
    change = reports.wait(n_before + 1)
    w.flush()                                   # what the publisher left unreported comes now
    assert len(reports.changes) == n_before + 1        # one report for the whole burst
    assert len(change.added) == 300 and not change.removed
    assert len(change.snapshot) == 300 and w.revision == 401 and w.batches == 1


def test_a_batch_reports_the_net_change_of_its_events_in_order(watch):
    first = [Lease(subnet(2), LeaseAttrs(IPv4Address("192.168.1.2"))),
             Lease(subnet(4), LeaseAttrs(IPv4Address("192.168.1.4")))]
    w, reg, reports = watch(first)
    reg.send(put(3, "192.168.1.3", 11), delete(2, 12), put(2, "192.168.1.9", 13))
    reg.send(delete(4, 14))
    reg.send(put(3, "192.168.1.33", 15))         # the later value of a subnet wins
    reg.send(put(5, "192.168.1.5", 16), delete(5, 17))   # came and went: nothing to say
    w.flush()
    change = reports.changes[-1]
    assert names(change.added) == [("10.5.2.0/24", "192.168.1.9"), ("10.5.3.0/24", "192.168.1.33")]
    assert names(change.removed) == [("10.5.4.0/24", "192.168.1.4")]
    assert change == PeerChange.between(PeerSnapshot.of(first, OWN), w.snapshot())


def test_nothing_to_report_reports_nothing(watch):
    w, reg, reports = watch([Lease(subnet(2), LeaseAttrs(IPv4Address("192.168.1.2")))])
    n = len(reports.changes)
    reg.send(put(2, "192.168.1.2", 11))          # a renewal
    reg.send(put(7, "192.168.1.7", 12), delete(7, 13))
    reg.send(put(1, "192.168.1.1", 14))          # our own subnet is no peer
    w.flush()
    assert len(reports.changes) == n


def test_a_batch_that_moves_no_peer_keeps_the_snapshot(watch):
    """A renewal, or our own key's put: the watcher keeps the snapshot it reported, which the
    daemon holds too (not a second copy of the whole table until the next change)."""
    w, reg, reports = watch([Lease(subnet(2), LeaseAttrs(IPv4Address("192.168.1.2")))])
    before = w.snapshot()
    reg.send(put(2, "192.168.1.2", 11), put(1, "192.168.1.1", 12))
    w.flush()
    assert w.snapshot() is before
    reg.send(put(3, "192.168.1.3", 13))
    w.flush()
    assert w.snapshot() is not before and reports.changes[-1].snapshot is w.snapshot()
    assert sorted(map(str, w.peers())) == ["10.5.2.0/24", "10.5.3.0/24"]


def test_a_lone_event_is_reported_without_waiting_for_more(watch):
    w, reg, reports = watch(coalesce=0.005)
    n = len(reports.changes)
    reg.send(put(9, "192.168.1.9", 11))
    change = reports.wait(n + 1)                # no flush, no further event
    assert names(change.added) == [("10.5.9.0/24", "192.168.1.9")] and w.batches == 1


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def lease(i: int) -> Lease:
    return Lease(IPv4Network((0x0A800000 + (i << 8), 24)), LeaseAttrs(IPv4Address(0xAC100000 + i)))


def info(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]


def test_rare_changes_get_a_line_per_lease_at_once(caplog):
    clock = Clock()
    plog = PeerLog(8285, clock=clock)
    with caplog.at_level(logging.INFO, logger="dataplane.daemon.peer_log"):
        plog.record(PeerChange(PeerSnapshot(), (lease(1),), ()), 5)
        clock.t += 0.3
        plog.record(PeerChange(PeerSnapshot(), (), (lease(1),)), 4)
    assert info(caplog) == ["Subnet added: 10.128.1.0/24 via 172.16.0.1:8285; 5 peer(s) in the route table",
                            "Subnet removed: 10.128.1.0/24 (was via 172.16.0.1); 4 peer(s) in the route table"]


def test_a_burst_is_summarised_once_per_window(caplog):
    clock = Clock()
    plog = PeerLog(8285, clock=clock)
    with caplog.at_level(logging.DEBUG, logger="dataplane.daemon.peer_log"):
        for b in range(50):                     # 50 reports of 20 adds within 0.5 s
            plog.record(PeerChange(PeerSnapshot(), tuple(lease(b * 20 + i) for i in range(20)), ()),
                        100 + 20 * (b + 1))
            clock.t += 0.01
        plog.record(PeerChange(PeerSnapshot(), (), (lease(0), lease(1))), 1098)
        assert info(caplog) == []               # the window is not over
        clock.t += 1.0
        plog.tick()
        plog.tick()
    [line] = info(caplog)
    assert line.startswith("Peers changed: 1000 added (10.128.0.0/24 via 172.16.0.0, "
                           "10.128.1.0/24 via 172.16.0.1, 10.128.2.0/24 via 172.16.0.2, ..., ")
    assert "10.131.229.0/24 via 172.16.3.229, 10.131.230.0/24 via 172.16.3.230, " \
           "10.131.231.0/24 via 172.16.3.231); 2 removed (10.128.0.0/24, 10.128.1.0/24)" in line
    assert line.endswith("in 51 update(s) over 0.50 s; 1098 peer(s) in the route table")
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 1002                   # -v=2: every lease of the burst


def test_single_leases_beyond_the_budget_are_folded(caplog):
    """A burst of one-lease reports: BUDGET lines, then the rest in the window's summary; the
    next window starts afresh."""
    clock = Clock()
    plog = PeerLog(8285, clock=clock)
    with caplog.at_level(logging.INFO, logger="dataplane.daemon.peer_log"):
        for i in range(BUDGET + 2):
            plog.record(PeerChange(PeerSnapshot(), (lease(i),), ()), i + 1)
            clock.t += 0.05
        assert len(info(caplog)) == BUDGET
        clock.t += 1.0
        plog.tick()
        clock.t += 1.0
        plog.record(PeerChange(PeerSnapshot(), (), (lease(0),)), BUDGET + 1)
    lines = info(caplog)
    assert lines[BUDGET] == ("Peers changed: 2 added (10.128.5.0/24 via 172.16.0.5, 10.128.6.0/24 via "
                             "172.16.0.6) in 2 update(s) over 0.05 s; 7 peer(s) in the route table")
    assert lines[BUDGET + 1].startswith("Subnet removed: 10.128.0.0/24 ")
    assert len(lines) == BUDGET + 2


def test_a_slow_report_makes_the_next_batch_wait_longer(watch):
    """Reports stay a small share of the time: after a report that took 30 ms the next batch
    waits ten times that, capped at COALESCE_MAX_S (the new peers wait that much longer)."""
    from dataplane.control.peers import COALESCE_MAX_S
    w, reg, reports = watch(coalesce=0.005)
    slow = reports.__call__

    def taking_30ms(change):
        time.sleep(0.03)
        slow(change)
    w.on_change = taking_30ms
    n = len(reports.changes)
    reg.send(put(9, "192.168.1.9", 11))
    reports.wait(n + 1)
    t0 = time.monotonic()
    reg.send(put(8, "192.168.1.8", 12))
    reports.wait(n + 2)
    waited = time.monotonic() - t0
    assert waited >= COALESCE_MAX_S, waited


def test_a_listing_handed_over_is_the_first_report_and_the_watch_starts_after_it():
    """One listing for both: the lease allocation's, handed to the watch, is not made again."""
    reg, reports = FakeRegistry(), Reports()
    reg.scan_leases = lambda: pytest.fail("listed again")
    lease = Lease(subnet(2), LeaseAttrs(IPv4Address("192.168.1.2")), key=f"{PREFIX}10.5.2.0-24")
    w = PeerWatcher(reg, OWN, reports, coalesce=60.0, listing=([lease], [], 7))
    w.start()
    try:
        assert w.wait_ready(5) and reg.watching.wait(5)
        assert names(reports.wait(1).added) == [("10.5.2.0/24", "192.168.1.2")]
        assert w.revision == 7 and reg.start_revision == 8
    finally:
        w.stop()
