"""/metrics' body: prometheus_client's text format, byte for byte, with each series' name and
labels formatted once and kept.

prometheus_client's generate_latest formats every sample anew: the label names checked against a
regular expression, escaped and sorted, at every scrape. That was 60 % of a scrape's 3.3 ms of
Python, and a scrape shares the interpreter with the daemon's start or a burst of lease events,
a few 0.5 ms turns at a time (perf/README.md#answers-during-start): the same label sets come back
at each scrape (queue, reason, watch...), so their text is made once, and a scrape formats the
values only. Anything this does not know (a sample with a timestamp, OpenMetrics' _created,
_gsum, _gcount samples) is left to generate_latest whole.
"""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.utils import floatToGoString

KEPT_MAX = 10_000           # series texts kept; beyond, the cache starts again (labels that churn)
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
_TYPES = {"counter": "counter", "gauge": "gauge", "summary": "summary", "histogram": "histogram",
          "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram",
          "unknown": "untyped"}


class _Unusual(Exception):
    """A family this renderer leaves to generate_latest."""


def _escaped_name(name: str) -> str:
    return openmetrics.escape_metric_name(name, openmetrics.UNDERSCORES)


class MetricsText:
    """``render(registry)``: what generate_latest(registry) gives, for the families a daemon
    serves."""

    def __init__(self):
        self._series: dict = {}         # (sample name, label items) -> "name{labels} "
        self._heads: dict = {}          # (family name, type, help) -> its # HELP and # TYPE lines
        self._texts: dict = {}          # family name -> (the family object, its text)

    def render(self, registry) -> bytes:
        families = list(registry.collect())
        if len(self._series) > KEPT_MAX:
            self._series.clear()
        try:
            out = []
            for metric in families:
                kept = self._texts.get(metric.name)
                if kept is None or kept[0] is not metric:
                    kept = self._texts[metric.name] = (metric, self._text(metric))
                out.append(kept[1])
            return "".join(out).encode("utf-8")
        except _Unusual:
            return generate_latest(registry)

    def _text(self, metric) -> str:
        """One family's text. Kept with the family object it was made of: a collector that
        serves the same object again (KeptFamilies, CachedCollector) is served the same text."""
        return self._head(metric) + "".join([self._line(metric, s) for s in metric.samples])

    def _head(self, metric) -> str:
        key = (metric.name, metric.type, metric.documentation)
        head = self._heads.get(key)
        if head is None:
            mtype = _TYPES.get(metric.type)
            if mtype is None:
                raise _Unusual(metric.type)
            name = metric.name + {"counter": "_total", "info": "_info"}.get(metric.type, "")
            doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            head = self._heads[key] = (f"# HELP {_escaped_name(name)} {doc}\n"
                                       f"# TYPE {_escaped_name(name)} {mtype}\n")
        return head

    def _line(self, metric, s) -> str:
        key = (s.name, tuple(s.labels.items()))
        prefix = self._series.get(key)
        if prefix is None:
            if s.name in (metric.name + suffix for suffix in _OM_SUFFIXES):
                raise _Unusual(s.name)
            labels = ",".join(
                '{}="{}"'.format(openmetrics.escape_label_name(k, openmetrics.UNDERSCORES),
                                 openmetrics._escape(v, openmetrics.ALLOWUTF8, False))
                for k, v in sorted(s.labels.items()))
            prefix = self._series[key] = (_escaped_name(s.name)
                                          + (f"{{{labels}}}" if labels else "") + " ")
        if s.timestamp is not None:
            raise _Unusual(s.name)
        return f"{prefix}{floatToGoString(s.value)}\n"


class KeptFamilies:
    """A collector's families made again only when what they say changes: at 16,000 leases a
    scrape shares the interpreter with a start or a burst of lease events, and most families
    (the engine's counters of an idle path, the peers, etcd's watches) say the same from one
    scrape to the next; an unchanged family is served as the same object, and MetricsText then
    serves the text it made of it."""

    def __init__(self, make):
        self._make = make               # family name -> an empty family (metrics.py _new)
        self._families: dict = {}       # family name -> (its samples, the family)
        self._engine = None             # (the engine's counters, what make_engine made of them)

    def family(self, name: str, samples):
        """The family ``name`` with ``samples`` [(label values, value)]: the last one made if it
        had the same."""
        samples = tuple(samples)
        kept = self._families.get(name)
        if kept is not None and kept[0] == samples:
            return kept[1]
        fam = self._make(name)
        for labels, value in samples:
            fam.add_metric(list(labels), value)
        self._families[name] = (samples, fam)
        return fam

    def engine(self, counters, make_engine):
        """``make_engine(counters)``, or what it gave for the same counters last time (not to be
        changed by the caller)."""
        kept = self._engine
        if kept is None or kept[0] != counters:
            kept = self._engine = (counters, make_engine(counters))
        return kept[1]
