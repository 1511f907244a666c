"""engine.multi over socketpair "TUN" queues and a real SO_REUSEPORT group, both engines.

Each queue's TUN is one SOCK_DGRAM socketpair (keeps packet boundaries, as a
TUN queue does); the UDP side is the dataplane's own socket group on loopback
(dataplane.host.udpsock: N sockets on one port, steered by the inner flow). Nothing
leaves 127.0.0.0/8; every send is bounded.
"""
from __future__ import annotations

import ipaddress
import socket

import pytest

from dataplane.engine import ipv4, ipv6
from dataplane.engine import EngineClosed, Route, engine_class, multi
from dataplane.engine.api import STAT_NAMES, Ended
from dataplane.host.udpsock import open_udp_sockets
from tests.conftest import wait_until
from tests.engine_harness import assert_forwarded, behaviour_stats, big_rcvbuf, udp6_socket

QUEUES = 3
PEER_IP = "127.0.0.16"
FLOWS = 24


class Queues:
    """N socketpair TUN queues + N reuseport sockets + one MultiEngine."""

    def __init__(self, kind: str, n: int = QUEUES, six=None, **kw):
        self.pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(n)]
        for eng_end, test_end in self.pairs:
            test_end.setblocking(False)
            eng_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        self.socks = open_udp_sockets("127.0.0.1", 0, n, bufsize=1 << 20)
        self.port = self.socks[0].getsockname()[1]
        self.peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        big_rcvbuf(self.peer)
        self.peer.bind((PEER_IP, 0))
        self.peer.settimeout(5)
        self.engine = multi.create(engine_class(kind), [p[0].fileno() for p in self.pairs],
                                   {4: [s.fileno() for s in self.socks], 6: six} if six
                                   else [s.fileno() for s in self.socks], tun_addr="10.5.1.0",
                                   mtu=1472, icmp_rate=0, **kw)

    def route(self):
        return Route.make("10.5.2.0/24", PEER_IP, self.peer.getsockname()[1])

    def wait(self, pred, what, timeout=10.0):
        """The stats once ``pred(stats)`` holds; a timeout names the counters of each queue."""
        def done():
            st = self.engine.stats()
            return st if pred(st) else None

        def seen():
            queues = [{k: v for k, v in s.items() if v} for s in self.engine.queue_stats()]
            return f"{what}: per queue {queues}"
        return wait_until(done, timeout, 0.005, seen)

    def tun_out(self, i):
        out = []
        while True:
            try:
                out.append(self.pairs[i][1].recv(65536))
            except BlockingIOError:
                return out

    def close(self):
        try:
            self.engine.close()
        finally:
            for a, b in self.pairs:
                a.close()
                b.close()
            for s in self.socks:
                s.close()
            self.peer.close()


@pytest.fixture
def queues(engine_kind):
    q = Queues(engine_kind)
    try:
        yield q
    finally:
        q.close()


def _udp_packet(src, dst, sport, dport=5201, data=b"multi"):
    return ipv4.build(src, dst, ipv4.udp_payload(sport, dport, data))


def test_routes_reach_every_queue_and_stats_sum(queues):
    e = queues.engine
    assert len(e) == QUEUES and e.name == e.queues[0].name
    e.set_routes([queues.route()])
    e.start()
    # One packet into each queue's TUN: each queue can only forward it with the table.
    sent = [_udp_packet("10.5.1.2", "10.5.2.2", 40000 + i) for i in range(QUEUES)]
    for (_, test_end), pkt in zip(queues.pairs, sent):
        test_end.send(pkt)
    got = sorted(queues.peer.recv(65536) for _ in sent)
    assert len(got) == QUEUES
    for pkt, out in zip(sorted(sent), got):
        assert_forwarded(pkt, out)
    st = queues.wait(lambda s: s["udp_tx_packets"] == QUEUES, "every queue sent its packet")
    per = e.queue_stats()
    assert [q["udp_tx_packets"] for q in per] == [1] * QUEUES
    assert all(q["route_swaps"] >= 1 for q in per)
    assert set(st) == set(STAT_NAMES)
    # the loops are idle now: only the syscall counters could still move
    assert behaviour_stats(e.stats()) == behaviour_stats(
        {k: sum(q[k] for q in e.queue_stats()) for k in STAT_NAMES})


