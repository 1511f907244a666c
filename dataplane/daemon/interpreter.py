"""The interpreter while the daemon starts: its reports (/metrics, /readyz, the status socket)
answer within a few milliseconds even while the main thread parses and routes 16,000 leases.

Every report's thread shares the interpreter lock with that work. Two things held it for long
(perf/README.md#answers-during-start, counted from inside the daemon):

* the garbage collector: the start makes the modules' objects and then the leases', hundreds of
  thousands, and each full collection walked them all while holding the lock: 40-230 ms per
  collection, four of them in one 16,000-lease start. Until READY=1 the collector is paused
  (the start's own objects live as long as the daemon; what it leaves in cycles is bounded by one
  start), then gc.freeze() takes the start's objects out of its sight for good
  (docs/design.md#fig-gc-freeze) and it runs again. While the start waits (for etcd, the config,
  a lease: possibly hours) it runs as usual: waiting costs nobody.
* the switch interval: a thread that wants the lock waits for up to it (5 ms by default) while
  another runs bytecode, and one answer takes the lock back after each of its syscalls (accept,
  read, the worker's queue, write...). From the start on (a burst of lease events later is the
  same work), 0.5 ms, as the Python engine's daemon has it: a report waits a tenth of that; the
  busy thread gives the lock up more often only while another one asks for it.
"""
from __future__ import annotations

import gc
import sys
from contextlib import contextmanager

from ..host import malloc

SWITCH_INTERVAL_S = 0.0005


class StartInterpreter:
    """begin() as the daemon's run starts, waiting() around each of its waits until ready(),
    ready() as READY=1 goes out (and at the latest when the run ends)."""

    def __init__(self, switch_interval: float = SWITCH_INTERVAL_S):
        self.switch_interval = switch_interval
        self.starting = False
        self._gc_was = True

    def begin(self) -> None:
        self._gc_was = gc.isenabled()
        gc.disable()
        self.starting = True
        sys.setswitchinterval(min(sys.getswitchinterval(), self.switch_interval))
        # freed blocks given back, not kept as heap fragments (host/malloc.py)
        malloc.fix_thresholds()

    @contextmanager
    def waiting(self):
        """A wait of the start: the collector runs meanwhile (nobody waits for it)."""
        if not self.starting:
            yield
            return
        if self._gc_was:
            gc.enable()
        try:
            yield
        finally:
            if self.starting:
                gc.disable()

    def ready(self) -> None:
        """The start's objects out of the collector's sight, and the collector on again."""
        if not self.starting:
            return
        self.starting = False
        gc.freeze()
        if self._gc_was:
            gc.enable()
