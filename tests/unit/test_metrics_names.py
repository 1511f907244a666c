"""/metrics against its declaration (dataplane/daemon/metrics.py DECLARED, STANDARD,
ENGINE_COUNTERS) and its reference page (docs/metrics.md): names, types, labels, the queue label
of a real two-queue engine over socketpairs, and label values that stay short words.
"""
from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import dataplane
from dataplane.daemon import answer_clock
from dataplane.daemon.metrics import (DECLARED, ENGINE_COUNTERS, FAMILY_LABELLED, FIXED_FAMILY,
                                      STANDARD, MetricsSource, engine_reason, make_registry)
from dataplane.daemon.state import DaemonSource
from dataplane.engine import bpf_contract, choice, engine_class, multi
from dataplane.engine.api import STAT_NAMES, V6_SHARES
from dataplane.host.udpsock import open_udp_sockets
from dataplane.testbed.overlay import parse_metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
# A label value is a word, a number, an address or a version: this bounds what a bug that put a
# sentence (or an exception's text) into one would have to hide under.
LABEL_VALUE = re.compile(r"[A-Za-z0-9_.:/-]{1,32}|\+Inf")   # +Inf: a histogram's last bucket


class FullSource(MetricsSource):
    """A source that has every family to report, two queues of counters."""

    def __init__(self, per_queue):
        self.per_queue = per_queue

    def engine_queue_stats(self):
        return self.per_queue

    def kernel_counters(self):
        return {name: i for i, name in enumerate(bpf_contract.COUNTER_NAMES)}

    def datapath(self):
        return "kernel"

    def engine_info(self):
        return {"engine": "c", "reason": engine_reason("requested with --engine c"),
                "accept_from": "leases"}

    def peers_count(self):
        return 3

    def peers_by_mode(self):
        return {"direct": 2, "encapsulated": 3}

    def peers_ipv6(self):
        return 2

    def peers_ipv6_by_mode(self):
        return {"direct": 1, "encapsulated": 1}

    def ipv6_underlay_fallback(self):
        return {"on_ipv4": [{"subnet": "10.5.7.0/24"}], "fallbacks": 1, "probes_sent": 9,
                "probes_answered": 5}

    def queues_count(self):
        return len(self.per_queue)

    def offloads_enabled(self):
        return {"tun_tso": True, "udp_gso": False}

    def bad_leases(self):
        return 1, 2

    def config_mismatch(self):
        return False

    def lease_info(self):
        return {"subnet": "10.5.3.0/24", "expiry": 1_800_000_000.0}

    def answer_times(self):
        clock = answer_clock.AnswerClock()
        for endpoint, seconds in (("metrics", 0.002), ("status", 0.0004), ("metrics", 0.07)):
            clock.done(endpoint, (time.monotonic() - seconds, time.process_time()))
        return clock.samples()

    def lease_move_failures(self):
        return 0

    def subnet_file(self):
        return False, 0

    def host_forwarding(self):
        return {"ipv4": True, "ipv6": False}

    def etcd_watches(self):
        return {w: {"connected": True, "reconnects": 1, "resyncs": 0}
                for w in ("subnets", "config", "own_lease")}

    def lease_counts(self):
        return {"renewals": 1, "reacquisitions": 0, "races_lost": 0}


def _queue_stats(q: int) -> dict:
    """Counters as an engine keeps them: `syscalls` is every kind plus 2 wake-up reads."""
    st = {n: 100 * (q + 1) + i for i, n in enumerate(STAT_NAMES)}
    st["syscalls"] = 2 + sum(st[n] for n, (fam, _) in ENGINE_COUNTERS.items()
                             if fam == "flannel_udp_syscalls_total" and n != "syscalls")
    return st


def _scrape(source) -> list:
    return list(text_string_to_metric_families(generate_latest(make_registry(source)).decode()))


def _sample_name(fam) -> str:
    # the parser names a counter's family without _total; its samples carry it
    return fam.name + "_total" if fam.type == "counter" else fam.name


def test_every_engine_counter_has_a_declared_series():
    """A counter added to the engine contract fails here until ENGINE_COUNTERS (and the
    docs) say which series it is."""
    assert set(ENGINE_COUNTERS) | set(V6_SHARES.values()) == set(STAT_NAMES)
    assert not set(ENGINE_COUNTERS) & set(V6_SHARES.values())
    declared = {f.name: f for f in DECLARED}
    for stat, (family, value) in ENGINE_COUNTERS.items():
        f = declared[family]
        assert f.type == "counter" and "queue" in f.labels, stat
        # datapath: engine for these, kernel for the kernel path's (daemon/metrics_kernel.py)
        assert (value is None) == (len([x for x in f.labels if x != "datapath"]) == 1), stat
        # a series of the family label has an IPv6 share or says its one family
        assert ("family" in f.labels) == (family in FAMILY_LABELLED), stat
        if family in FAMILY_LABELLED:
            assert (stat in V6_SHARES) != (stat in FIXED_FAMILY), stat
    assert set(FIXED_FAMILY) <= set(ENGINE_COUNTERS)
    # and no two counters land on one series
    assert len(set(ENGINE_COUNTERS.values())) == len(ENGINE_COUNTERS)


