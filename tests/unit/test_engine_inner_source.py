"""The inner source of a datagram from the underlay, both engines (docs/threat-model.md;
dataplane.h, UDP -> TUN steps 4 and 5).

The overlay has no cryptography: the outer source of a datagram can be
forged, so a datagram "from" a lease holder may come from anyone on the
underlay. Step 4 (always on once the daemon hands the engine this host's
addresses and lease) drops an inner packet that claims to come from this
host; step 5 (--strict-sources, off by default) drops one whose source is not
routed to the peer that sent it, as kernel WireGuard does.
"""
import ipaddress
import struct

import pytest

from dataplane.engine import ipv4
from dataplane.engine import OFF_UDP_GRO, STAT_NAMES
from dataplane.engine.contract import LOCAL_MAX
from tests.engine_harness import Harness, expect_only

MTU = 1472
OWN_NET = "10.5.1.0/24"           # this host's lease
UNDERLAY = "192.168.50.2"         # this host's address on the underlay
TUN_ADDR = "10.5.1.0"             # flannel0's address
A_NET, B_NET = "10.5.2.0/24", "10.5.3.0/24"
SIZE = 44                         # from_pod's packets: 20 + 8 + 16
SOL_UDP, UDP_SEGMENT, UDP_GRO = 17, 103, 104


def from_pod(src, dst="10.5.1.9", ident=0, ttl=64):
    return ipv4.build(src, dst, ipv4.udp_payload(4000, 5000, b"h" * 16), ttl=ttl, ident=ident)


def victim(kind, accept_any=False, strict=False, local=True):
    """A harness with peers a (A_NET) and b (B_NET); own sources set unless
    ``local`` is False."""
    h = Harness(kind, mtu=MTU, accept_any=accept_any, tun_addr=TUN_ADDR)
    a, b = h.add_peer(), h.add_peer()
    h.set_routes([h.route(A_NET, a), h.route(B_NET, b)])
    if local:
        h.engine.set_local([OWN_NET], [UNDERLAY, TUN_ADDR, "127.0.0.1"])
    h.engine.set_strict_sources(strict)
    return h


# ---- step 4: this host's own sources ------------------------------------------------

@pytest.mark.parametrize("inner_src", [UNDERLAY, TUN_ADDR, "10.5.1.1",    # bridge address
                                       "10.5.1.77", "10.5.1.255", "127.0.0.1"])
@pytest.mark.parametrize("accept_any", [False, True])
def test_own_source_from_a_lease_holder_is_dropped(engine_kind, inner_src, accept_any):
    with victim(engine_kind, accept_any=accept_any) as h:
        a, _ = h.peers
        h.inject_udp(a, *[from_pod(inner_src, dst=UNDERLAY, ident=i) for i in range(5)])
        st = h.settle()
        assert h.tun_received == []
        expect_only(st, udp_rx_packets=5, udp_rx_bytes=5 * SIZE, drop_inner_local=5)


@pytest.mark.parametrize("inner_src", ["10.5.2.7",          # a's own pod
                                       "10.5.0.9",          # beside the lease, not in it
                                       "10.5.3.7",          # b's pod, sent by a
                                       "192.168.50.3"])     # another underlay host
def test_other_sources_are_forwarded(engine_kind, inner_src):
    with victim(engine_kind) as h:
        a, _ = h.peers
        pkt = from_pod(inner_src)
        h.inject_udp(a, pkt)
        st = h.settle()
        assert len(h.tun_received) == 1 and h.tun_received[0][12:16] == pkt[12:16]
        expect_only(st, udp_rx_packets=1, udp_rx_bytes=SIZE, tun_tx_packets=1,
                    tun_tx_bytes=SIZE)


