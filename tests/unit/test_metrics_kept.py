"""/metrics made once per change (daemon/metrics_text.py KeptFamilies, MetricsText's texts): a
family whose samples did not change is served from what was made of it, and a scrape after a
change (a lease more, a counter moved, the kernel path's counters) says the change; the body is
generate_latest's text byte for byte either way. And the HTTP server's replies, sent by its
workers, arrive whole however large (daemon/http.py)."""
from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client import generate_latest

from dataplane.daemon.http import HttpServer
from dataplane.daemon.metrics import MetricsSource, make_registry
from dataplane.daemon.metrics_text import MetricsText
from dataplane.engine.api import STAT_NAMES
from dataplane.testbed.overlay import parse_metrics


class Source(MetricsSource):
    """A daemon whose peers, engine counters and kernel path counters the test moves."""

    def __init__(self):
        self.peers = 3
        self.stats = [dict.fromkeys(STAT_NAMES, 0), dict.fromkeys(STAT_NAMES, 0)]
        self.kernel = None
        self.events = []

    def peers_count(self):
        return self.peers

    def engine_queue_stats(self):
        return [dict(q) for q in self.stats]      # a new reading each time, as the engines give

    def kernel_counters(self):
        return dict(self.kernel) if self.kernel is not None else None

    def trace_enabled(self):
        return True

    def trace_events(self, after):
        return self.events


def _daemon_text(source, text: MetricsText) -> bytes:
    """The daemon's own families (no process_* nor python_*, which move by themselves)."""
    return text.render(make_registry(source, standard=False))


def test_a_scrape_after_a_change_says_it_and_is_generate_latest_byte_for_byte():
    src = Source()
    reg = make_registry(src, standard=False)
    text = MetricsText()
    first = text.render(reg)
    assert first == generate_latest(reg)
    assert parse_metrics(first.decode())["flannel_udp_peers"] == 3
    assert text.render(reg) == first                    # nothing changed: the same text

    src.peers = 16_001                                  # a lease came
    src.stats[1]["udp_tx_packets"] = 7
    second = text.render(reg)
    assert second == generate_latest(reg)
    m = parse_metrics(second.decode())
    assert m["flannel_udp_peers"] == 16_001
    assert m['flannel_udp_packets_total{datapath="engine",family="ipv4",path="udp_tx",queue="1"}'] == 7

    src.peers = 16_000                                  # and went
    src.kernel = {"udp_tx_packets": 5, "tx_pass_no_route": 2}
    third = text.render(reg)
    assert third == generate_latest(reg)
    m = parse_metrics(third.decode())
    assert m["flannel_udp_peers"] == 16_000
    assert m['flannel_udp_packets_total{datapath="kernel",family="all",path="udp_tx",queue="none"}'] == 5
    assert m['flannel_udp_kernel_passed_total{direction="tx",reason="no_route"}'] == 2
    # the engine's families, unchanged, were not made again; the kernel's samples were added
    # to a copy of them (the next scrape without them has none)
    src.kernel = None
    assert text.render(reg) == generate_latest(reg) == second.replace(b"16001", b"16000")


def test_an_unchanged_family_is_the_same_object_a_changed_one_a_new_one():
    src = Source()
    reg = make_registry(src, standard=False)
    before = {f.name: f for f in reg.collect()}
    src.stats[0]["tun_rx_packets"] = 1
    after = {f.name: f for f in reg.collect()}
    assert after["flannel_udp_peers"] is before["flannel_udp_peers"]
    assert after["flannel_udp_packets"] is not before["flannel_udp_packets"]
    assert after["flannel_udp_bytes"] is before["flannel_udp_bytes"]


@pytest.fixture
def server():
    src = Source()
    s = HttpServer("127.0.0.1", 0, src, ("healthz", "metrics", "trace")).start()
    yield s, src
    s.close()


def test_metrics_over_http_show_the_lease_that_came(server):
    s, src = server
    url = "http://%s:%d/metrics" % s.address
    assert parse_metrics(urllib.request.urlopen(url, timeout=5).read().decode())[
        "flannel_udp_peers"] == 3
    src.peers = 4
    assert parse_metrics(urllib.request.urlopen(url, timeout=5).read().decode())[
        "flannel_udp_peers"] == 4


def test_a_reply_larger_than_the_socket_takes_arrives_whole(server):
    """The worker sends what the socket takes; the loop sends the rest."""
    s, src = server
    src.events = [{"seq": i, "kind": "tun_read", "len": 64, "note": "x" * 200}
                  for i in range(40_000)]                   # ~10 MB of JSON
    for _ in range(3):
        got = json.loads(urllib.request.urlopen("http://%s:%d/debug/trace" % s.address,
                                                timeout=30).read())
        assert len(got) == 40_000 and got[-1]["seq"] == 39_999
