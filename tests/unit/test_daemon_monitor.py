"""The daemon's periodic checks (daemon/monitor.py): when it exits, and how often it logs drops."""
from __future__ import annotations

import logging

from dataplane.daemon.monitor import DROP_LOG_EVERY_S, Monitor


class FakeEngine:
    name = "python"

    def __init__(self):
        self.stopped_queues = []
        self.counters = {"drop_bad_source": 0, "drop_no_route": 0}

    def ended(self):
        return self.stopped_queues

    def __len__(self):
        return 2

    def stats(self):
        return dict(self.counters)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_an_ended_queue_or_a_deleted_tun_exits_1(caplog):
    engine = FakeEngine()
    m = Monitor()
    assert m.check(engine, "flannel0", tun_attached=True) is None
    assert m.check(engine, "flannel0", tun_attached=False) == 1
    assert "flannel0 was deleted" in caplog.text
    engine.stopped_queues = [1]
    assert m.check(engine, "flannel0", tun_attached=True) == 1
    assert "queue(s) 1 of 2" in caplog.text


def test_bad_sources_logged_at_most_every_period(caplog):
    engine, clock = FakeEngine(), Clock()
    m = Monitor(clock=clock)
    caplog.set_level(logging.INFO)
    engine.counters["drop_bad_source"] = 5
    m.check(engine, "flannel0", True)
    engine.counters["drop_bad_source"] = 9
    clock.now += DROP_LOG_EVERY_S / 2
    m.check(engine, "flannel0", True)
    lines = [r.getMessage() for r in caplog.records if "hold no lease" in r.getMessage()]
    assert lines == ["Dropped 5 datagram(s) from sources that hold no lease (5 in total): if peers "
                     "reach this host through address translation (NAT), run with --accept-from any"]
    clock.now += DROP_LOG_EVERY_S
    m.check(engine, "flannel0", True)
    lines = [r.getMessage() for r in caplog.records if "hold no lease" in r.getMessage()]
    assert len(lines) == 2 and lines[1].startswith("Dropped 4 datagram(s)") and "(9 in total)" in lines[1]


def test_other_drops_only_with_v(caplog):
    engine, clock = FakeEngine(), Clock()
    caplog.set_level(logging.INFO)
    quiet, verbose = Monitor(0, clock=clock), Monitor(1, clock=clock)
    for m in (quiet, verbose):
        clock.now += DROP_LOG_EVERY_S
        m.check(engine, "flannel0", True)          # the first period sets the baseline
    engine.counters["drop_no_route"] = 7
    clock.now += DROP_LOG_EVERY_S
    assert quiet.check(engine, "flannel0", True) is None
    assert verbose.check(engine, "flannel0", True) is None
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Drops in the last")]
    assert lines == ["Drops in the last 10 s: no_route=7"]


def test_own_inner_sources_logged_at_most_every_period_apart_from_bad_sources(caplog):
    engine, clock = FakeEngine(), Clock()
    m = Monitor(clock=clock)
    engine.counters.update(drop_inner_local=3, drop_bad_source=1)
    m.check(engine, "flannel0", True)
    engine.counters["drop_inner_local"] = 8
    clock.now += DROP_LOG_EVERY_S / 2
    m.check(engine, "flannel0", True)
    forged = [r.getMessage() for r in caplog.records if "this host's own" in r.getMessage()]
    assert forged == ["Dropped 3 datagram(s) whose inner source is this host's own (3 in total): "
                      "forged on the underlay with a lease's PublicIP, or a local pod's packet a "
                      "peer sent back without masquerading (docs/threat-model.md)"]
    assert sum("hold no lease" in r.getMessage() for r in caplog.records) == 1
    clock.now += DROP_LOG_EVERY_S
    m.check(engine, "flannel0", True)
    forged = [r.getMessage() for r in caplog.records if "this host's own" in r.getMessage()]
    assert len(forged) == 2 and forged[1].startswith("Dropped 5 datagram(s)")
