"""Liveness: does every loop of the daemon still make progress? /healthz and systemd's watchdog
ask it.

The loops that must progress:

* the main loop (daemon/main.py ``_serve``): ``tick()`` on each of its turns (every
  MONITOR_PERIOD_S) and, once it runs, while it waits on purpose (``Daemon.wait``: a SIGHUP's
  lease retried while etcd is away); before its first turn (startup) nothing is asked of it;
* every engine loop thread: its heartbeat (``Engine.heartbeat``, dataplane.h ``dp_state.beats``),
  which the loop moves on every pass and, idle, at least every WAKE_MS (its wait is bounded for
  this). A queue whose loop has ended or not started is not asked: the serve loop's monitor
  exits on an ended loop (daemon/monitor.py), and an engine stopped for a handover is stopped on
  purpose (the daemon hands ``engine_of`` None then).

A loop that has not progressed for ``stall_after_s`` is stalled. Progress is what was seen: a
heartbeat is read when someone asks (each tick, each /healthz), and a loop counts as stalled for
as long as its heartbeat has stayed at the value first seen that long ago (a lower bound on the
real stall). While anything is stalled, /healthz answers 503 naming each loop and for how long,
and WATCHDOG=1 is no longer sent: with the unit's ``WatchdogSec=``, systemd kills the daemon (its
WatchdogSignal, SIGABRT: faulthandler then writes every thread's stack to the journal) and
``Restart=`` starts it again, taking flannel0 and the sockets from its fd store.

``stall_after_s`` is STALL_AFTER_S, or half the watchdog's interval when that is shorter (so
that a stall is seen before systemd's limit passes), but never under STALL_AFTER_MIN_S: an
idle loop's heartbeat read once a tick may look still for up to two wake-ups.

A test hook, never set in production: ``$FLANNEL_UDP_TEST_STALL=<queue>`` holds that queue's
loop thread of the engine the daemon starts with (or again after a failed handover) before its
first pass (tests/unit/test_liveness.py,
tests/integration/test_watchdog.py), until the daemon stops; the daemon says so at start.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import threading
import time
from dataclasses import dataclass

from ..engine.api import WAKE_MS
from .monitor import MONITOR_PERIOD_S
from .systemd import sd_notify, watchdog_usec

log = logging.getLogger(__name__)

STALL_AFTER_S = 10.0
# Two of an idle loop's wake-ups and a tick between the reads: a healthy loop never looks still
# that long.
STALL_AFTER_MIN_S = 2 * WAKE_MS / 1000 + MONITOR_PERIOD_S
# WATCHDOG=1 at this fraction of the watchdog's interval: a late tick (a lease move) still
# leaves room.
PING_FRACTION = 4
TEST_STALL_ENV = "FLANNEL_UDP_TEST_STALL"


@dataclass(frozen=True)
class Stall:
    """A loop that has not progressed for ``seconds``."""
    loop: str
    seconds: float

    def __str__(self) -> str:
        return f"{self.loop} has not progressed for {self.seconds:.1f} s"


class Liveness:
    """What the main loop and the engine's loops have done lately; thread-safe."""

    def __init__(self, engine_of, clock=time.monotonic, watchdog_s: float | None = None,
                 notify=sd_notify):
        self._engine_of = engine_of       # () -> the engine to watch now, or None
        self._clock = clock
        self._notify = notify
        self._lock = threading.Lock()
        self._main = None                 # when the main loop last ticked; None before its first
        self._engine = None               # the engine the heartbeats below are of
        self._beats: dict = {}            # queue -> (heartbeat, when that value was first seen)
        self._last_ping = None
        if watchdog_s is None:
            usec = watchdog_usec()
            watchdog_s = usec / 1e6 if usec else 0.0
        self.watchdog_s = watchdog_s
        self.stall_after_s = STALL_AFTER_S
        if watchdog_s:
            self.stall_after_s = max(STALL_AFTER_MIN_S, min(STALL_AFTER_S, watchdog_s / 2))
        self.test_stall = _test_stall()

    @classmethod
    def for_daemon(cls, engine_of) -> "Liveness":
        """The daemon's: the watchdog from the environment; when it is on, the stacks of every
        thread go to stderr if systemd's signal ends a hung daemon."""
        lv = cls(engine_of)
        if lv.watchdog_s:
            faulthandler.enable()
            log.info("systemd's watchdog: WATCHDOG=1 every %.1f s while every loop progresses "
                     "(stalled after %.1f s)", lv.watchdog_s / PING_FRACTION, lv.stall_after_s)
        if lv.test_stall is not None:
            log.warning("%s=%d: the loop thread of queue %d is held (a test's stall); never set "
                        "it in production", TEST_STALL_ENV, lv.test_stall, lv.test_stall)
        return lv

    # ---- progress ---------------------------------------------------------------------------
    def tick(self, ping: bool = True, serving: bool = True) -> list[Stall]:
        """The main loop progresses; WATCHDOG=1 when due and nothing is stalled (``ping``
        False: not the unit's main process any more). ``serving`` False: a wait that may come
        before the serve loop's first tick, which counts only once that has come (startup's
        steps answer to TimeoutStartSec, which its waits extend, and before READY=1 nobody is
        to be told). Returns the
        stalls."""
        with self._lock:
            if not serving and self._main is None:
                return []
            now = self._clock()
            self._main = now
            stalls = self._stalls(now)
            if (ping and self.watchdog_s and not stalls and
                    (self._last_ping is None
                     or now - self._last_ping >= self.watchdog_s / PING_FRACTION)):
                self._last_ping = now
                self._notify("WATCHDOG=1")
        return stalls

    def stalls(self) -> list[Stall]:
        """The loops stalled now (empty: all progress), for /healthz."""
        with self._lock:
            return self._stalls(self._clock())

    def _stalls(self, now: float) -> list[Stall]:
        out = []
        if self._main is not None and now - self._main > self.stall_after_s:
            out.append(Stall("the main loop", now - self._main))
        engine = self._engine_of()
        if engine is not self._engine:    # a new engine (a lease move, a failed handover)
            self._engine, self._beats = engine, {}
        if engine is None:
            return out
        try:
            beats = engine.heartbeats()
            ended = engine.ended()
        except OSError:                   # closed under us: the next engine is asked next time
            return out
        for q, beat in enumerate(beats):
            if q in ended:
                self._beats.pop(q, None)
                continue
            seen = self._beats.get(q)
            if seen is None or seen[0] != beat:
                self._beats[q] = seen = (beat, now)
            if now - seen[1] > self.stall_after_s:
                out.append(Stall(f"the {engine.name} engine's loop of queue {q}", now - seen[1]))
        return out

    # ---- the test hook ----------------------------------------------------------------------
    def hold_for_test(self, engine, until: threading.Event) -> None:
        """With $FLANNEL_UDP_TEST_STALL=<queue>: that queue's loop thread waits for ``until``
        before its first pass (call before engine.start())."""
        q = self.test_stall
        if q is None or q >= len(engine):
            return
        queue = engine.queues[q]
        then = queue.thread_init

        def held():
            until.wait()
            if then is not None:
                then()
        queue.thread_init = held


def _test_stall() -> int | None:
    value = os.environ.get(TEST_STALL_ENV, "")
    try:
        return int(value) if value else None
    except ValueError:
        log.warning("%s=%r is not a queue number: ignored", TEST_STALL_ENV, value)
        return None
