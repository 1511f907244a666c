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

A problem may also flicker as it ends: a client whose connection was waiting out its reconnect
backoff fails once more right after another call has said the outage over. ``settle`` is that
window: a failure that begins less than ``settle`` seconds after a recovery was said is kept at
DEBUG until it is still failing past the window, and ends at DEBUG if it never was said.

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
                 remind_every: Optional[float] = None, settle: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self.log = logger
        self.what = what
        self.level = level
        # None: the module's pace, read when the object is made (so a test may patch it)
        self.remind_every = REMIND_EVERY if remind_every is None else remind_every
        self.settle = settle
        self._clock = clock
        self._lock = threading.Lock()
        self._since: Optional[float] = None    # when the current failure began (clock)
        self._last_said = 0.0
        self._said = False                     # the current failure has been logged
        self._recovered_at: Optional[float] = None   # when a said failure last ended (clock)
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
            if self._since is None:
                self._since, self._said = now, False
            new_cause = key != self._key
            self._cause, self._key = cause, key
            settling = (self._recovered_at is not None and now - self._recovered_at < self.settle)
            if not self._said and settling:
                kind = None
            elif not self._said or new_cause:
                self._last_said, self._said = now, True
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
            now = self._clock()
            lasted, attempts, said = now - self._since, self.attempts, self._said
            self._since, self._cause, self._key, self.attempts = None, "", None, 0
            if said:
                self._recovered_at = now
        if not said:
            self.log.debug("%s: over after %s (%d failed attempts), within %.1f s of a recovery",
                           self.what, _duration(lasted), attempts, self.settle)
            return True
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
