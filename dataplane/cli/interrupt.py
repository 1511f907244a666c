"""SIGTERM and SIGHUP as Ctrl-C, for the commands that build a testbed (demo, bench).

A command stopped by `kill`, a service manager or a closed terminal would otherwise die at once,
without running its finally blocks, and leave its network namespaces and child processes on the
host. Raised as KeyboardInterrupt, those signals take the teardown path Ctrl-C already takes.
"""
from __future__ import annotations

import contextlib
import signal

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_interrupt():
    """Inside the block, SIGTERM and SIGHUP raise KeyboardInterrupt; the old handlers come back
    after it."""
    def interrupt(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)
    old = {s: signal.signal(s, interrupt) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