def test_order_of_checks(engine_kind):
    # bad source, then the header, then the inner source, then TTL: each
    # packet counted in the first reason it meets.
    with victim(engine_kind) as h:
        a, _ = h.peers
        h.inject_udp(None, from_pod(UNDERLAY))                      # a stranger: bad source
        broken = bytearray(from_pod(UNDERLAY))
        broken[2:4] = (60).to_bytes(2, "big")                        # tot_len != len
        h.inject_udp(a, bytes(broken))
        h.inject_udp(a, from_pod(UNDERLAY, ttl=1))                  # local before TTL
        h.inject_udp(a, from_pod("10.5.2.7", ttl=1))                # TTL
        st = h.settle()
        assert h.tun_received == []
        expect_only(st, udp_rx_packets=4, udp_rx_bytes=4 * SIZE, drop_bad_source=1,
                    drop_malformed=1, drop_inner_local=1, drop_ttl=1)


def test_without_own_sources_nothing_is_checked(engine_kind):
    # The engine's default (and flanneld's behaviour): an empty set.
    with victim(engine_kind, local=False) as h:
        a, _ = h.peers
        h.inject_udp(a, from_pod(UNDERLAY), from_pod("10.5.1.77"))
        st = h.settle()
        assert len(h.tun_received) == 2
        assert st["drop_inner_local"] == 0 and st["tun_tx_packets"] == 2


def test_set_local_replaces_the_set(engine_kind):
    # The lease moved: the old subnet is no longer ours, the new one is.
    with victim(engine_kind) as h:
        a, _ = h.peers
        h.engine.set_local(["10.5.9.0/24"], ["192.168.50.9"])
        h.inject_udp(a, from_pod("10.5.1.77"), from_pod(UNDERLAY),
                     from_pod("10.5.9.4"), from_pod("192.168.50.9"))
        st = h.settle()
        assert [p[12:16] for p in h.tun_received] == [
            ipaddress.IPv4Address(x).packed for x in ("10.5.1.77", UNDERLAY)]
        assert st["drop_inner_local"] == 2 and st["tun_tx_packets"] == 2
        h.engine.set_local([], [])
        h.inject_udp(a, from_pod("10.5.9.4"))
        assert h.settle()["tun_tx_packets"] == 3


def test_drop_is_traced_with_its_reason(engine_kind):
    with victim(engine_kind) as h:
        a, _ = h.peers
        h.engine.trace(True)
        h.inject_udp(a, from_pod(TUN_ADDR))
        h.settle()
        drops = [e for e in h.engine.trace_events() if e["kind"] == "drop"]
        assert [(e["len"], e["batch"]) for e in drops] == [
            (SIZE, STAT_NAMES.index("drop_inner_local"))]


@pytest.mark.parametrize("own, addrs", [
    ("10.5.1.1/24", []),                      # host bits
    ("0.0.0.0/0", []),                        # every source would be local
    (None, ["10.5.1.300"]),
    (None, ["10.0.0.1"] * (LOCAL_MAX + 1)),
])
def test_bad_sets_are_refused_alike(engine_kind, own, addrs):
    with victim(engine_kind, local=False) as h:
        with pytest.raises(ValueError):
            h.engine.set_local([] if own is None else [own], addrs)


def test_largest_set(engine_kind):
    with victim(engine_kind, local=False) as h:
        a, _ = h.peers
        many = [str(ipaddress.IPv4Address(0xC0A80000 + 2 * i)) for i in range(LOCAL_MAX)]
        h.engine.set_local([], many)
        h.inject_udp(a, from_pod(many[0]), from_pod(many[-1]), from_pod("192.168.0.1"))
        st = h.settle()
        assert st["drop_inner_local"] == 2 and st["tun_tx_packets"] == 1


# ---- step 5: the strict rule ---------------------------------------------------------

