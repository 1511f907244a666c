"""The daemon's periodic checks (daemon/monitor.py): when it exits, and how often it logs drops."""
from __future__ import annotations

import errno
import logging

from dataplane.daemon.monitor import DROP_LOG_EVERY_S, Monitor
from dataplane.engine import OFF_UDP_GRO, OFF_UDP_GSO
from dataplane.engine.api import Ended


class FakeEngine:
    name = "python"

    def __init__(self):
        self.stopped_queues = {}
        self.counters = {"drop_bad_source": 0, "drop_no_route": 0}
        self.offloads = OFF_UDP_GSO | OFF_UDP_GRO

    def ended(self):
        return self.stopped_queues

    def offloads_in_use(self):
        return self.offloads

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
    assert m.check(engine, "flannel0") is None
    engine.stopped_queues = {0: Ended("tun_gone", errno.EBADFD), 1: Ended("tun_gone", errno.EBADFD)}
    assert m.check(engine, "flannel0") == 1
    assert "flannel0 was deleted from under the daemon (queue(s) 0, 1: the TUN device is gone " \
           "(EBADFD" in caplog.text
    caplog.clear()
    engine.stopped_queues = {1: Ended("error", errno.EBADF)}
    assert m.check(engine, "flannel0") == 1
    assert "queue(s) 1: error (EBADF: Bad file descriptor) of 2" in caplog.text
    assert "was deleted" not in caplog.text


def test_udp_gso_turned_off_by_the_engine_is_logged_once(caplog):
    engine = FakeEngine()
    m = Monitor(offloads=engine.offloads)
    m.check(engine, "flannel0")
    assert "UDP GSO is off" not in caplog.text
    engine.offloads = OFF_UDP_GRO                  # the kernel answered EIO
    m.check(engine, "flannel0")
    m.check(engine, "flannel0")
    assert caplog.text.count("UDP GSO is off from now on") == 1


def test_bad_sources_logged_at_most_every_period(caplog):
    engine, clock = FakeEngine(), Clock()
    m = Monitor(clock=clock)
    caplog.set_level(logging.INFO)
    engine.counters["drop_bad_source"] = 5
    m.check(engine, "flannel0")
    engine.counters["drop_bad_source"] = 9
    clock.now += DROP_LOG_EVERY_S / 2
    m.check(engine, "flannel0")
    lines = [r.getMessage() for r in caplog.records if "hold no lease" in r.getMessage()]
    assert lines == ["Dropped 5 datagram(s) from sources that hold no lease (5 in total): if peers "
                     "reach this host through address translation (NAT), run with --accept-from any"]
    clock.now += DROP_LOG_EVERY_S
    m.check(engine, "flannel0")
    lines = [r.getMessage() for r in caplog.records if "hold no lease" in r.getMessage()]
    assert len(lines) == 2 and lines[1].startswith("Dropped 4 datagram(s)") and "(9 in total)" in lines[1]


def test_other_drops_only_with_v(caplog):
    engine, clock = FakeEngine(), Clock()
    caplog.set_level(logging.INFO)
    quiet, verbose = Monitor(0, clock=clock), Monitor(1, clock=clock)
    for m in (quiet, verbose):
        clock.now += DROP_LOG_EVERY_S
        m.check(engine, "flannel0")          # the first period sets the baseline
    engine.counters["drop_no_route"] = 7
    clock.now += DROP_LOG_EVERY_S
    assert quiet.check(engine, "flannel0") is None
    assert verbose.check(engine, "flannel0") is None
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Drops in the last")]
    assert lines == ["Drops in the last 10 s: no_route=7"]


def test_own_inner_sources_logged_at_most_every_period_apart_from_bad_sources(caplog):
    engine, clock = FakeEngine(), Clock()
    m = Monitor(clock=clock)
    engine.counters.update(drop_inner_local=3, drop_bad_source=1)
    m.check(engine, "flannel0")
    engine.counters["drop_inner_local"] = 8
    clock.now += DROP_LOG_EVERY_S / 2
    m.check(engine, "flannel0")
    forged = [r.getMessage() for r in caplog.records if "this host's own" in r.getMessage()]
    assert forged == ["Dropped 3 datagram(s) whose inner source is this host's own (3 in total): "
                      "forged on the underlay with a lease's PublicIP, or a local pod's packet a "
                      "peer sent back without masquerading (docs/threat-model.md)"]
    assert sum("hold no lease" in r.getMessage() for r in caplog.records) == 1
    clock.now += DROP_LOG_EVERY_S
    m.check(engine, "flannel0")
    forged = [r.getMessage() for r in caplog.records if "this host's own" in r.getMessage()]
    assert len(forged) == 2 and forged[1].startswith("Dropped 5 datagram(s)")


def test_an_engine_stopped_on_purpose_meanwhile_is_no_exit(caplog):
    """The serve loop looked for a handover before its checks; the handover stopped the engine
    in between: the flag, read after the engine said it ended, keeps the daemon running."""
    engine = FakeEngine()
    m = Monitor()
    flag = {"handing_over": False}

    def ended():
        flag["handing_over"] = True          # the handover says so, then stops the engine
        return {0: Ended("stopped"), 1: Ended("stopped")}

    engine.ended = ended
    assert m.check(engine, "flannel0", on_purpose=lambda: flag["handing_over"]) is None
    assert "stopped unexpectedly" not in caplog.text
    # the same ended engine with no one having stopped it on purpose is an exit
    assert m.check(engine, "flannel0", on_purpose=lambda: False) == 1
    assert "stopped unexpectedly" in caplog.text
