"""Forwarding through both engines: TUN -> UDP, UDP -> TUN, lookups, route
swaps, stop and close (harness: tests/engine_harness.py)."""
import fcntl
import os
import random
import socket

import pytest

from dataplane.engine import ipv4, ipv6
from dataplane.engine import EngineClosed
from tests.engine_harness import Harness, assert_forwarded, expect_only


def udp_packet(src, dst, size=64, ttl=64, **kw):
    data = bytes((i * 7) & 0xFF for i in range(max(0, size - 28)))
    return ipv4.build(src, dst, ipv4.udp_payload(4000, 5000, data), ttl=ttl, **kw)


def test_tun_to_udp(engine_kind):
    with Harness(engine_kind) as h:
        p1, p2 = h.add_peer(), h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p1), h.route("10.5.3.0/24", p2)])
        rnd = random.Random(3)
        sent1, sent2 = [], []
        for i in range(200):
            to1 = i % 3 != 0
            opts = bytes(4 * rnd.randrange(0, 11))
            pkt = udp_packet("10.5.1.9", "10.5.2.7" if to1 else "10.5.3.200",
                             size=rnd.randrange(28 + len(opts), h.mtu - len(opts)),
                             ttl=rnd.randrange(2, 256), ident=i, options=opts)
            (sent1 if to1 else sent2).append(pkt)
            h.inject_tun(pkt)
        st = h.settle()
        assert len(p1.received) == len(sent1) and len(p2.received) == len(sent2)
        for a, b in zip(sent1 + sent2, p1.received + p2.received):
            assert_forwarded(a, b)
        nbytes = sum(map(len, sent1 + sent2))
        expect_only(st, tun_rx_packets=200, tun_rx_bytes=nbytes, udp_tx_packets=200,
                    udp_tx_bytes=nbytes)
        assert h.tun_received == []


def test_udp_to_tun(engine_kind):
    with Harness(engine_kind) as h:
        p1, p2 = h.add_peer(), h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p1), h.route("10.5.3.0/24", p2)])
        sent = []
        for i in range(150):
            pkt = udp_packet("10.5.2.7" if i % 2 else "10.5.3.8", "10.5.1.9",
                             size=28 + (i * 37) % (h.mtu - 28), ttl=2 + i % 250, ident=i)
            sent.append(pkt)
            h.inject_udp(p1 if i % 2 else p2, pkt)
        st = h.settle()
        assert len(h.tun_received) == len(sent)
        for a, b in zip(sent, h.tun_received):
            assert_forwarded(a, b)
        nbytes = sum(map(len, sent))
        expect_only(st, udp_rx_packets=150, udp_rx_bytes=nbytes, tun_tx_packets=150,
                    tun_tx_bytes=nbytes)


def test_both_directions_at_once(engine_kind):
    with Harness(engine_kind) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        out = [udp_packet("10.5.1.2", "10.5.2.3", size=100, ident=i) for i in range(300)]
        back = [udp_packet("10.5.2.3", "10.5.1.2", size=120, ident=i) for i in range(300)]
        for a, b in zip(out, back):
            h.inject_tun(a)
            h.inject_udp(p, b)
        st = h.settle()
        assert [o[4:6] for o in p.received] == [o[4:6] for o in out]
        assert [o[4:6] for o in h.tun_received] == [o[4:6] for o in back]
        assert st["udp_tx_packets"] == st["tun_tx_packets"] == 300


def test_mtu_sized_packets_both_ways(engine_kind):
    with Harness(engine_kind, mtu=1400) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        pkt = udp_packet("10.5.1.2", "10.5.2.3", size=1400)
        h.inject_tun(pkt)
        h.inject_udp(p, udp_packet("10.5.2.3", "10.5.1.2", size=1400))
        st = h.settle()
        assert_forwarded(pkt, p.received[0])
        assert len(h.tun_received[0]) == 1400
        assert st["udp_tx_packets"] == st["tun_tx_packets"] == 1


