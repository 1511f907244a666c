"""The demo's pure part (dataplane/demo/trace.py): no root, no etcd.

The integration test checks the numbers against a running overlay; these check
the pieces in isolation: that /metrics decodes back to exactly the engine
counters (through the daemon's real collector), that one packet is found and
followed in two trace rings among others, and the arithmetic of the costs.
"""
from __future__ import annotations

import struct

from prometheus_client import generate_latest

from dataplane.engine import ipv4
from dataplane.demo import trace as tr
from dataplane.engine.api import STAT_NAMES, SYSCALL_STATS, V6_SHARES
from dataplane.daemon.metrics import MetricsSource, make_registry
from dataplane.testbed.overlay import parse_metrics


class _Source(MetricsSource):
    def __init__(self, stats):
        self.stats = stats

    def engine_stats(self):
        return self.stats


def test_metrics_decode_back_to_every_engine_counter():
    stats = {name: 1000 + i for i, name in enumerate(STAT_NAMES)}
    # IPv6's shares within their totals: /metrics serves each total as its two families
    stats.update({share: stats[total] // 3 for total, share in V6_SHARES.items()})
    # as the engines count: every syscall in `syscalls`, the kinds each in its own counter, and
    # a few wake-up reads in neither of the kinds
    stats["syscalls"] = 3 + sum(stats[k] for k in SYSCALL_STATS
                                if k not in ("syscalls", "tx_batches", "rx_batches"))
    text = generate_latest(make_registry(_Source(stats))).decode()
    assert tr.stats_from_metrics(parse_metrics(text)) == stats


class _KernelSource(_Source):
    """A daemon with the kernel path: the engine's counters and the programs'."""
    def __init__(self, stats, counters):
        super().__init__(stats)
        self.counters = counters

    def kernel_counters(self):
        return self.counters

    def datapath(self):
        return "kernel"


def test_the_programs_counters_read_apart_from_the_engines():
    from dataplane.demo.kernel_readings import kernel_counters
    stats = {name: 0 for name in STAT_NAMES}
    stats.update(udp_tx_packets=5, tun_rx_packets=5)
    programs = {"udp_tx_packets": 7, "udp_tx_bytes": 588, "tun_tx_packets": 3,
                "drop_bad_source": 2, "tx_pass_ttl": 1, "rx_pass_gso": 4}
    m = parse_metrics(generate_latest(make_registry(_KernelSource(stats, programs))).decode())
    got = tr.stats_from_metrics(m)          # the engine's: none of the programs' packets
    assert (got["udp_tx_packets"], got["tun_rx_packets"], got["tun_tx_packets"]) == (5, 5, 0)
    assert kernel_counters(m) == {"udp_tx_packets": 7, "udp_tx_bytes": 588, "tun_tx_packets": 3,
                                  "drop_bad_source": 2, "passed_tx_ttl": 1, "passed_rx_gso": 4}


def test_delta():
    assert tr.delta({"a": 1, "b": 5}, {"a": 4, "b": 5, "c": 2}) == {"a": 3, "b": 0, "c": 2}


def test_peers_by_mode_read_back_from_the_daemons_metrics():
    class Source(_Source):
        def peers_by_mode(self):
            return {"direct": 1, "encapsulated": 0}
    from dataplane.daemon.metrics import PREFIX
    text = generate_latest(make_registry(Source({}))).decode()
    got = tr.by_label(parse_metrics(text), f"{PREFIX}_peers_by_mode", "mode")
    assert got == {"direct": 1.0, "encapsulated": 0.0}
    assert tr.by_label(parse_metrics(text), f"{PREFIX}_peers_by_mode", "queue") == {}


def test_parse_route_get():
    r = tr.parse_route_get("10.5.14.2 from 10.5.40.2 dev flannel0 src 10.5.40.0 uid 0 \n"
                           "    cache \n")
    assert r["dst"] == "10.5.14.2" and r["dev"] == "flannel0" and r["from"] == "10.5.40.2"
    assert r["src"] == "10.5.40.0"
    r = tr.parse_route_get("10.5.14.2 via 10.5.40.1 dev eth0 src 10.5.40.2 uid 0")
    assert r["via"] == "10.5.40.1" and r["dev"] == "eth0"


def test_route_for_takes_the_longest_prefix():
    routes = "default via 192.168.77.254 dev v0\n10.5.0.0/16 dev flannel0\n" \
             "10.5.40.0/24 dev wa proto kernel scope link src 10.5.40.1\n"
    assert tr.route_for(routes, "10.5.14.2") == "10.5.0.0/16 dev flannel0"
    assert tr.route_for(routes, "10.5.40.2").startswith("10.5.40.0/24 dev wa")
    assert tr.route_for(routes, "8.8.8.8").startswith("default")


A_WL, B_WL, A_IP, B_IP = "10.5.40.2", "10.5.14.2", "192.168.77.1", "192.168.77.2"


def _echo(src, dst, ident, ttl=63):
    return ipv4.build(src, dst, ipv4.echo_request(7, 1, bytes(56)), proto=ipv4.PROTO_ICMP,
                      ttl=ttl, ident=ident)


def _ev(seq, kind, length=0, addr="0.0.0.0", port=0, batch=0, head=b""):
    return {"seq": seq, "ts_ns": seq * 1000, "kind": kind, "len": length, "addr": addr,
            "port": port, "batch": batch, "head": head.hex()}


def _dec(pkt):
    p = bytearray(pkt)
    ipv4.decrement_ttl(p)
    return bytes(p)


def test_follow_finds_the_packet_among_others():
    other = _echo(A_WL, "10.5.99.9", 1)
    pkt = _echo(A_WL, B_WL, 4242)
    out = _dec(pkt)
    send = [_ev(1, "tun_read", len(other), head=other[:64]),
            _ev(2, "route_hit", 24, "192.168.77.9", 8285),
            _ev(3, "tun_read", len(pkt), head=pkt[:64]),
            _ev(4, "route_hit", 24, B_IP, 8285),
            _ev(5, "udp_send", len(other), "192.168.77.9", 8285, 2),
            _ev(6, "udp_send", len(pkt), B_IP, 8285, 2)]
    recv = [_ev(10, "udp_recv", len(out), A_IP, 8285, 1, out[:64]),
            _ev(11, "tun_write", len(out), head=_dec(out)[:64])]
    leg = tr.follow(send, recv, A_WL, B_WL, "icmp")
    assert leg["tun_read"]["seq"] == 3 and leg["tun_read"]["len"] == 84
    p = leg["tun_read"]["packet"]
    assert (p["src"], p["dst"], p["ttl"], p["id"], p["tot_len"]) == (A_WL, B_WL, 63, 4242, 84)
    assert p["icmp"]["name"] == "echo request" and p["checksum_ok"]
    assert leg["route_hit"] == {"seq": 4, "prefixlen": 24, "peer": B_IP, "port": 8285}
    assert leg["udp_send"]["seq"] == 6 and leg["udp_send"]["batch"] == 2
    assert leg["udp_recv"]["source"] == A_IP and leg["udp_recv"]["packet"]["ttl"] == 62
    assert leg["tun_write"]["packet"]["ttl"] == 61 and leg["tun_write"]["packet"]["checksum_ok"]


def test_follow_reports_a_miss():
    pkt = _echo(A_WL, B_WL, 1)
    send = [_ev(1, "tun_read", len(pkt), head=pkt[:64]), _ev(2, "route_miss", 0, B_WL)]
    leg = tr.follow(send, [], A_WL, B_WL, "icmp")
    assert leg["dropped"]["kind"] == "route_miss" and "route_hit" not in leg


def test_follow_both_builds_the_outer_datagram_and_says_what_is_missing():
    pkt = _echo(A_WL, B_WL, 4242)
    out = _dec(pkt)
    events = {"A": [_ev(1, "tun_read", len(pkt), head=pkt[:64]),
                    _ev(2, "route_hit", 24, B_IP, 8285), _ev(3, "udp_send", len(pkt), B_IP, 8285, 1)],
              "B": [_ev(10, "udp_recv", len(out), A_IP, 8285, 1, out[:64]),
                    _ev(11, "tun_write", len(out), head=_dec(out)[:64])]}
    frame = _frame(out)
    frames = [{"hex": frame.hex(), "frame_len": len(frame), "pkttype": 4}]
    req, rep = tr.follow_both(events, frames, (A_WL, B_WL), (A_IP, B_IP), 8285, "icmp")
    assert req["outer"] == tr.outer_datagram(len(pkt), A_IP, B_IP, 8285)
    assert req["wire"]["inner"]["id"] == 4242 and req["wire"]["direction"] == "out"
    assert tr.missing_events(req) == []
    # no reply in either ring: every event of its path is missing, in path order
    assert tr.missing_events(req, rep) == list(tr.LEG_EVENTS)


def _frame(inner, src=A_IP, dst=B_IP, port=8285):
    udp = struct.pack("!HHHH", port, port, 8 + len(inner), 0) + inner
    outer = ipv4.build(src, dst, udp, proto=ipv4.PROTO_UDP, flags=2)
    return bytes(12) + b"\x08\x00" + outer


def test_decode_frame_and_wire_match():
    inner = _dec(_echo(A_WL, B_WL, 77))
    frame = _frame(inner)
    d = tr.decode_frame(frame.hex())
    assert d["outer"]["tot_len"] == len(inner) + tr.OVERHEAD
    assert d["outer"]["udp"] == {"sport": 8285, "dport": 8285, "len": len(inner) + 8}
    assert d["outer"]["df"] and d["inner"]["id"] == 77
    frames = [{"hex": _frame(_echo(A_WL, B_WL, 5)).hex(), "frame_len": 126, "pkttype": 4},
              {"hex": frame.hex(), "frame_len": len(frame), "pkttype": 4}]
    w = tr.wire_frame_for(frames, A_IP, B_IP, 77, A_WL)
    assert w["inner"]["id"] == 77 and w["direction"] == "out"
    assert tr.wire_frame_for(frames, B_IP, A_IP, 77, A_WL) is None


def test_outer_datagram_sizes():
    o = tr.outer_datagram(84, A_IP, B_IP, 8285)
    assert (o["udp_len"], o["ip_len"], o["frame_len"], o["overhead"]) == (92, 112, 126, 28)


def test_per_packet():
    d = {"tun_rx_packets": 100, "tx_batches": 10, "udp_sends": 10, "syscalls": 130,
         "tun_reads": 110, "polls": 10, "tun_rx_bytes": 6400, "udp_tx_bytes": 6400}
    s = tr.per_packet(d, "send")
    assert s["syscalls_per_packet"] == 1.3 and s["avg_batch"] == 10
    assert s["mmsg_calls_per_packet"] == 0.1 and s["bytes_copied"] == 12800
    assert tr.per_packet({}, "receive") == {"packets": 0}


def test_cost_model_is_what_the_story_says():
    m = {x["short"]: x for x in tr.COST_MODEL}
    assert m["TUN + UDP"]["copies"] == 4 and m["TUN + UDP"]["bytes_added"] == 28
    assert m["kernel VXLAN"]["bytes_added"] == 50 and m["direct routing"]["copies"] == 0


A6, B6 = "fc00:5:0:28::2", "fc00:5:0:e::2"


def _echo6(src, dst, seq, hop=63):
    from dataplane.engine import ipv6
    pkt = bytearray(ipv6.echo_request(src, dst, ident=7, seq=seq, data=bytes(56)))
    pkt[7] = hop                                     # the hop limit, as A's kernel forwarded it
    return bytes(pkt)


def _dec6(pkt):
    from dataplane.engine import ipv6
    p = bytearray(pkt)
    ipv6.decrement_hop_limit(p)
    return bytes(p)


def test_an_inner_ipv6_ping_is_followed_by_its_echo_id_and_seq():
    """demo --ipv6: the heads hold IPv6 headers; the route hit carries the IPv4 peer; with no
    IP id, the echo's id and sequence tie the two rings together (seq 1 is not seq 2)."""
    other, first, pkt = _echo6(A6, "fc00:5:0:99::9", 2), _echo6(A6, B6, 1), _echo6(A6, B6, 2)
    out = _dec6(pkt)
    send = [_ev(1, "tun_read", len(other), head=other[:64]),
            _ev(2, "route_hit", 64, "192.168.77.9", 8285),
            _ev(3, "tun_read", len(pkt), head=pkt[:64]),
            _ev(4, "route_hit", 64, B_IP, 8285),
            _ev(5, "udp_send", len(pkt), B_IP, 8285, 2)]
    recv = [_ev(10, "udp_recv", len(first), A_IP, 8285, 2, _dec6(first)[:64]),
            _ev(11, "tun_write", len(first), head=_dec6(_dec6(first))[:64]),
            _ev(12, "udp_recv", len(out), A_IP, 8285, 2, out[:64]),
            _ev(13, "tun_write", len(out), head=_dec6(out)[:64])]
    leg = tr.follow(send, recv, A6, B6, "icmp6")
    p = leg["tun_read"]["packet"]
    assert leg["tun_read"]["seq"] == 3 and p["len"] == 104 == p["tot_len"]
    assert (p["version"], p["src"], p["dst"], p["ttl"], p["id"]) == (6, A6, B6, 63, None)
    assert p["icmp"] == {"type": 128, "code": 0, "id": 7, "seq": 2, "name": "echo request"}
    assert leg["route_hit"] == {"seq": 4, "prefixlen": 64, "peer": B_IP, "port": 8285}
    assert leg["udp_recv"]["seq"] == 12 and leg["udp_recv"]["packet"]["hop_limit"] == 62
    assert leg["tun_write"]["seq"] == 13 and leg["tun_write"]["packet"]["ttl"] == 61
    frames = [{"hex": _frame(out).hex(), "frame_len": 14 + 28 + len(out), "pkttype": 4}]
    req, _ = tr.follow_both({"A": send, "B": recv}, frames, (A6, B6), (A_IP, B_IP), 8285,
                            "icmp6")
    assert req["outer"]["ip_len"] == 104 + 28 and req["wire"]["inner"]["src"] == A6
    assert tr.missing_events(req) == []


def test_an_ipv4_packet_still_decodes_as_before():
    pkt = _echo(A_WL, B_WL, 9)
    assert tr.decode_inner(pkt[:64]) == tr.decode_packet(pkt[:64])
