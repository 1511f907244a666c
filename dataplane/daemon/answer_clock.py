"""How long the daemon takes to answer, counted by the daemon itself: from a question's arrival
to its reply's last byte handed to the kernel, by endpoint (flannel_udp_answer_seconds).

Over HTTP the clock starts when the kernel received the request (its SO_TIMESTAMPNS stamp):
the wait for the daemon's thread to be woken, scheduled and given the interpreter before its
accept counts too. The status socket's clients send nothing, so its answers count from the
accept. A client's wall time also holds its connect and its own turn on the cores once the reply
is there. On a host whose cores are shared with etcd and the askers, the two differ by tens of
milliseconds (perf/README.md#answer-clock); this histogram says which part is the daemon's.

An answer over SLOW_S is logged at debug level with where its time went: the answering thread's
own CPU, and the process's CPU meanwhile (its other threads, Python's and the engine's, working
while the answer waited for the interpreter), the rest being time when no thread of the daemon
ran at all (the machine's cores busy elsewhere).
"""
from __future__ import annotations

import logging
import socket
import struct
import threading
from time import monotonic, process_time, time

log = logging.getLogger(__name__)

# Linux's SO_TIMESTAMPNS (SCM_TIMESTAMPNS alike; asm-generic's value), which Python does not name
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
SLOW_S = 0.05            # issue 47's bound of an answer


def begun() -> tuple[float, float]:
    """(monotonic, the process's CPU) at an accept: what :meth:`AnswerClock.done` counts from."""
    return monotonic(), process_time()


def stamp_arrivals(listener) -> None:
    """Have the kernel stamp the data each accepted connection receives (SO_TIMESTAMPNS, which
    accept's sockets inherit): see :func:`arrived`. Without it, answers count from the accept."""
    try:
        listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        pass


def arrived(ancillary, since: tuple) -> tuple:
    """``since`` moved back to when the kernel received a request's first bytes (its
    SCM_TIMESTAMPNS among ``ancillary``, recvmsg's), on the monotonic clock: the wait for the
    listening thread's turn before its accept then counts too (the accept's time kept third, the
    process's CPU still the accept's). ``since`` as it was without one."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = struct.unpack("qq", data[:16])
            ago = time() - (sec + nsec * 1e-9)
            if 0.0 <= ago < 60.0:           # a clock set meanwhile: keep the accept's
                return monotonic() - ago, since[1], since[0]
    return since


class AnswerClock:
    """Counts of answers by endpoint and bucket; read whole for each scrape."""

    def __init__(self):
        self._lock = threading.Lock()
        self._hist: dict = {}           # endpoint -> [count per bucket..., +Inf], sum

    def done(self, endpoint: str, since: tuple, own_cpu: float | None = None) -> float:
        """An answer of ``endpoint`` fully handed to the kernel now, accepted at ``since``
        (:func:`begun`); ``own_cpu``: what its thread used of the CPU, when known. Its seconds."""
        took = monotonic() - since[0]
        i = next((i for i, b in enumerate(BUCKETS) if took <= b), len(BUCKETS))
        with self._lock:
            counts, total = self._hist.get(endpoint) or ([0] * (len(BUCKETS) + 1), 0.0)
            counts[i] += 1
            self._hist[endpoint] = (counts, total + took)
        if took > SLOW_S:
            busy = process_time() - since[1]
            own = "" if own_cpu is None else f"its thread's CPU {own_cpu * 1e3:.1f} ms, "
            log.debug("answer: %s took %.1f ms (%sthe process's CPU meanwhile %.1f ms)",
                      endpoint, took * 1e3, own, busy * 1e3)
        return took

    def samples(self) -> list:
        """[((endpoint,), (cumulative bucket counts, sum))], the endpoints in order."""
        with self._lock:
            hist = {e: (list(c), s) for e, (c, s) in self._hist.items()}
        out = []
        for endpoint in sorted(hist):
            counts, total = hist[endpoint]
            acc, cumulative = 0, []
            for n in counts:
                acc += n
                cumulative.append(acc)
            out.append(((endpoint,), (cumulative, total)))
        return out


def family(name: str, help_text: str, labels, samples):
    """The histogram family of :meth:`AnswerClock.samples`."""
    from prometheus_client.core import HistogramMetricFamily   # only where a scrape runs
    fam = HistogramMetricFamily(name, help_text, labels=list(labels))
    bounds = [*(repr(b) for b in BUCKETS), "+Inf"]
    for values, (cumulative, total) in samples:
        fam.add_metric(list(values), list(zip(bounds, cumulative)), total)
    return fam


CLOCK = AnswerClock()       # the process's: its HTTP servers and status socket count here