@pytest.mark.parametrize("batch", [1, 7, 256])
def test_batch_sizes(engine_kind, batch):
    with Harness(engine_kind, batch=batch) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        pkts = [udp_packet("10.5.1.2", "10.5.2.3", ident=i) for i in range(100)]
        h.inject_tun(*pkts)
        h.inject_udp(p, *[udp_packet("10.5.2.3", "10.5.1.2", ident=i) for i in range(100)])
        st = h.settle()
        assert [x[4:6] for x in p.received] == [x[4:6] for x in pkts]
        assert st["udp_tx_packets"] == st["tun_tx_packets"] == 100


def test_lookup_across_10000_routes(engine_kind):
    with Harness(engine_kind) as h:
        peers = [h.add_peer() for _ in range(8)]
        routes = []
        for i in range(10000):
            routes.append(h.route(f"10.{i // 256}.{i % 256}.0/24", peers[i % 8]))
        h.set_routes(routes)
        h.wait_for(lambda st: st["route_swaps"] == 1, what="table adopted")
        rnd = random.Random(4)
        expected = {p.port: [] for p in peers}
        for j in range(300):
            i = rnd.randrange(10000)
            pkt = udp_packet("10.200.0.1", f"10.{i // 256}.{i % 256}.{rnd.randrange(256)}",
                             ident=j)
            expected[peers[i % 8].port].append(pkt[4:6])
            h.inject_tun(pkt)
        h.inject_tun(udp_packet("10.200.0.1", "10.39.16.1"))   # 10000 = 39*256 + 16: no route
        st = h.settle()
        for p in peers:
            assert [x[4:6] for x in p.received] == expected[p.port]
        assert st["udp_tx_packets"] == 300 and st["drop_no_route"] == 1


def test_longest_prefix_among_mixed_lengths(engine_kind):
    with Harness(engine_kind) as h:
        p0, p8, p16, p24, p32, p25 = (h.add_peer() for _ in range(6))
        h.set_routes([h.route("0.0.0.0/0", p0), h.route("10.0.0.0/8", p8),
                      h.route("10.5.0.0/16", p16), h.route("10.5.3.0/24", p24),
                      h.route("10.5.3.7/32", p32), h.route("10.5.3.128/25", p25)])
        cases = {"10.5.3.7": p32, "10.5.3.6": p24, "10.5.3.127": p24, "10.5.3.128": p25,
                 "10.5.3.255": p25, "10.5.4.1": p16, "10.6.0.1": p8, "11.0.0.1": p0,
                 "192.168.1.1": p0, "10.5.255.255": p16}
        for k, dst in enumerate(cases):
            h.inject_tun(udp_packet("10.5.1.1", dst, ident=k))
        st = h.settle()
        for k, (dst, peer) in enumerate(cases.items()):
            got = [x for x in peer.received if x[4:6] == k.to_bytes(2, "big")]
            assert len(got) == 1 and got[0][16:20] == socket.inet_aton(dst), dst
        assert st["udp_tx_packets"] == len(cases)
        assert sum(len(p.received) for p in h.peers) == len(cases)


def test_route_swap_while_running(engine_kind):
    with Harness(engine_kind) as h:
        old, new = h.add_peer(), h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", old)])
        h.inject_tun(*[udp_packet("10.5.1.2", "10.5.2.3", ident=i) for i in range(20)])
        h.settle()
        assert len(old.received) == 20
        h.set_routes([h.route("10.5.2.0/24", new), h.route("10.5.9.0/24", old)])
        h.wait_for(lambda st: st["route_swaps"] == 2, what="second table adopted")
        h.inject_tun(*[udp_packet("10.5.1.2", "10.5.2.3", ident=i) for i in range(20, 50)])
        h.inject_tun(udp_packet("10.5.1.2", "10.5.9.1", ident=99))
        st = h.settle()
        assert len(new.received) == 30 and len(old.received) == 21
        assert old.received[-1][4:6] == (99).to_bytes(2, "big")
        h.set_routes([])
        h.wait_for(lambda st: st["route_swaps"] == 3, what="empty table adopted")
        h.inject_tun(udp_packet("10.5.1.2", "10.5.2.3"))
        st = h.settle()
        assert st["drop_no_route"] == 1 and st["udp_tx_packets"] == 51


