"""/metrics' registry: the daemon's collectors, and prometheus_client's process_* and python_*
ones once it is imported.

prometheus_client's import is ~40 ms of the interpreter (it brings http.server, urllib.request,
wsgiref...), which a daemon's start, CPU-bound under the interpreter lock beside 16,000 leases,
paid before READY=1 (perf/README.md#prom-later). The daemon's own families need none of it
(daemon/metrics_text.py SimpleFamily); the standard ones are made in a thread started as READY=1
goes out, and a scrape before that serves the daemon's families, without waiting for the import.
"""
from __future__ import annotations

import threading

from .cached_collector import CachedCollector


class Registry:
    """prometheus_client's CollectorRegistry as /metrics reads it (collect, register), without
    its import: the standard families join once :func:`load_standard` has run."""

    def __init__(self, standard: bool):
        self.collectors: list = []
        self._standard = standard

    def register(self, collector) -> None:
        self.collectors.append(collector)

    def get_sample_value(self, name: str, labels: dict | None = None):
        """The value of the sample ``name`` with ``labels``, else None (as CollectorRegistry's)."""
        labels = labels or {}
        for metric in self.collect():
            for s in metric.samples:
                if s.name == name and s.labels == labels:
                    return s.value
        return None

    def collect(self):
        for c in self.collectors:
            yield from c.collect()
        if self._standard:
            for c in _STANDARD or ():
                yield from c.collect()


_STANDARD: list | None = None           # the process_* and python_* collectors, once loaded
_standard_lock = threading.Lock()


def load_standard() -> None:
    """prometheus_client imported and its process_* and python_* collectors made (once): ~40 ms
    of the interpreter, which a daemon spends right after READY=1 (:func:`load_standard_soon`),
    not on its start's path (perf/README.md#prom-later)."""
    global _STANDARD
    with _standard_lock:
        if _STANDARD is not None:
            return
        from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
        # /proc read once a second at most: a scrape's syscalls wait for the interpreter lock
        made = Registry(False)
        PlatformCollector(registry=made)
        GCCollector(registry=made)
        _STANDARD = [CachedCollector(ProcessCollector(registry=None)), *made.collectors]


def load_standard_soon() -> threading.Thread:
    """load_standard in a thread of its own (the daemon's, as READY=1 goes out): a scrape meanwhile
    serves the daemon's families without waiting for it, the standard ones from the next on."""
    t = threading.Thread(target=load_standard, name="metrics-standard", daemon=True)
    t.start()
    return t
