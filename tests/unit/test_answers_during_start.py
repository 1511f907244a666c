"""What keeps the daemon's reports answering while its start keeps the CPU busy: the collector
paused until READY and a short switch interval (daemon/interpreter.py), /proc read once a second
for /metrics' process_* families (daemon/cached_collector.py)."""
from __future__ import annotations

import gc
import sys

from prometheus_client import generate_latest

from dataplane.daemon.cached_collector import CachedCollector
from dataplane.daemon.interpreter import StartInterpreter
from dataplane.daemon.metrics import MetricsSource, make_registry


def test_the_collector_is_paused_while_starting_and_runs_while_waiting():
    was = sys.getswitchinterval()
    assert gc.isenabled()
    i = StartInterpreter(switch_interval=0.0005)
    try:
        i.begin()
        assert not gc.isenabled() and sys.getswitchinterval() == 0.0005
        with i.waiting():
            assert gc.isenabled()
        assert not gc.isenabled()
        frozen = gc.get_freeze_count()
        i.ready()
        assert gc.isenabled() and gc.get_freeze_count() >= frozen
        with i.waiting():                   # after READY, a wait changes nothing
            assert gc.isenabled()
        assert gc.isenabled()
        i.ready()                           # again at the run's end: nothing more
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()
        sys.setswitchinterval(was)


class Counting:
    def __init__(self):
        self.collected = 0

    def collect(self):
        self.collected += 1
        return [self.collected]


def test_a_cached_collector_reads_once_per_max_age(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("dataplane.daemon.cached_collector.monotonic", lambda: now[0])
    inner = Counting()
    c = CachedCollector(inner, max_age=1.0)
    assert c.collect() == [1] and c.collect() == [1]
    now[0] += 0.99
    assert c.collect() == [1]
    now[0] += 0.01
    assert c.collect() == [2] and inner.collected == 2


def test_metrics_still_serve_the_process_families():
    text = generate_latest(make_registry(MetricsSource())).decode()
    for family in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                   "process_open_fds", "python_gc_objects_collected_total"):
        assert f"\n{family}" in text or text.startswith(family), family