def test_swap_under_traffic_never_loses_or_misroutes(engine_kind):
    """Packets to two subnets while the table flips between two layouts: each
    packet reaches exactly one of the two peers that some table names."""
    with Harness(engine_kind) as h:
        a, b = h.add_peer(), h.add_peer()
        t1 = [h.route("10.5.2.0/24", a), h.route("10.5.3.0/24", b)]
        t2 = [h.route("10.5.2.0/24", b), h.route("10.5.3.0/24", a)]
        h.set_routes(t1)
        for i in range(400):
            h.inject_tun(udp_packet("10.5.1.2", "10.5.2.3" if i % 2 else "10.5.3.3",
                                    ident=i))
            if i % 40 == 0:
                h.set_routes(t1 if (i // 40) % 2 else t2, wait=False)
        st = h.settle()
        assert st["udp_tx_packets"] == 400 and st["drop_no_route"] == 0
        assert len(a.received) + len(b.received) == 400


def test_send_error_drops_one_and_sends_the_rest(engine_kind):
    # 65000 bytes of UDP payload is too big for an IPv4 datagram (max 65507 +
    # headers... only with a 65535-byte packet): sendto fails with EMSGSIZE
    # before anything goes on the wire.
    # An IPv6 inner packet that long is over the path's MTU (dataplane.h "Path MTU": the
    # kernel's refusal says loopback's): drop_too_big, and no packet too big without an
    # IPv6 address on flannel0.
    with Harness(engine_kind, mtu=65535, batch=8) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p), h.route("fc00:5:0:2::/64", p)])
        big = ipv4.build("10.5.1.2", "10.5.2.3", bytes(65535 - 20))
        small = [udp_packet("10.5.1.2", "10.5.2.3", ident=i) for i in range(3)]
        big6 = ipv6.build("fc00:5:0:1::2", "fc00:5:0:2::3", bytes(65535 - 40))
        small6 = ipv6.build("fc00:5:0:1::2", "fc00:5:0:2::3", bytes(24))
        h.inject_tun(small[0], big, small[1], small[2], big6, small6)
        st = h.settle()
        expect_only(st, tun_rx_packets=6, tun_rx_bytes=2 * 65535 + 3 * 64 + 64,
                    udp_tx_packets=4, udp_tx_bytes=4 * 64, drop_send_error=1, drop_too_big=1,
                    v6_tun_rx_packets=2, v6_tun_rx_bytes=65535 + 64, v6_udp_tx_packets=1,
                    v6_udp_tx_bytes=64)
        assert [x[4:6] for x in p.received[:3]] == [x[4:6] for x in small]


def test_tun_full_is_counted_and_not_retried(engine_kind):
    with Harness(engine_kind, collect_tun=False, tun_sndbuf=4096) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        n = 200
        h.inject_udp(p, *[udp_packet("10.5.2.3", "10.5.1.2", ident=i) for i in range(n)])
        st = h.settle(outputs=False)
        assert st["drop_tun_full"] > 0
        assert st["tun_tx_packets"] + st["drop_tun_full"] == n
        assert st["tun_writes"] == n
        expect_only(st, udp_rx_packets=n, udp_rx_bytes=64 * n,
                    tun_tx_packets=st["tun_tx_packets"], tun_tx_bytes=64 * st["tun_tx_packets"],
                    drop_tun_full=st["drop_tun_full"])


def test_tun_error_is_counted(engine_kind):
    # A datagram larger than the socketpair's send buffer fails with EMSGSIZE.
    with Harness(engine_kind, mtu=9000, tun_sndbuf=4096) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        big = udp_packet("10.5.2.3", "10.5.1.2", size=8900)
        ok = udp_packet("10.5.2.3", "10.5.1.2", size=100)
        # and IPv6's, in its shares too
        big6 = ipv6.build("fc00:5:0:2::3", "fc00:5:0:1::2", bytes(8900 - 40))
        ok6 = ipv6.build("fc00:5:0:2::3", "fc00:5:0:1::2", bytes(100 - 40))
        h.inject_udp(p, big, ok, big6, ok6)
        st = h.settle()
        expect_only(st, udp_rx_packets=4, udp_rx_bytes=18000, tun_tx_packets=2,
                    tun_tx_bytes=200, drop_tun_error=2,
                    v6_udp_rx_packets=2, v6_udp_rx_bytes=9000, v6_tun_tx_packets=1,
                    v6_tun_tx_bytes=100, v6_drop_tun_error=1)
        assert len(h.tun_received) == 2


