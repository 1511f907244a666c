"""UDP_GRO in the engines (csrc/rx.c, csrc/train.c): a train of datagrams received as one
is cut into them, each checked and forwarded as if received alone, on either underlay; the
Python engine, which has no offloads, gets the same datagrams one by one. The packets, the
run and the checks are test_engine_offload_rx's."""
from __future__ import annotations

import socket

from dataplane.engine import ipv4
from dataplane.engine import OFF_UDP_GRO
from tests.engine_harness import Harness, behaviour_stats, nonzero
from tests.unit.test_engine_offload_rx import (DST, RX_ALL, SOL_UDP, SRC, UDP_GRO, check_writes,
                                               flow, forwarded, run, send_train, udp_pkt)

def test_train_is_split_into_its_datagrams(engine_kind):
    train = [udp_pkt(i, 600) for i in range(9)] + [udp_pkt(9, 300)]
    writes, st = run(engine_kind, OFF_UDP_GRO, [train, udp_pkt(10, 200)])
    sent = train + [udp_pkt(10, 200)]
    check_writes(engine_kind, OFF_UDP_GRO, writes, sent, [])
    nbytes = sum(map(len, sent))
    assert (st["udp_rx_packets"], st["udp_rx_bytes"]) == (11, nbytes)
    assert (st["tun_tx_packets"], st["tun_tx_bytes"]) == (11, nbytes)
    if engine_kind == "c":
        assert st["udp_rx_gro"] == 1 and st["udp_recvs"] <= 2, nonzero(st)


def test_train_of_tcp_segments_becomes_one_gso_write(engine_kind):
    sent = flow(12, 1200)
    writes, st = run(engine_kind, RX_ALL, [sent[:6], sent[6:]])
    check_writes(engine_kind, RX_ALL, writes, sent, [12])
    if engine_kind == "c":
        assert (st["udp_rx_gro"], st["tun_tx_gso"], st["tun_writes"]) == (2, 1, 1), nonzero(st)


def _mixed_traffic():
    """Datagrams of every fate, as trains; with the same bytes sent one by
    one, counters must come out the same whether trains are received whole
    (UDP_GRO) or not."""
    ok = [udp_pkt(i, 700) for i in range(5)]
    bad = [ipv4.build(SRC, DST, bytes(680), tot_len=600),  # tot_len != len: malformed
           udp_pkt(21, 700, ttl=1),                     # ttl
           b"\x70" + bytes(699),                        # neither IPv4 nor IPv6
           udp_pkt(22, 700)]
    big = [udp_pkt(30 + i, 1300) for i in range(3)]     # > mtu 1000: truncated
    return [ok, bad, big, udp_pkt(40, 1200), udp_pkt(41, 100), [udp_pkt(42, 500)]]


def test_gro_counts_like_plain_receives(engine_kind):
    msgs = _mixed_traffic()
    flat = [d for m in msgs for d in (m if isinstance(m, list) else [m])]
    plain_w, plain = run(engine_kind, 0, flat, mtu=1000)
    gro_w, gro = run(engine_kind, OFF_UDP_GRO, msgs, mtu=1000)
    assert plain_w == gro_w and len(plain_w) == 8
    exp = {k: v for k, v in behaviour_stats(plain).items() if k not in ("route_swaps", "udp_rx_gro")}
    got = {k: v for k, v in behaviour_stats(gro).items() if k not in ("route_swaps", "udp_rx_gro")}
    assert got == exp
    # a datagram over the mtu counts the mtu bytes a plain receive reports
    assert exp["udp_rx_bytes"] == 9 * 700 + 4 * 1000 + 100 + 500
    assert exp["drop_truncated"] == 4 and exp["drop_malformed"] == 1
    assert exp["drop_ttl"] == 1 and exp["drop_not_ipv4"] == 1
    if engine_kind == "c":
        assert gro["udp_rx_gro"] == 3, nonzero(gro)


def test_bad_source_in_a_train(engine_kind):
    train = [udp_pkt(i, 500) for i in range(4)]
    with Harness(engine_kind, start=False, accept_any=False) as h:
        if engine_kind == "c":
            h.udp.setsockopt(SOL_UDP, UDP_GRO, 1)
            h.engine.set_offloads(OFF_UDP_GRO)
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)], wait=False)
        send_train(h, h.stranger, train)
        send_train(h, p, train)
        h.engine.start()
        # the counters are published after the write: wait for them as well as the packets
        st = h.wait_for(lambda s: s["tun_tx_packets"] + s["drop_bad_source"] >= 8
                        and len(h.tun_received) >= 4, what="both trains")
        assert st["drop_bad_source"] == 4 and st["tun_tx_packets"] == 4, nonzero(st)
        assert h.take_tun() == [forwarded(d) for d in train]


def test_a_train_over_the_ipv6_underlay_is_split_too(engine_kind):
    """The receive slots serve both sockets: a train on the IPv6 one (UDP_GRO set on it too,
    as the offload bits say) is cut as one on the IPv4 one, and its source checked against
    the IPv6 peers."""
    train = [udp_pkt(i, 500) for i in range(4)] + [udp_pkt(4, 300)]
    with Harness(engine_kind, start=False, accept_any=False, udp6=True) as h:
        if engine_kind == "c":
            h.udp6.setsockopt(SOL_UDP, UDP_GRO, 1)
            h.engine.set_offloads(OFF_UDP_GRO)
        p = h.add_peer(family=socket.AF_INET6)
        h.set_routes([h.route("fd00:5:2::/64", p)], wait=False)
        send_train(h, p, train)
        h.engine.start()
        # tun_tx_packets is counted after the write the reader may already have seen
        st = h.wait_for(lambda s: s["tun_tx_packets"] >= 5 and len(h.tun_received) >= 5,
                        what="the train")
        assert h.take_tun() == [forwarded(d) for d in train]
        assert st["tun_tx_packets"] == 5 and st["drop_bad_source"] == 0, nonzero(st)
        if engine_kind == "c":
            assert st["udp_rx_gro"] == 1, nonzero(st)