def test_flows_from_one_peer_spread_over_the_sockets(queues):
    """The steering program picks the socket by the inner flow: one peer's
    datagrams (one outer 4-tuple) reach every queue, each flow one queue only."""
    e = queues.engine
    e.set_routes([queues.route()])
    e.start()
    # Even source ports in a row, as Linux gives parallel connect()ed sockets: the
    # hash must not depend on the low bits alone.
    sent = [_udp_packet("10.5.2.2", "10.5.1.2", 30000 + 2 * f, data=bytes([r]))
            for f in range(FLOWS) for r in range(3)]
    for pkt in sent:
        queues.peer.sendto(pkt, ("127.0.0.1", queues.port))
    queues.wait(lambda s: s["tun_tx_packets"] == len(sent), f"{len(sent)} datagrams written")
    flows_of = []
    for i in range(QUEUES):
        outs = queues.tun_out(i)
        flows_of.append({o[20:22] for o in outs})      # the inner source port
    per = e.queue_stats()
    assert all(q["udp_rx_packets"] > 0 for q in per), per
    assert all(len(f) >= FLOWS // QUEUES // 3 for f in flows_of), [len(f) for f in flows_of]
    assert sum(len(f) for f in flows_of) == FLOWS, "a flow was split over queues"


def _udp6_packet(src, dst, sport, dport=5201, data=b"multi"):
    """An IPv6 packet holding a UDP datagram (the checksum is not the engines' business)."""
    udp = (sport.to_bytes(2, "big") + dport.to_bytes(2, "big")
           + (8 + len(data)).to_bytes(2, "big") + b"\0\0" + data)
    return (bytes([0x60, 0, 0, 0]) + len(udp).to_bytes(2, "big") + bytes([17, 64])
            + ipaddress.IPv6Address(src).packed + ipaddress.IPv6Address(dst).packed + udp)


def test_ipv6_flows_spread_over_the_sockets_too(queues):
    """The steering program's IPv6 branch: the same spread, each flow on one queue."""
    e = queues.engine
    e.set_routes([queues.route(), Route.make("fc00:5:0:2::/64", PEER_IP, queues.peer.getsockname()[1])])
    e.start()
    sent = [_udp6_packet("fc00:5:0:2::2", "fc00:5:0:1::2", 30000 + 2 * f, data=bytes([r]))
            for f in range(FLOWS) for r in range(3)]
    for pkt in sent:
        queues.peer.sendto(pkt, ("127.0.0.1", queues.port))
    queues.wait(lambda s: s["tun_tx_packets"] == len(sent), f"{len(sent)} datagrams written")
    flows_of = [{o[40:42] for o in queues.tun_out(i)} for i in range(QUEUES)]
    assert all(len(f) >= FLOWS // QUEUES // 3 for f in flows_of), [len(f) for f in flows_of]
    assert sum(len(f) for f in flows_of) == FLOWS, "a flow was split over queues"


def test_own_sources_and_strict_reach_every_queue(queues):
    """Forged datagrams spread over every queue (one flow each) are all judged alike."""
    e = queues.engine
    e.set_routes([queues.route()])
    e.set_local(["10.5.1.0/24"], ["192.168.50.2"])
    e.set_strict_sources(True)
    e.start()
    local = [_udp_packet(src, "10.5.1.2", 30000 + 2 * f)
             for f in range(FLOWS) for src in ("10.5.1.7", "192.168.50.2")]
    foreign = [_udp_packet("10.5.3.3", "10.5.1.2", 31000 + 2 * f) for f in range(FLOWS)]
    good = [_udp_packet("10.5.2.2", "10.5.1.2", 32000 + 2 * f) for f in range(FLOWS)]
    for pkt in local + foreign + good:
        queues.peer.sendto(pkt, ("127.0.0.1", queues.port))
    st = queues.wait(lambda s: s["udp_rx_packets"] == len(local) + len(foreign) + len(good),
                     "every datagram received")
    st = queues.wait(lambda s: s["tun_tx_packets"] == len(good), "the good ones written")
    assert st["drop_inner_local"] == len(local) and st["drop_inner_foreign"] == len(foreign)
    per = e.queue_stats()
    assert sum(q["drop_inner_local"] > 0 for q in per) >= 2, per


def test_icmp_limit_is_split_so_the_host_total_stays(engine_kind):
    assert multi.split(100, 3) == [34, 33, 33] and sum(multi.split(7, 8)) == 7
    q = Queues(engine_kind)
    try:
        q.engine.set_icmp_limit(100, 50)        # accepted by every queue
        q.engine.set_icmp_limit(2, 1)           # rate < N: each queue still limited (>= 1)
        q.engine.set_icmp_limit(0, 0)           # unlimited
        with pytest.raises(ValueError):
            q.engine.set_icmp_limit(5, 0)
        if engine_kind == "python":
            q.engine.set_icmp_limit(100, 50)
            assert [x._icmp_limit for x in q.engine.queues] == [(34, 17), (33, 17), (33, 16)]
    finally:
        q.close()


def test_trace_is_queue_zero(engine_kind):
    q = Queues(engine_kind, trace=True)
    try:
        q.engine.set_routes([q.route()])
        q.engine.start()
        q.pairs[0][1].send(_udp_packet("10.5.1.2", "10.5.2.2", 1))
        q.pairs[1][1].send(_udp_packet("10.5.1.2", "10.5.2.2", 2))
        q.wait(lambda s: s["udp_tx_packets"] == 2, "two packets")
        kinds = [ev["kind"] for ev in q.engine.trace_events(0)]
        assert kinds.count("tun_read") == 1, kinds
    finally:
        q.close()


def test_offloads_go_to_every_queue(engine_kind):
    q = Queues(engine_kind, n=2)
    try:
        q.engine.set_offloads(0)
        if engine_kind == "python":
            with pytest.raises(OSError):
                q.engine.set_offloads(1)
    finally:
        q.close()


def test_stop_and_close_are_idempotent(queues):
    e = queues.engine
    e.set_routes([queues.route()])
    e.start()
    assert e.ended() == {}
    e.stop()
    e.stop()
    assert e.join(5)
    assert e.ended() == {i: Ended("stopped") for i in range(QUEUES)}
    e.close()
    e.close()
    with pytest.raises(EngineClosed):
        e.stats()
    e.stop()                                    # a closed engine is stopped


def test_create_rejects_mismatched_fds(engine_kind):
    with pytest.raises(ValueError, match="2 TUN queue"):
        multi.create(engine_class(engine_kind), [1, 2], [3], tun_addr="10.5.1.0", mtu=1472)


def test_each_queue_sends_on_its_own_ipv6_socket(engine_kind):
    """create(udp_fds={6: ...}): one IPv6 socket per queue, in the queues' order; a table with an
    IPv6 peer reaches every queue, and each sends on its own socket."""
    six = [udp6_socket() for _ in range(QUEUES)]
    peer = udp6_socket()
    peer.settimeout(5)
    q = Queues(engine_kind, six=[s.fileno() for s in six])
    try:
        e = q.engine
        assert [x.udp_fds[6] for x in e.queues] == [s.fileno() for s in six]
        with pytest.raises(TypeError, match="one socket per queue and family"):
            e.set_udp(6, six[0])
        e.set_routes([Route.make("fd00:5:2::/64", "::1", peer.getsockname()[1])])
        e.start()
        sent = [ipv6.build("fd00:5:1::2", "fd00:5:2::2", ipv6.udp_payload(
            "fd00:5:1::2", "fd00:5:2::2", 40000 + i, 5201, b"six")) for i in range(QUEUES)]
        for (_, test_end), pkt in zip(q.pairs, sent):
            test_end.send(pkt)
        got = [peer.recvfrom(65536) for _ in sent]
        assert sorted(data[8:] for data, _ in got) == sorted(p[8:] for p in sent)
        assert sorted(src[1] for _, src in got) == sorted(s.getsockname()[1] for s in six)
    finally:
        q.close()
        for s in six + [peer]:
            s.close()
    with pytest.raises(ValueError, match="3 TUN queue.*2 IPv6"):
        multi.create(engine_class(engine_kind), [1, 2, 3], {4: [4, 5, 6], 6: [7, 8]},
                     tun_addr="10.5.1.0", mtu=1472)


def test_on_end_hears_each_loop_end_and_ended_already_says_why(queues):
    """The daemon waits on on_end() instead of polling: by the time a callback
    runs, ended() must already name that queue, or the daemon would look too
    early and see nothing."""
    e = queues.engine
    heard = []
    e.on_end(lambda eng: heard.append(eng.ended()))
    e.set_routes([queues.route()])
    e.start()
    assert e.ended() == {} and heard == []
    e.stop()
    assert e.join(5)
    assert len(heard) == QUEUES                       # once per queue
    assert all(seen and set(seen.values()) == {Ended("stopped")} for seen in heard), heard
    late = []
    e.on_end(lambda eng: late.append(len(eng.ended())))
    assert late == [QUEUES] * QUEUES                  # already ended: told at once