def test_fds_modes_and_ownership(engine_kind):
    with Harness(engine_kind, start=False) as h:
        assert fcntl.fcntl(h.tun_engine.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
        assert not fcntl.fcntl(h.udp.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
        h.engine.close()
        # The fds are the caller's: still open and usable after close().
        h.tun_test.send(b"x")
        assert h.tun_engine.recv(10) == b"x"
        assert h.udp.getsockname()[0] == "127.0.0.1"


def test_stop_is_prompt_idempotent_and_close_is_final(engine_kind):
    with Harness(engine_kind) as h:
        e = h.engine
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        h.inject_tun(udp_packet("10.5.1.2", "10.5.2.3"))
        h.settle()
        assert not e.join(0.05)          # running
        e.stop()
        e.stop()
        assert e.join(2.0)               # ended with nothing more to read: stop wakes the loop
        assert e.stats()["udp_tx_packets"] == 1     # still readable after stop
        e.close()
        e.close()                                    # idempotent
        e.stop()                                     # a closed engine is stopped
        for call in (e.stats, e.start, lambda: e.set_routes([]), lambda: e.trace(True),
                     e.trace_events):
            with pytest.raises(EngineClosed):
                call()


def test_close_without_start_and_start_twice(engine_kind):
    with Harness(engine_kind, start=False) as h:
        h.engine.start()
        with pytest.raises(RuntimeError):
            h.engine.start()
    with Harness(engine_kind, start=False) as h:
        h.engine.close()
        assert h.engine.join(0)


def test_stop_while_traffic_flows(engine_kind):
    with Harness(engine_kind) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        h.inject_udp(p, *[udp_packet("10.5.2.3", "10.5.1.2", ident=i) for i in range(500)])
        h.engine.stop()
        assert h.engine.join(2.0)


def test_forwarding_invalid_checksum_is_patched_not_fixed(engine_kind):
    with Harness(engine_kind) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        pkt = udp_packet("10.5.1.2", "10.5.2.3", check=0x1234)
        h.inject_tun(pkt)
        h.inject_udp(p, udp_packet("10.5.2.3", "10.5.1.2", check=0xFFFF, ttl=2))
        h.settle()
        assert p.received[0][10:12] == ipv4.ttl_decrement_checksum(0x1234, 64, 17).to_bytes(2, "big")
        assert h.tun_received[0][10:12] == \
            ipv4.ttl_decrement_checksum(0xFFFF, 2, 17).to_bytes(2, "big")
        assert h.tun_received[0][8] == 1


# ---- trace events (dataplane.h enum dp_trace_kind) ------------------------------

def test_trace_off_by_default(engine_kind):
    with Harness(engine_kind) as h:
        h.inject_tun(udp_packet("10.5.1.2", "10.9.9.9"))
        h.settle()
        assert h.engine.trace_events() == []


def test_trace_events_both_directions(engine_kind):
    from dataplane.engine import STAT_NAMES
    with Harness(engine_kind) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        h.engine.trace(True)
        out = udp_packet("10.5.1.2", "10.5.2.3", size=100)
        h.inject_tun(out)
        h.settle()
        ev = h.engine.trace_events()
        assert [e["kind"] for e in ev] == ["tun_read", "route_hit", "udp_send"]
        assert [e["seq"] for e in ev] == [1, 2, 3]
        assert ev[0]["len"] == 100 and ev[0]["head"] == out[:64]
        assert (ev[1]["len"], ev[1]["addr"], ev[1]["port"]) == (24, p.ip, p.port)
        assert (ev[2]["len"], ev[2]["addr"], ev[2]["port"], ev[2]["batch"]) == \
            (100, p.ip, p.port, 1)
        assert all(set(e) == {"seq", "ts_ns", "kind", "len", "addr", "port", "batch", "head"}
                   for e in ev)
        assert ev[0]["ts_ns"] <= ev[1]["ts_ns"] <= ev[2]["ts_ns"]

        back = udp_packet("10.5.2.3", "10.5.1.2", size=40)
        h.inject_udp(p, back)
        h.settle()
        ev = h.engine.trace_events(3)
        assert [e["kind"] for e in ev] == ["udp_recv", "tun_write"]
        assert (ev[0]["len"], ev[0]["addr"], ev[0]["port"], ev[0]["batch"], ev[0]["head"]) == \
            (40, p.ip, p.port, 1, back)
        assert ev[1]["len"] == 40 and ev[1]["head"] == h.tun_received[-1]   # as written: TTL - 1

        miss = udp_packet("10.5.1.2", "10.7.0.1")
        h.inject_tun(miss, b"\x45\x00")
        h.settle()
        ev = h.engine.trace_events(5)
        assert [e["kind"] for e in ev] == ["tun_read", "route_miss", "drop", "icmp",
                                           "tun_read", "drop"]
        assert (ev[1]["addr"], ev[1]["len"], ev[1]["head"]) == ("10.7.0.1", 0, b"")
        assert (ev[2]["batch"], ev[2]["len"]) == (STAT_NAMES.index("drop_no_route"), 64)
        assert ev[3]["head"] == h.tun_received[-1][:64] and ev[3]["len"] == 20 + 8 + 28
        assert (ev[5]["batch"], ev[5]["len"], ev[4]["head"]) == \
            (STAT_NAMES.index("drop_malformed"), 2, b"\x45\x00")

        h.engine.trace(False)
        h.inject_tun(out)
        h.settle()
        assert h.engine.trace_events(11) == []


def test_trace_ring_keeps_the_newest_1024(engine_kind):
    with Harness(engine_kind) as h:
        h.engine.trace(True)
        h.inject_tun(*[b"\x45" for _ in range(700)])        # 2 events each
        h.settle()
        ev = h.engine.trace_events()
        assert len(ev) == 1024
        assert [e["seq"] for e in ev] == list(range(1400 - 1023, 1401))
        assert len(h.engine.trace_events(1390)) == 10


def test_tun_peer_gone(engine_kind):
    # The other end of the "TUN" closes: writes fail (ECONNREFUSED ->
    # drop_tun_error, never retried), the loop keeps serving and stops promptly.
    with Harness(engine_kind) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        h._ep.unregister(h.tun_test.fileno())
        h.tun_test.close()
        h.inject_udp(p, *[udp_packet("10.5.2.3", "10.5.1.2", ident=i) for i in range(3)])
        st = h.settle()
        expect_only(st, udp_rx_packets=3, udp_rx_bytes=192, drop_tun_error=3)
        h.engine.stop()
        assert h.engine.join(2.0)
        h.tun_test = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)   # for close()


def test_syscall_counters_add_up(engine_kind):
    with Harness(engine_kind) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        h.inject_tun(*[udp_packet("10.5.1.2", "10.5.2.3", ident=i) for i in range(100)])
        h.inject_tun(udp_packet("10.5.1.2", "10.9.2.3"))                     # + one ICMP write
        h.inject_udp(p, *[udp_packet("10.5.2.3", "10.5.1.2", ident=i) for i in range(100)])
        st = h.settle()
        parts = ("tun_reads", "tun_writes", "udp_sends", "udp_recvs", "polls")
        assert st["syscalls"] >= sum(st[k] for k in parts)
        assert st["tun_reads"] >= st["tun_rx_packets"] == 101          # + the EAGAIN reads
        assert st["tun_writes"] == st["tun_tx_packets"] + 1 == 101
        assert 1 <= st["udp_sends"] <= 100 and 1 <= st["udp_recvs"]
        assert 1 <= st["tx_batches"] <= 101 and 1 <= st["rx_batches"] <= 100
        assert st["polls"] >= 1
