"""The engine loop threads' CPU scheduling: real-time on request (--realtime-priority).

Why: on a core that the forwarder shares with busy applications, a forwarder woken by a packet
waits for the running application's time slice to end before it runs - milliseconds, during which
flannel0's queue grows (perf/README.md#latency-under-load). A SCHED_FIFO thread runs as soon as
it is woken. It cannot take a core for ever: the
loop sleeps in epoll_wait whenever the fds are empty, and the kernel's real-time throttling
(kernel.sched_rt_runtime_us, 95 % by default) leaves the rest to everyone else.

It needs CAP_SYS_NICE; the shipped unit denies real-time scheduling (RestrictRealtime=yes) and
that capability, so a host that wants it lifts both in a drop-in (docs/flags.md#realtime-priority).
"""
from __future__ import annotations

import os
import threading

PRIORITY_MAX = 99


class SchedError(OSError):
    pass


def check_priority(priority: int) -> int:
    priority = int(priority)
    if not 0 <= priority <= PRIORITY_MAX:
        raise ValueError(f"real-time priority {priority}: expected 0 (off) or 1..{PRIORITY_MAX}")
    return priority


def realtime(priority: int) -> None:
    """Make the calling thread SCHED_FIFO at ``priority`` (1..99). SchedError says why not."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(check_priority(priority)))
    except PermissionError as e:
        raise SchedError(e.errno, "SCHED_FIFO needs CAP_SYS_NICE (under systemd: a drop-in with "
                                  "RestrictRealtime=no and CAP_SYS_NICE in "
                                  "CapabilityBoundingSet)") from None


def probe(priority: int) -> None:
    """Whether :func:`realtime` works here, tried on a short-lived thread of its own (this
    thread's scheduling stays as it is); SchedError if not. For a clear error at startup."""
    failed: list[BaseException] = []

    def attempt():
        try:
            realtime(priority)
        except OSError as e:
            failed.append(e)

    t = threading.Thread(target=attempt, name="sched-probe")
    t.start()
    t.join()
    if failed:
        raise failed[0]


def thread_init(priority: int):
    """What an engine's loop thread runs first (Engine.thread_init): None when ``priority`` is 0."""
    priority = check_priority(priority)
    if not priority:
        return None
    return lambda: realtime(priority)
