"""A failure that repeats, said the way an operator can read: once when it starts, a reminder at a
slow pace while it lasts, once when it is over.

A loop that retries every second (a watch, a renewal, a file write) must not write a line every
second: a one-hour etcd outage would be thousands of lines, past journald's default rate limit, and
the first line, the one with the cause, scrolls away. Each call of ``fail`` counts; the log gets the
first failure (and a change of cause) at the problem's level, then at most one reminder every
``remind_every`` seconds with how long it has lasted, and one line from ``ok`` when it is over.
Everything in between goes to DEBUG. Thread-safe: several threads may report one problem.

What counts as "a change of cause" is the ``key`` given to ``fail`` (by default the cause's text):
a caller whose cause text varies from one attempt to the next while the problem stays the same
(etcd unreachable, seen by several loops with their own words) passes a steady key, so that only
the reminders carry the newest text.

The pace is ``REMIND_EVERY`` (a minute). The integration tests shorten it through the environment
variable ``FLANNEL_UDP_REMIND_EVERY_S`` (read once, at import), so that a short outage shows its
reminders; it is no operator's setting.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Optional

REMIND_ENV = "FLANNEL_UDP_REMIND_EVERY_S"


def _remind_every(default: float = 60.0) -> float:
    try:
        value = float(os.environ.get(REMIND_ENV, default))
    except ValueError:
        return default
    return value if value > 0 else default


REMIND_EVERY = _remind_every()


class Recurring:
    def __init__(self, logger: logging.Logger, what: str, *, level: int = logging.WARNING,
                 remind_every: Optional[float] = None, clock: Callable[[], float] = time.monotonic):
        self.log = logger
        self.what = what
        self.level = level
        # None: the module's pace, read when the object is made (so a test may patch it)
        self.remind_every = REMIND_EVERY if remind_every is None else remind_every
        self._clock = clock
        self._lock = threading.Lock()
        self._since: Optional[float] = None    # when the current failure began (clock)
        self._last_said = 0.0
        self._cause = ""
        self._key: object = None
        self.attempts = 0                      # failures since it began
        self.total = 0                         # failures ever (for a counter)

    @property
    def failing(self) -> bool:
        return self._since is not None

    @property
    def cause(self) -> str:
        return self._cause

    @property
    def key(self) -> object:
        """The key of the current failure (None when there is none)."""
        return self._key

    def lasted(self) -> float:
        """Seconds since the current failure began, 0 when there is none."""
        since = self._since
        return 0.0 if since is None else self._clock() - since

    def fail(self, cause: str, advice: str = "", extra: Optional[Callable[[], str]] = None, *,
             key: object = None) -> None:
        """One more failure. ``advice`` says what to do (first line only); ``extra()`` adds the
        state of things (how many peers are still served, say) to the first line and to each
        reminder, called only when a line is written. ``key`` names the problem: a new key is
        said at once (default: the cause's text)."""
        now = self._clock()
        key = cause if key is None else key
        with self._lock:
            self.total += 1
            self.attempts += 1
            first = self._since is None
            if first:
                self._since = now
            new_cause = key != self._key
            self._cause, self._key = cause, key
            if first or new_cause:
                self._last_said = now
                kind = "first"
            elif now - self._last_said >= self.remind_every:
                self._last_said = now
                kind = "remind"
            else:
                kind = None
            attempts, lasted = self.attempts, now - self._since
        if kind is None:
            self.log.debug("%s (attempt %d): %s", self.what, attempts, cause)
            return
        more = _call(extra)
        if kind == "first":
            self.log.log(self.level, "%s: %s%s%s", self.what, cause, f"; {advice}" if advice else "",
                         f"; {more}" if more else "")
        else:
            self.log.log(self.level, "%s: still failing after %s (%d attempts): %s%s", self.what,
                         _duration(lasted), attempts, cause, f"; {more}" if more else "")

    def ok(self, what_now: str = "") -> bool:
        """The problem is over (or never was). Returns True if it had been failing."""
        if self._since is None:                # the common case, on every success: no lock
            return False
        with self._lock:
            if self._since is None:
                return False
            lasted, attempts = self._clock() - self._since, self.attempts
            self._since, self._cause, self._key, self.attempts = None, "", None, 0
        self.log.info("%s: recovered after %s (%d failed attempts)%s", self.what, _duration(lasted),
                      attempts, f"; {what_now}" if what_now else "")
        return True


def _call(extra: Optional[Callable[[], str]]) -> str:
    if extra is None:
        return ""
    try:
        return extra()
    except Exception as exc:                   # a line about a failure must not fail itself
        return f"(state unknown: {type(exc).__name__})"


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{seconds:.0f} s"
    if s < 7200:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
