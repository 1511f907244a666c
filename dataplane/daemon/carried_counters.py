"""Totals that never go down across the daemon's replaced objects (flannel_udp_* counters)."""
from __future__ import annotations

import threading


class CarriedCounters:
    """Counters read off objects the daemon replaces while it runs (the own-lease watch after a
    re-acquisition, the lease manager after SIGHUP): when the object under a key changes, the
    last counts of the old one are carried over, so that exported totals never go down. Counts an
    object made after the last read before its replacement are not seen; replacements are rare."""

    def __init__(self):
        self._lock = threading.Lock()
        self._last: dict = {}
        self._base: dict = {}

    def read(self, key: str, obj, names) -> dict:
        with self._lock:
            base = self._base.setdefault(key, dict.fromkeys(names, 0))
            prev = self._last.get(key)
            if prev is not None and prev is not obj:
                for n in names:
                    base[n] += getattr(prev, n, 0)
            self._last[key] = obj
            return {n: base[n] + (getattr(obj, n, 0) if obj is not None else 0) for n in names}
