"""A Prometheus collector whose families are read at most once per ``max_age``: the process_*
families of /metrics (prometheus_client's ProcessCollector).

Those read /proc (stat, limits, the fd directory): 34 syscalls per scrape, and each gives the
interpreter lock up and waits to take it back, up to the switch interval each time another thread
is busy: during a 16,000-lease start that alone held a /metrics answer 100-170 ms
(perf/README.md#answers-during-start). What they say (CPU seconds, memory, fds) moves slowly and
Prometheus scrapes every few seconds at most: read once a second, they cost a scrape nothing
else, and the daemon's own families stay read at each scrape.
"""
from __future__ import annotations

import threading
from time import monotonic

MAX_AGE_S = 1.0


class CachedCollector:
    """``collector``'s families, collected again once they are ``max_age`` seconds old."""

    def __init__(self, collector, max_age: float = MAX_AGE_S):
        self.collector = collector
        self.max_age = max_age
        self._lock = threading.Lock()
        self._families = None
        self._at = 0.0

    def collect(self):
        with self._lock:
            now = monotonic()
            if self._families is None or now - self._at >= self.max_age:
                self._families = list(self.collector.collect())
                self._at = now
            return self._families
