"""daemon/liveness.py: the main loop's ticks and every engine loop's heartbeat, what /healthz and
systemd's watchdog make of them; both engines over socketpairs, time on a fake clock except for
the real loops' wake-ups (dataplane.h, DP_WAKE_MS)."""
from __future__ import annotations

import http.client
import os
import socket
import threading

import pytest

from dataplane.daemon import liveness, systemd
from dataplane.daemon.http import HEALTHZ_BODY, HttpServer
from dataplane.daemon.liveness import Liveness, Stall
from dataplane.daemon.metrics import MetricsSource
from dataplane.engine import engine_class, multi
from dataplane.engine.api import WAKE_MS
from tests.conftest import wait_until


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def two_queues(engine_kind, monkeypatch):
    """A started two-queue engine over socketpairs whose queue 1 is held by the test hook, the
    Liveness watching it (fake clock, a 4 s watchdog) and the event that releases queue 1."""
    monkeypatch.setenv(liveness.TEST_STALL_ENV, "1")
    socks = []
    for _ in range(2):
        engine_end, test_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        socks += [engine_end, test_end, udp]
    engine = multi.create(engine_class(engine_kind), [socks[0].fileno(), socks[3].fileno()],
                          [socks[2].fileno(), socks[5].fileno()], tun_addr="10.5.1.0", mtu=1472)
    clock, pings, release = Clock(), [], threading.Event()
    lv = Liveness(lambda: engine, clock=clock, watchdog_s=4.0, notify=pings.append)
    lv.hold_for_test(engine, release)
    engine.start()
    try:
        yield engine, lv, clock, pings, release
    finally:
        release.set()
        engine.close()
        for s in socks:
            s.close()


def test_a_held_loop_is_stalled_and_an_idle_one_is_not(two_queues):
    engine, lv, clock, pings, release = two_queues
    assert lv.stall_after_s == liveness.STALL_AFTER_MIN_S     # 4 s / 2, raised to the floor
    assert lv.tick() == [] and pings == ["WATCHDOG=1"]         # every heartbeat first seen now
    # nothing to forward: queue 0 beats on its bounded wait alone
    beat0 = engine.heartbeats()[0]
    wait_until(lambda: engine.heartbeats()[0] != beat0, 3 * WAKE_MS / 1000,
               what="an idle loop's heartbeat")
    clock.now = 100.0
    stalls = lv.tick()
    assert stalls == [Stall(f"the {engine.name} engine's loop of queue 1", 100.0)]
    assert pings == ["WATCHDOG=1"], "no WATCHDOG=1 while a loop is stalled"
    assert lv.stalls() == stalls
    # released, it beats: nothing is stalled any more and the watchdog hears from us again
    release.set()
    wait_until(lambda: engine.heartbeats()[1] != 0, 3 * WAKE_MS / 1000,
               what="the released loop's heartbeat")
    clock.now = 101.0
    assert lv.tick() == [] and pings == ["WATCHDOG=1"] * 2


def test_an_ended_queue_is_the_monitors_not_a_stall(two_queues):
    engine, lv, clock, _pings, _release = two_queues
    lv.stalls()
    engine.queues[0].stop()
    wait_until(lambda: 0 in engine.ended(), 5, what="queue 0 to end")
    clock.now = 100.0
    assert [s.loop for s in lv.stalls()] == [f"the {engine.name} engine's loop of queue 1"]


def test_the_main_loop_and_the_watchdog_cadence():
    clock, pings = Clock(), []
    lv = Liveness(lambda: None, clock=clock, watchdog_s=30.0, notify=pings.append)
    assert lv.stall_after_s == liveness.STALL_AFTER_S
    assert lv.stalls() == []                  # before the first tick: starting, not stalled
    for t in range(12):                       # a tick a second: WATCHDOG=1 every 30 / 4 s
        clock.now = float(t)
        assert lv.tick() == []
    assert len(pings) == 2                    # at 0 and at 8
    lv.tick(ping=False)                       # a successor is the main process: no ping
    clock.now = 11.0 + liveness.STALL_AFTER_S + 0.5
    assert lv.stalls() == [Stall("the main loop", liveness.STALL_AFTER_S + 0.5)]
    # without a watchdog nothing is sent, ever
    quiet = Liveness(lambda: None, clock=clock, watchdog_s=0.0, notify=pings.append)
    quiet.tick()
    assert len(pings) == 2


def test_the_watchdog_is_ours_or_our_parents(monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/nothing-listens")
    monkeypatch.setenv("WATCHDOG_USEC", "3000000")
    # a pid neither ours nor our parent's (not 1: a process whose parent exited has parent 1)
    other = os.getpid() + 1
    while other in (os.getpid(), os.getppid()):
        other += 1
    for pid, usec in ((os.getpid(), 3000000), (os.getppid(), 3000000), (other, 0),
                      (None, 3000000)):
        if pid is None:
            monkeypatch.delenv("WATCHDOG_PID", raising=False)
        else:
            monkeypatch.setenv("WATCHDOG_PID", str(pid))
        assert systemd.watchdog_usec() == usec, pid
        if usec:                              # our own successor inherits a pid it accepts
            assert os.environ["WATCHDOG_PID"] == str(os.getpid())
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert systemd.watchdog_usec() == 0


class Source(MetricsSource):
    def __init__(self):
        self.now: list = []

    def stalls(self):
        return self.now


def _get(port: int, path: str) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_healthz_answers_503_naming_the_stalled_loop():
    src = Source()
    s = HttpServer("127.0.0.1", 0, src, ("healthz",)).start()
    try:
        port = s.address[1]
        assert _get(port, "/healthz") == (200, HEALTHZ_BODY)     # flanneld's reply, unchanged
        src.now = [Stall("the c engine's loop of queue 1", 12.34)]
        assert _get(port, "/healthz") == (
            503, b"the c engine's loop of queue 1 has not progressed for 12.3 s\n")
    finally:
        s.close()


def test_a_wait_before_the_serve_loop_arms_nothing():
    """Startup's waits (etcd away) say nothing to systemd before READY=1, and startup is not
    held to the main loop's limit; once serving, a wait is a tick."""
    clock, pings = Clock(), []
    lv = Liveness(lambda: None, clock=clock, watchdog_s=4.0, notify=pings.append)
    lv.tick(serving=False)
    clock.now = 100.0
    assert lv.stalls() == [] and pings == []
    lv.tick()
    clock.now = 200.0
    lv.tick(serving=False)
    assert lv.stalls() == [] and pings == ["WATCHDOG=1"] * 2
