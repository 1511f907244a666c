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


class Odd:
    """Families with what the text format escapes, and the kinds generate_latest renames."""

    def __init__(self):
        self.value = 1.0

    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            InfoMetricFamily, StateSetMetricFamily)
        g = GaugeMetricFamily("odd_gauge", 'help with \\ and\na newline', labels=["b", "a"])
        g.add_metric(['quote " and \\ and\nnewline', "x"], self.value)
        g.add_metric(["é", "y"], float("inf"))
        yield g
        c = CounterMetricFamily("odd_things", "a counter", labels=["queue"])
        c.add_metric(["0"], self.value * 3)
        yield c
        yield InfoMetricFamily("odd_build", "an info", value={"version": "1.2"})
        yield StateSetMetricFamily("odd_state", "a state set", value={"up": True, "down": False})


def test_metrics_text_is_generate_latest_byte_for_byte():
    from prometheus_client import CollectorRegistry, PlatformCollector

    from dataplane.daemon.metrics_text import MetricsText
    reg = make_registry(MetricsSource(), standard=False)
    odd = Odd()
    reg.register(odd)
    PlatformCollector(registry=reg)
    text = MetricsText()
    for value in (1.0, 2.5, 1e21, float("nan")):        # the kept series, new values
        odd.value = value
        assert text.render(reg) == generate_latest(reg)
    # what it does not format itself (a timestamp, OpenMetrics' _created) is generate_latest's
    from prometheus_client.core import CounterMetricFamily
    stamped = CollectorRegistry()

    class Stamped:
        def collect(self):
            c = CounterMetricFamily("stamped", "with a time", created=1000.0)
            c.add_metric([], 1.0, timestamp=5.0)
            yield c
    stamped.register(Stamped())
    assert text.render(stamped) == generate_latest(stamped)