def test_a_scrape_serves_exactly_the_declared_families():
    fams = _scrape(FullSource([_queue_stats(0), _queue_stats(1)]))
    served = {_sample_name(f): (f.type, f.documentation) for f in fams}
    want = {f.name: (f.type, f.help) for f in DECLARED + STANDARD}
    assert served == want
    for fam in fams:
        labels = {f.name: f.labels for f in DECLARED + STANDARD}[_sample_name(fam)]
        for s in fam.samples:
            le = {"le"} if s.name.endswith("_bucket") else set()     # a histogram's buckets
            assert set(s.labels) == set(labels) | le, (s.name, s.labels)


def test_build_info_and_the_process_series():
    fams = {_sample_name(f): f for f in _scrape(MetricsSource())}
    (info,) = fams["flannel_udp_build_info"].samples
    assert info.value == 1 and info.labels["version"] == dataplane.__version__
    assert info.labels["engine"] == ("c" if choice.c_available() else "python")
    assert fams["process_open_fds"].samples[0].value > 0
    assert fams["process_cpu_seconds_total"].samples[0].value >= 0
    assert "python_info" in fams and "python_gc_collections_total" in fams
    # a registry without them, for whoever embeds the collector elsewhere
    assert not any(f.name.startswith("process_") for f in make_registry(
        MetricsSource(), standard=False).collect())


def test_label_values_are_short_words():
    for fam in _scrape(FullSource([_queue_stats(0), _queue_stats(1)])):
        for s in fam.samples:
            for k, v in s.labels.items():
                assert LABEL_VALUE.fullmatch(v), f"{s.name}{{{k}={v!r}}}"


def test_syscalls_are_one_family_whose_kinds_sum_to_the_total():
    per_queue = [_queue_stats(0), _queue_stats(1)]
    samples = [s for f in _scrape(FullSource(per_queue)) for s in f.samples
               if s.name == "flannel_udp_syscalls_total"]
    for q, st in enumerate(per_queue):
        mine = {s.labels["kind"]: s.value for s in samples if s.labels["queue"] == str(q)}
        assert sum(mine.values()) == st["syscalls"] and mine["wake_reads"] == 2


def test_the_syscall_remainder_never_goes_down_between_scrapes():
    """Counters read while the loop runs can catch a kind counted before its total: the
    remainder served stays at its highest until the total itself goes down (a new engine)."""
    st = _queue_stats(0)
    source = FullSource([st])
    reg = make_registry(source, standard=False)

    def rest():
        return reg.get_sample_value("flannel_udp_syscalls_total",
                                    {"kind": "wake_reads", "queue": "0"})
    assert rest() == 2
    source.per_queue = [dict(st, polls=st["polls"] + 1)]      # the kind seen, not yet the total
    assert rest() == 2
    source.per_queue = [dict(st, syscalls=3, **{k: 0 for k in st if k != "syscalls"})]
    assert rest() == 3                                         # a new engine: counted afresh


def test_the_family_label_splits_a_counter_by_its_ipv6_share():
    """ipv6 = the share, ipv4 = the total - the share, kept from going down as the syscall
    remainder is; a counter only IPv6 meets is ipv6 alone, one of neither family other."""
    st = dict.fromkeys(STAT_NAMES, 0)
    st.update(tun_rx_packets=10, v6_tun_rx_packets=3, udp_tx_bytes=900, v6_udp_tx_bytes=400,
              drop_ttl=5, v6_drop_ttl=5, icmp_unreach_sent=2, drop_scope=4, drop_not_ipv4=1)
    source = FullSource([st])
    reg = make_registry(source, standard=False)

    def served(name, **labels):
        dp = {} if name == "icmp_sent" else {"datapath": "engine"}
        return {f: reg.get_sample_value(f"flannel_udp_{name}_total", dict(
            labels, family=f, queue="0", **dp)) for f in ("ipv4", "ipv6", "other")}
    assert served("packets", path="tun_rx") == {"ipv4": 7, "ipv6": 3, "other": None}
    assert served("bytes", path="udp_tx") == {"ipv4": 500, "ipv6": 400, "other": None}
    assert served("drops", reason="ttl") == {"ipv4": 0, "ipv6": 5, "other": None}
    assert served("icmp_sent", type="net_unreachable") == {"ipv4": 2, "ipv6": 0, "other": None}
    assert served("drops", reason="scope") == {"ipv4": None, "ipv6": 4, "other": None}
    assert served("drops", reason="not_ipv4") == {"ipv4": None, "ipv6": None, "other": 1}
    # the testbed's reading sums the families back into the total
    text = generate_latest(reg).decode()
    assert parse_metrics(text)['flannel_udp_packets_total{path="tun_rx"}'] == 10
    # a read that caught the share ahead of its total: ipv4 holds until the total moves on
    source.per_queue = [dict(st, v6_tun_rx_packets=5)]
    assert served("packets", path="tun_rx") == {"ipv4": 7, "ipv6": 5, "other": None}
    source.per_queue = [dict(st, tun_rx_packets=13, v6_tun_rx_packets=5)]
    assert served("packets", path="tun_rx")["ipv4"] == 8
    source.per_queue = [dict(st, tun_rx_packets=2, v6_tun_rx_packets=1)]     # a new engine
    assert served("packets", path="tun_rx")["ipv4"] == 1


