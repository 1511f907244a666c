"""How many queues (TUN queue + UDP socket + engine each) the dataplane runs.

Default: one per CPU this process may run on, at most 8 (beyond that the
kernel side - softirq, copies - is the limit, not the loops). One queue is
flanneld's layout exactly. ``--trace`` runs one queue: each engine has its own
trace ring with its own sequence numbers, and the trace is read as one
ordered stream (``GET /debug/trace?after=N``, the demo), so with several
queues it would miss the packets of the others.
"""
from __future__ import annotations

import os

DEFAULT_CAP = 8
MAX_QUEUES = 256            # the kernel's limit of queues per TUN device (MAX_TAP_QUEUES)


def default_queues() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, DEFAULT_CAP))


def check(n: int) -> None:
    if not 1 <= n <= MAX_QUEUES:
        raise ValueError(f"{n} out of range 1..{MAX_QUEUES}")


def effective(requested: int, trace: bool) -> tuple[int, str]:
    """(queues to run, a log sentence when that is not ``requested``, else "")."""
    if trace and requested > 1:
        return 1, (f"--trace: running 1 queue instead of {requested} so that the trace "
                   "holds every packet, in order")
    return requested, ""
