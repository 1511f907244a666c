"""Daemon building blocks that need no root: the metrics/health HTTP server, iptables/nftables rule
text, engine choice and sd_notify."""
from __future__ import annotations

import json
import logging
import shutil
import socket
import urllib.error
import urllib.request

import pytest

from dataplane.host import firewall
from dataplane.engine.api import STAT_NAMES, V6_SHARES
from dataplane.daemon.http import HttpServer
from dataplane.daemon.metrics import MetricsSource


def stat_value(name: str) -> float:
    """Each engine counter gets its own value, far from every other metric's (peers 2, info 1,
    the expiry 1.8e9), so that a sample with it can only be that counter; IPv6's shares are
    smaller than their totals, as an engine's are."""
    return (10.0 if name.startswith("v6_") else 1000.0) + STAT_NAMES.index(name)


class Source(MetricsSource):
    def __init__(self, trace=True):
        self._trace = trace

    def engine_stats(self):
        return {n: stat_value(n) for n in STAT_NAMES}

    def engine_info(self):
        return {"engine": "python", "reason": "forced", "accept_from": "leases"}

    def peers_count(self):
        return 2

    def lease_info(self):
        return {"subnet": "10.5.3.0/24", "expiry": 1_800_000_000.0}

    def trace_enabled(self):
        return self._trace

    def trace_events(self, after):
        return [{"seq": after + 1, "kind": "tun_read", "len": 84, "head": b"\x45\x00"}]


def get(url):
    try:
        r = urllib.request.urlopen(url, timeout=5)
        return r.status, r.read().decode(), r.headers.get("Content-Type")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers.get("Content-Type")


@pytest.fixture
def server():
    s = HttpServer("127.0.0.1", 0, Source(), ("healthz", "metrics", "trace")).start()
    yield "http://%s:%d" % s.address
    s.close()


def test_healthz_is_flanneld_reply(server):
    assert get(server + "/healthz")[:2] == (200, "flanneld is running")
    assert get(server + "/other")[0] == 404