def test_an_undeclared_engine_counter_is_not_served(caplog):
    st = dict(_queue_stats(0), gre_wakeups=4242)
    text = generate_latest(make_registry(FullSource([st]), standard=False)).decode()
    assert "gre_wakeups" not in text and " 4242.0" not in text
    assert "gre_wakeups" in caplog.text


@pytest.mark.parametrize("flag,env,c_built,reason", [
    ("python", {}, None, "forced"),
    (None, {"DATAPLANE_ENGINE": "python"}, None, "forced"),
    (None, {}, True, "auto"),
    (None, {}, False, "c_unavailable"),
])
def test_engine_info_reason_is_one_of_a_few_words(monkeypatch, flag, env, c_built, reason):
    """choose_engine's sentence goes to the log; the label keeps which case it was."""
    if c_built is not None:
        monkeypatch.setattr(choice, "_load_c",
                            (lambda: object) if c_built else (lambda: None))
        monkeypatch.setattr(choice, "_fallback_logged", True)
    why = choice.choose_engine(flag, env=env).why
    assert engine_reason(why) == reason


def _doc_rows():
    """(series, type, labels) of every row of docs/metrics.md's reference tables."""
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (counter|gauge|histogram) \|\s*([a-z_, ]*?)\s*\|", DOC.read_text(),
                      re.M)
    return {name: (typ, tuple(x.strip() for x in labels.split(",") if x.strip()))
            for name, typ, labels in rows}


def test_docs_reference_is_the_declared_table():
    documented = _doc_rows()
    declared = {f.name: (f.type, f.labels) for f in DECLARED + STANDARD}
    assert documented == declared


class _Daemon:
    """What DaemonSource.engine_queue_stats reads."""

    def __init__(self, engine):
        self.lock = threading.Lock()
        self.engine = engine


class _EngineSource(MetricsSource):
    """The daemon's own per-queue read, over a daemon that has only its engine."""
    engine_queue_stats = DaemonSource.engine_queue_stats
    _engine_read = DaemonSource._engine_read

    def __init__(self, engine):
        self.daemon = _Daemon(engine)


def test_a_real_two_queue_engine_is_labelled_by_queue(engine_kind):
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(2)]
    socks = open_udp_sockets("127.0.0.1", 0, 2)
    engine = multi.create(engine_class(engine_kind), [p[0].fileno() for p in pairs],
                          [s.fileno() for s in socks], tun_addr="10.5.1.0", mtu=1472)
    try:
        served = {(s.name, tuple(sorted(s.labels.items()))): s.value
                  for f in _scrape(_EngineSource(engine)) for s in f.samples
                  if "queue" in s.labels}
        per_queue = engine.queue_stats()
        declared = {f.name: f.labels for f in DECLARED}
        want = {}
        for stat, (family, value) in ENGINE_COUNTERS.items():
            other = [x for x in declared[family] if x not in ("queue", "family", "datapath")]
            for q, st in enumerate(per_queue):
                labels = dict(zip(other, [value]), queue=str(q),
                              **({"datapath": "engine"} if "datapath" in declared[family]
                                 else {}))
                if family not in FAMILY_LABELLED:
                    want[(family, tuple(sorted(labels.items())))] = st[stat]
                    continue
                v6 = st[V6_SHARES[stat]] if stat in V6_SHARES else None
                for fam, n in (("ipv4", st[stat] - v6), ("ipv6", v6)) if v6 is not None else (
                        (FIXED_FAMILY[stat], st[stat]),):
                    want[(family, tuple(sorted(dict(labels, family=fam).items())))] = n
        # not started, so nothing moves between the scrape and the read above; `syscalls`
        # is served as its remainder beyond the kinds, none yet
        for k in want:
            if ("kind", "wake_reads") in k[1]:
                want[k] = 0
        assert served == want
    finally:
        engine.close()
        for a, b in pairs:
            a.close()
            b.close()
        for s in socks:
            s.close()