@pytest.mark.parametrize("accept_any", [False, True])
def test_strict_forwards_only_the_senders_own_sources(engine_kind, accept_any):
    with victim(engine_kind, accept_any=accept_any, strict=True) as h:
        a, b = h.peers
        h.inject_udp(a, from_pod("10.5.2.7", ident=1))      # a's pod: forwarded
        h.inject_udp(a, from_pod("10.5.3.7", ident=2))      # b's pod, sent by a
        h.inject_udp(a, from_pod("192.0.2.1", ident=3))     # no lease at all
        h.inject_udp(b, from_pod("10.5.3.7", ident=4))      # b's pod: forwarded
        h.inject_udp(a, from_pod(UNDERLAY, ident=5))        # local comes first
        st = h.settle()
        assert [p[4:6] for p in h.tun_received] == [b"\0\1", b"\0\4"]
        expect_only(st, udp_rx_packets=5, udp_rx_bytes=5 * SIZE, tun_tx_packets=2,
                    tun_tx_bytes=2 * SIZE, drop_inner_foreign=2, drop_inner_local=1)


def test_strict_with_accept_any_refuses_a_stranger(engine_kind):
    # A stranger is no lease's PublicIP: nothing it sends is routed to it.
    with victim(engine_kind, accept_any=True, strict=True) as h:
        h.inject_udp(None, from_pod("10.5.2.7"))
        st = h.settle()
        expect_only(st, udp_rx_packets=1, udp_rx_bytes=SIZE, drop_inner_foreign=1)


def test_strict_follows_the_route_table(engine_kind):
    # a's lease moves to b: a's old pods are now b's to send.
    with victim(engine_kind, strict=True) as h:
        a, b = h.peers
        h.set_routes([h.route(A_NET, b), h.route(B_NET, b), h.route("10.5.4.0/24", a)])
        h.inject_udp(a, from_pod("10.5.2.7"), from_pod("10.5.4.7"))
        h.inject_udp(b, from_pod("10.5.2.7"))
        st = h.settle()
        assert st["drop_inner_foreign"] == 1 and st["tun_tx_packets"] == 2


def test_strict_off_again(engine_kind):
    with victim(engine_kind, strict=True) as h:
        a, _ = h.peers
        h.engine.set_strict_sources(False)
        h.inject_udp(a, from_pod("10.5.3.7"))
        st = h.settle()
        expect_only(st, udp_rx_packets=1, udp_rx_bytes=SIZE, tun_tx_packets=1,
                    tun_tx_bytes=SIZE)


def test_each_datagram_of_a_train_is_judged_alone(engine_kind):
    # One UDP_SEGMENT send: the C engine with UDP_GRO receives it as one train, the Python
    # engine as six datagrams; both count and forward the same.
    sources = ["10.5.2.7", UNDERLAY, "10.5.2.8", "10.5.1.77", "10.5.3.7", "10.5.2.9"]
    train = [from_pod(src, ident=i) for i, src in enumerate(sources)]
    with Harness(engine_kind, mtu=MTU, start=False, accept_any=False, tun_addr=TUN_ADDR) as h:
        if engine_kind == "c":
            h.udp.setsockopt(SOL_UDP, UDP_GRO, 1)
            h.engine.set_offloads(OFF_UDP_GRO)
        a, b = h.add_peer(), h.add_peer()
        h.set_routes([h.route(A_NET, a), h.route(B_NET, b)], wait=False)
        h.engine.set_local([OWN_NET], [UNDERLAY])
        h.engine.set_strict_sources(True)
        a.sock.sendmsg([b"".join(train)], [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", SIZE))], 0,
                       h.udp_addr)
        h.engine.start()
        h.wait_for(lambda st: st["udp_rx_packets"] >= 6 and len(h.tun_received) >= 3,
                   what="the train")
        st = h.settle()
        assert [p[4:6] for p in h.tun_received] == [b"\0\0", b"\0\2", b"\0\5"]
        assert (st["drop_inner_local"], st["drop_inner_foreign"]) == (2, 1)
        if engine_kind == "c":
            assert st["udp_rx_gro"] == 1