def test_metrics_text(server):
    from prometheus_client.parser import text_string_to_metric_families
    status, body, ctype = get(server + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    v = stat_value
    tx, tx6 = v("udp_tx_packets"), v("v6_udp_tx_packets")
    eng = 'datapath="engine",'
    assert f'flannel_udp_packets_total{{{eng}family="ipv4",path="udp_tx",queue="0"}} {tx - tx6}' \
        in body
    assert f'flannel_udp_packets_total{{{eng}family="ipv6",path="udp_tx",queue="0"}} {tx6}' in body
    bad, bad6 = v("drop_bad_source"), v("v6_drop_bad_source")
    assert f'flannel_udp_drops_total{{{eng}family="ipv4",queue="0",reason="bad_source"}} ' \
        f'{bad - bad6}' in body
    assert f'flannel_udp_drops_total{{{eng}family="other",queue="0",reason="not_ipv4"}} ' \
        f'{v("drop_not_ipv4")}' in body
    assert f'flannel_udp_syscalls_total{{kind="polls",queue="0"}} {v("polls")}' in body
    if "icmp_ratelimited" in STAT_NAMES:
        assert f'flannel_udp_icmp_ratelimited_total{{queue="0"}} {v("icmp_ratelimited")}' in body
    assert "flannel_udp_peers 2.0" in body
    assert 'flannel_udp_lease_expiry_timestamp_seconds{subnet="10.5.3.0/24"} 1.8e+09' in body
    assert 'flannel_udp_engine_info{accept_from="leases",engine="python",reason="forced"} 1.0' \
        in body
    # every engine counter is exported as a sample carrying its value (HELP and TYPE lines,
    # which name the families too, count for nothing here); `syscalls` is the total of the
    # kinds (its remainder is a kind of its own, tests/unit/test_metrics_names.py)
    samples = [s for fam in text_string_to_metric_families(body) for s in fam.samples]
    assert all(s.name.startswith(("flannel_udp_", "process_", "python_")) for s in samples)
    exported = {s.value for s in samples}
    # (a counter with an IPv6 share as its two families: the share, and the rest as ipv4)
    missing = [n for n in STAT_NAMES if n != "syscalls" and
               (v(n) - v(V6_SHARES[n]) if n in V6_SHARES else v(n)) not in exported]
    assert not missing, f"engine counters without a sample: {missing}"


def test_trace_json(server):
    status, body, ctype = get(server + "/debug/trace?after=41")
    assert status == 200 and ctype == "application/json"
    assert json.loads(body) == [{"seq": 42, "kind": "tun_read", "len": 84, "head": "4500"}]
    assert get(server + "/debug/trace?after=x")[0] == 400


def test_trace_off_says_how_to_turn_it_on():
    s = HttpServer("127.0.0.1", 0, Source(trace=False), ("healthz", "trace")).start()
    try:
        status, body, _ = get("http://%s:%d/debug/trace" % s.address)
        assert status == 404 and "--trace" in body
        assert get("http://%s:%d/metrics" % s.address)[0] == 404   # not served here
    finally:
        s.close()


def test_port_in_use_names_it():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            HttpServer("127.0.0.1", port, Source())


def test_masq_rules_are_flanneld_rules():
    rules = firewall.masq_rules("10.5.0.0/16", "10.5.3.0/24", random_fully=True)
    c = ["-m", "comment", "--comment", "flanneld masq"]
    assert rules == [
        ("nat", "POSTROUTING", c + ["-j", "FLANNEL-POSTRTG"]),
        ("nat", "FLANNEL-POSTRTG", ["-m", "mark", "--mark", "0x4000/0x4000"] + c + ["-j", "RETURN"]),
        ("nat", "FLANNEL-POSTRTG", ["-s", "10.5.3.0/24", "-d", "10.5.0.0/16"] + c + ["-j", "RETURN"]),
        ("nat", "FLANNEL-POSTRTG", ["-s", "10.5.0.0/16", "-d", "10.5.3.0/24"] + c + ["-j", "RETURN"]),
        ("nat", "FLANNEL-POSTRTG", ["!", "-s", "10.5.0.0/16", "-d", "10.5.3.0/24"] + c + ["-j", "RETURN"]),
        ("nat", "FLANNEL-POSTRTG", ["-s", "10.5.0.0/16", "!", "-d", "224.0.0.0/4"] + c
         + ["-j", "MASQUERADE", "--random-fully"]),
        ("nat", "FLANNEL-POSTRTG", ["!", "-s", "10.5.0.0/16", "-d", "10.5.0.0/16"] + c
         + ["-j", "MASQUERADE", "--random-fully"]),
    ]
    fwd = firewall.forward_rules("10.5.0.0/16")
    assert [r[2][-1] for r in fwd] == ["FLANNEL-FWD", "ACCEPT", "ACCEPT"]


def test_nft_ruleset_mirrors_iptables():
    text = firewall.nft_ruleset("10.5.0.0/16", "10.5.3.0/24", masq=True, forward=True)
    assert "type nat hook postrouting" in text and "type filter hook forward" in text
    assert "chain postrtg {" in text and "chain forward {" in text
    assert "ip saddr 10.5.3.0/24 ip daddr 10.5.0.0/16 return" in text
    assert "ip saddr != 10.5.0.0/16 ip daddr 10.5.3.0/24 return" in text
    assert text.count("masquerade fully-random") == 2
    off = firewall.nft_ruleset("10.5.0.0/16", "10.5.3.0/24", masq=True, forward=True,
                               random_fully=False)
    assert off.count("masquerade") == 2 and "fully-random" not in off


def test_ip_masq_without_any_tool_is_a_clear_error(monkeypatch, caplog):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(firewall.MasqError, match="iptables.*nft.*--ip-masq"):
        firewall.Rules("10.5.0.0/16", "10.5.3.0/24", masq=True, forward=True)
    # forward rules alone only warn (as flanneld), and install/remove then run nothing
    ran = []
    monkeypatch.setattr(firewall, "run", lambda argv, check=True: ran.append(argv))
    with caplog.at_level(logging.WARNING, logger=firewall.log.name):
        r = firewall.Rules("10.5.0.0/16", "10.5.3.0/24", masq=False, forward=True)
    assert r.tool is None
    assert any(rec.levelno == logging.WARNING and "iptables not found" in rec.getMessage()
               and "10.5.0.0/16" in rec.getMessage() for rec in caplog.records), caplog.text
    r.install()
    r.remove()
    assert ran == []


def test_engine_choice_explains_itself():
    from dataplane.engine import choose_engine
    from dataplane.engine import c_available
    cls, why = choose_engine("python")
    assert cls.name == "python" and "--engine python" in why
    cls, why = choose_engine("auto")
    assert why.startswith("auto:") and cls.name == ("c" if c_available() else "python")


def test_sd_notify(tmp_path, monkeypatch):
    from dataplane.daemon.systemd import sd_notify
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        assert sd_notify("READY=1")
        s.settimeout(2)
        assert s.recv(100) == b"READY=1"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not sd_notify("READY=1")
