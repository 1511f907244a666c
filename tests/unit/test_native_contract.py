"""The C engine against its contract: its arguments, the route
table at scale, route swaps under traffic, stop promptness and the closed
state. Forwarding behaviour shared by both engines lives in test_engine_*.py.

TUN stand-in: an AF_UNIX SOCK_DGRAM socketpair; UDP: real sockets on
127.0.0.0/8. Every loop here is bounded in packets and in time.
"""
from __future__ import annotations

import errno
import ipaddress
import select
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from dataplane.engine import (BATCH_MAX, STAT_NAMES, EngineClosed, Route,
                              c_available, c_import_error, create_engine)
from dataplane.engine import api
from tests.conftest import require_engine

# ---- helpers ----------------------------------------------------------------


def _csum(b: bytes) -> int:
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ipv4(src: str, dst: str, ttl: int = 64, proto: int = 17, payload: bytes = b"p" * 12) -> bytes:
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 7, 0, ttl, proto, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))
    return h[:10] + struct.pack("!H", _csum(h)) + h[12:] + payload


class Rig:
    """An engine between a socketpair 'TUN' and a UDP socket on 127.0.0.1."""

    def __init__(self, kind="c", batch=64, accept_any=True, mtu=1472):
        self.tun, self.tun_engine_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.peers: list[socket.socket] = []
        self.engine = create_engine(kind, tun_fd=self.tun_engine_side.fileno(),
                                    udp_fd=self.udp.fileno(), tun_addr="10.5.1.0", mtu=mtu,
                                    batch=batch, accept_any=accept_any)

    def peer(self, ip="127.0.0.1") -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((ip, 0))
        s.setblocking(False)
        self.peers.append(s)
        return s

    def close(self):
        self.engine.close()
        for s in [self.tun, self.tun_engine_side, self.udp, *self.peers]:
            s.close()


@pytest.fixture
def rig():
    require_engine("c")
    r = Rig()
    try:
        yield r
    finally:
        r.close()


def recv_all(socks, want: int, timeout: float = 3.0) -> dict:
    """Read from socks until `want` datagrams arrived or timeout: {sock: [bytes]}."""
    got = {s: [] for s in socks}
    n, deadline = 0, time.monotonic() + timeout
    while n < want:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(socks, [], [], left)
        for s in ready:
            while True:
                try:
                    got[s].append(s.recv(65535))
                    n += 1
                except BlockingIOError:
                    break
    return got


def wait_for(pred, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.005)
    return pred()


# ---- the build and the API's arguments (header vs Python: test_contract.py) --


def test_c_engine_is_built():
    require_engine("c")
    assert c_available(), c_import_error()


@pytest.mark.parametrize("header", [
    {"DP_ROUNDS": "contract.ROUNDS + 1"},        # the header says another number
    {"DP_NOT_BUILT": "1"},                       # the header has a constant the build lacks
])
def test_a_library_built_from_another_header_is_refused(header):
    """As if contract.py had read a header other than the one the library was built
    from: native.py refuses the library, and the Python engine is chosen instead."""
    require_engine("c")
    changes = ", ".join(f"{k!r}: {v}" for k, v in header.items())
    code = ("from dataplane.engine import contract\n"
            f"contract.HEADER_CONSTANTS = {{**contract.HEADER_CONSTANTS, {changes}}}\n"
            "from dataplane import engine\n"
            "print(engine.c_available(), engine.choose_engine('auto').cls.name)\n"
            "print(engine.c_import_error())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    chosen, why = r.stdout.splitlines()[:2]
    assert chosen == "False python", r.stdout
    assert "does not match" in why and "dataplane.h" in why and "make deps" in why, why


def test_loop_new_rejects_bad_arguments_with_errno():
    require_engine("c")
    from dataplane._dataplane_c import ffi, lib
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        pp = ffi.new("dp_loop **")
        assert lib.dp_loop_new(pp, a.fileno(), b.fileno(), 0, api.MTU_MIN - 1, 64, 1) == -errno.EINVAL
        assert lib.dp_loop_new(pp, a.fileno(), b.fileno(), 0, api.MTU_MAX + 1, 64, 1) == -errno.EINVAL
        assert lib.dp_loop_new(pp, a.fileno(), b.fileno(), 0, 1500, 0, 1) == -errno.EINVAL
        assert lib.dp_loop_new(pp, a.fileno(), b.fileno(), 0, 1500, BATCH_MAX + 1, 1) == -errno.EINVAL
        assert lib.dp_loop_new(pp, -1, b.fileno(), 0, 1500, 64, 1) == -errno.EBADF
        assert pp[0] == ffi.NULL
        assert lib.dp_loop_new(pp, a.fileno(), b.fileno(), 0, 1500, 64, 1) == 0
        routes = ffi.new("dp_route[1]")
        routes[0].net, routes[0].prefixlen = 0x0100000A, 8   # 10.0.0.1/8: host bits
        assert lib.dp_loop_set_routes(pp[0], routes, 1, ffi.NULL, 0) == -errno.EINVAL
        routes[0].net, routes[0].prefixlen = 0x0A, 33
        assert lib.dp_loop_set_routes(pp[0], routes, 1, ffi.NULL, 0) == -errno.EINVAL
        routes[0].net, routes[0].prefixlen, routes[0].port = 0x0A, 8, 70000
        assert lib.dp_loop_set_routes(pp[0], routes, 1, ffi.NULL, 0) == -errno.EINVAL
        assert lib.dp_loop_set_routes(pp[0], ffi.NULL, 0, ffi.NULL, 0) == 0
        lib.dp_loop_free(pp[0])
    finally:
        a.close()
        b.close()


def test_bad_fd_raises_oserror_with_errno():
    require_engine("c")
    with pytest.raises(OSError) as ei:
        create_engine("c", tun_fd=10**6, udp_fd=10**6 + 1, tun_addr="10.5.1.0", mtu=1472)
    assert ei.value.errno == errno.EBADF


# ---- the route table --------------------------------------------------------


def test_longest_prefix_wins(rig):
    a, b, c, d = (rig.peer() for _ in range(4))
    port = {s: s.getsockname()[1] for s in (a, b, c, d)}
    rig.engine.set_routes([
        Route.make("0.0.0.0/0", "127.0.0.1", port[d]),
        Route.make("10.9.0.0/16", "127.0.0.1", port[a]),
        Route.make("10.9.5.7/32", "127.0.0.1", port[c]),
        Route.make("10.9.5.0/24", "127.0.0.1", port[b]),
    ])
    rig.engine.start()
    cases = [("10.9.5.7", c), ("10.9.5.8", b), ("10.9.6.1", a), ("11.0.0.1", d), ("10.8.0.1", d)]
    for dst, _ in cases:
        rig.tun.send(ipv4("10.5.1.2", dst))
    got = recv_all([a, b, c, d], len(cases))
    for dst, sock in cases:
        assert [p[16:20] for p in got[sock]].count(socket.inet_aton(dst)) == 1, dst
    assert sum(map(len, got.values())) == len(cases)


def test_ten_thousand_routes(rig):
    """10 000 /24s plus a covering /16 and /32s, each /24 with its own peer
    IP; sampled destinations must reach exactly their peer."""
    n = 10_000
    routes, sample = [], {}
    sample_idx = set(range(0, n, 397)) | {n - 1}
    for i in range(n):
        subnet = f"10.{100 + i // 256}.{i % 256}.0/24"
        peer_ip = f"127.1.{i // 256}.{i % 256 + 0}"
        port = 9
        if i in sample_idx:
            s = rig.peer(peer_ip)
            port = s.getsockname()[1]
            sample[i] = s
        routes.append(Route.make(subnet, peer_ip, port))
    t0 = time.monotonic()
    rig.engine.set_routes(routes)
    assert time.monotonic() - t0 < 2.0
    rig.engine.start()
    for i in sample:
        rig.tun.send(ipv4("10.5.1.2", f"10.{100 + i // 256}.{i % 256}.77"))
    rig.tun.send(ipv4("10.5.1.2", "10.99.0.1"))   # outside every route: ICMP back
    got = recv_all(list(sample.values()), len(sample))
    for i, s in sample.items():
        assert len(got[s]) == 1, i
        assert got[s][0][16:20] == socket.inet_aton(f"10.{100 + i // 256}.{i % 256}.77")
    rig.tun.settimeout(3)
    icmp = rig.tun.recv(2048)
    assert icmp[9] == 1 and icmp[20] == 3
    assert wait_for(lambda: rig.engine.stats()["icmp_unreach_sent"] == 1)
    assert wait_for(lambda: rig.engine.stats()["udp_tx_packets"] == len(sample))
    st = rig.engine.stats()
    assert st["udp_tx_packets"] == len(sample)
    assert st["drop_no_route"] == 1 and st["icmp_unreach_sent"] == 1
    assert st["route_swaps"] == 1


def test_source_check_uses_peer_set_of_large_table():
    require_engine("c")
    r = Rig(accept_any=False)
    try:
        routes = [Route.make(f"10.{100 + i // 256}.{i % 256}.0/24", f"127.1.{i // 256}.{i % 256}",
                             8285) for i in range(10_000)]
        routes.append(Route.make("10.200.0.0/24", "127.0.0.1", 8285))
        r.engine.set_routes(routes)
        r.engine.start()
        good = r.peer("127.0.0.1")
        bad = r.peer("127.0.0.3")
        bad.sendto(ipv4("10.200.0.5", "10.5.1.2"), r.udp.getsockname())
        good.sendto(ipv4("10.200.0.5", "10.5.1.2"), r.udp.getsockname())
        r.tun.settimeout(3)
        assert r.tun.recv(2048)[12:16] == socket.inet_aton("10.200.0.5")
        # Counters are bumped after the write: wait for them to settle.
        assert wait_for(lambda: r.engine.stats()["tun_tx_packets"] == 1)
        st = r.engine.stats()
        assert st["drop_bad_source"] == 1 and st["udp_rx_packets"] == 2
    finally:
        r.close()


def test_set_routes_takes_effect_for_later_packets(rig):
    """Tables are adopted when the loop reads a packet, never later: a packet
    written after set_routes(t_j) returned goes by t_j or a newer table, and
    the table index never goes back as packets are read in order."""
    groups, per_group = 16, 12
    peers = [rig.peer() for _ in range(groups)]
    index_of = {s.getsockname()[1]: j for j, s in enumerate(peers)}
    rig.engine.start()
    for j, s in enumerate(peers):
        rig.engine.set_routes([Route.make("10.7.0.0/16", "127.0.0.1", s.getsockname()[1])])
        for k in range(per_group):
            rig.tun.send(ipv4("10.5.1.2", f"10.7.{j}.{k + 1}"))
    got = recv_all(peers, groups * per_group)
    table_for = {}
    for s in peers:
        for p in got[s]:
            table_for[(p[18], p[19] - 1)] = index_of[s.getsockname()[1]]
    assert len(table_for) == groups * per_group
    used = [table_for[(j, k)] for j in range(groups) for k in range(per_group)]
    assert all(t >= j for t, (j, _) in zip(used, ((j, k) for j in range(groups)
                                                    for k in range(per_group))))
    assert used == sorted(used)
    assert used[-1] == groups - 1
    # Once the TUN queue is empty, the next packet uses exactly the new table.
    rig.engine.set_routes([Route.make("10.7.0.0/16", "127.0.0.1", peers[0].getsockname()[1])])
    rig.tun.send(ipv4("10.5.1.2", "10.7.99.1"))
    assert [p[18] for p in recv_all([peers[0]], 1)[peers[0]]] == [99]
    assert wait_for(lambda: rig.engine.stats()["udp_tx_packets"] == groups * per_group + 1)


def test_set_routes_from_another_thread_under_traffic(rig):
    """A writer thread republishes tables while packets flow: no packet is
    lost or misrouted, no crash, and the last table wins."""
    a, b = rig.peer(), rig.peer()
    ta = [Route.make("10.7.0.0/16", "127.0.0.1", a.getsockname()[1])]
    tb = [Route.make("10.7.0.0/16", "127.0.0.1", b.getsockname()[1])]
    rig.engine.set_routes(ta)
    rig.engine.start()
    stop = threading.Event()
    swaps = [0]

    def writer():
        while not stop.is_set() and swaps[0] < 20000:
            rig.engine.set_routes(tb if swaps[0] % 2 else ta)
            swaps[0] += 1
            time.sleep(0)

    w = threading.Thread(target=writer)
    w.start()
    total, got = 600, {a: [], b: []}
    try:
        for i in range(total):
            rig.tun.send(ipv4("10.5.1.2", f"10.7.{i // 250}.{i % 250 + 1}"))
            if i % 20 == 19:   # keep the peers' socket buffers from overflowing
                for s, v in recv_all([a, b], 20, timeout=3).items():
                    got[s] += v
    finally:
        stop.set()
        w.join()
    assert sum(map(len, got.values())) == total
    assert wait_for(lambda: rig.engine.stats()["udp_tx_packets"] == total)
    st = rig.engine.stats()
    assert st["drop_no_route"] == 0
    assert 1 <= st["route_swaps"] <= swaps[0] + 1
    rig.engine.set_routes(tb)
    rig.tun.send(ipv4("10.5.1.2", "10.7.9.9"))
    assert len(recv_all([b], 1)[b]) == 1


def test_set_routes_is_adopted_without_traffic(rig):
    rig.engine.start()
    rig.engine.set_routes([Route.make("10.7.0.0/16", "127.0.0.1", 9)])
    assert wait_for(lambda: rig.engine.stats()["route_swaps"] == 1)
    rig.engine.set_routes([])
    assert wait_for(lambda: rig.engine.stats()["route_swaps"] == 2)
    rig.tun.send(ipv4("10.5.1.2", "10.7.0.1", proto=1))   # ICMP: no reply
    assert wait_for(lambda: rig.engine.stats()["drop_no_route"] == 1)


def test_set_routes_validates_in_python(rig):
    with pytest.raises(TypeError):
        rig.engine.set_routes([("10.0.0.0/8", "127.0.0.1", 1)])
    with pytest.raises(ValueError):
        rig.engine.set_routes([Route(ipaddress.IPv4Network("10.0.0.0/8"),
                                     ipaddress.IPv4Address("127.0.0.1"), 0)])


# ---- stop, close ------------------------------------------------------------


def test_stop_is_prompt_while_idle(rig):
    rig.engine.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    rig.engine.stop()
    assert rig.engine.join(0.5)
    assert time.monotonic() - t0 < 0.5


def test_stop_is_prompt_under_load(rig):
    """Both directions busy: the loop must still see the stop fd within a batch."""
    sink = rig.peer()
    rig.engine.set_routes([Route.make("10.7.0.0/16", "127.0.0.1", sink.getsockname()[1])])
    rig.engine.start()
    done = threading.Event()
    pkt_out = ipv4("10.5.1.2", "10.7.0.1", payload=b"x" * 1000)
    pkt_in = ipv4("10.7.0.1", "10.5.1.2", payload=b"y" * 1000)
    src = rig.peer()

    def flood():
        rig.tun.setblocking(False)
        deadline = time.monotonic() + 3
        while not done.is_set() and time.monotonic() < deadline:
            for _ in range(64):
                try:
                    rig.tun.send(pkt_out)
                except BlockingIOError:
                    break
            try:
                src.sendto(pkt_in, rig.udp.getsockname())
            except BlockingIOError:
                pass
            try:
                while True:
                    sink.recv(65535)
            except BlockingIOError:
                pass

    t = threading.Thread(target=flood)
    t.start()
    try:
        assert wait_for(lambda: rig.engine.stats()["tun_rx_packets"] > 1000)
        t0 = time.monotonic()
        rig.engine.stop()
        assert rig.engine.join(0.5)
        assert time.monotonic() - t0 < 0.5
    finally:
        done.set()
        t.join()


def test_stop_and_close_are_idempotent(rig):
    rig.engine.stop()            # before start: the loop then returns at once
    rig.engine.stop()
    rig.engine.start()
    assert rig.engine.join(0.5)
    rig.engine.stop()
    rig.engine.close()
    rig.engine.close()
    rig.engine.stop()            # after close: still a no-op
    assert rig.engine.join(0)


def test_close_without_start(rig):
    rig.engine.set_routes([Route.make("10.7.0.0/16", "127.0.0.1", 9)])
    rig.engine.close()
    rig.engine.close()


def test_calls_after_close_raise_engine_closed(rig):
    rig.engine.start()
    rig.engine.close()
    for call in (lambda: rig.engine.stats(), lambda: rig.engine.set_routes([]),
                 lambda: rig.engine.start(), lambda: rig.engine.trace(True),
                 lambda: rig.engine.trace_events()):
        with pytest.raises(EngineClosed):
            call()
    assert issubclass(EngineClosed, OSError)


def test_context_manager_closes():
    require_engine("c")
    r = Rig()
    try:
        with r.engine as e:
            e.start()
        with pytest.raises(EngineClosed):
            e.stats()
    finally:
        r.close()


# ---- trace ring -------------------------------------------------------------


def test_trace_ring_keeps_the_newest_events_in_order(rig):
    rig.engine.trace(True)
    rig.engine.start()
    n = 700                      # 3 events each (tun_read, route_miss, drop) > ring
    for i in range(n):
        rig.tun.send(ipv4("10.5.1.2", "10.7.0.1", proto=1))
    assert wait_for(lambda: rig.engine.trace_events(after=3 * n - 1) != [])
    ev = rig.engine.trace_events()
    assert len(ev) == api.TRACE_RING
    seqs = [e["seq"] for e in ev]
    assert seqs == list(range(3 * n - api.TRACE_RING + 1, 3 * n + 1))
    assert ev[-1]["kind"] == "drop" and ev[-1]["batch"] == STAT_NAMES.index("drop_no_route")
    assert [e["seq"] for e in rig.engine.trace_events(after=3 * n - 2)] == [3 * n - 1, 3 * n]
    assert rig.engine.trace_events(after=3 * n) == []
    rig.engine.trace(False)
    rig.tun.send(ipv4("10.5.1.2", "10.7.0.1", proto=1))
    assert wait_for(lambda: rig.engine.stats()["drop_no_route"] == n + 1)
    assert rig.engine.trace_events(after=3 * n) == []


def test_trace_read_while_writing_is_consistent(rig):
    """Readers race the loop thread: every event returned is whole (its head
    matches the packet of its kind) and seqs are strictly increasing."""
    rig.engine.trace(True)
    rig.engine.start()
    pkt = ipv4("10.5.1.2", "10.7.0.1", proto=1, payload=b"\xab" * 40)
    stop = threading.Event()

    def feed():
        for _ in range(3000):
            if stop.is_set():
                return
            rig.tun.send(pkt)

    t = threading.Thread(target=feed)
    t.start()
    try:
        last = 0
        deadline = time.monotonic() + 5
        while t.is_alive() and time.monotonic() < deadline:
            for e in rig.engine.trace_events(after=last):
                assert e["seq"] > last
                last = e["seq"]
                if e["kind"] == "tun_read":
                    assert e["head"] == pkt[:api.TRACE_HEAD] and e["len"] == len(pkt)
    finally:
        stop.set()
        t.join()


def test_random_tables_match_a_naive_longest_prefix_oracle(rig):
    """Random prefixes of many lengths (nested, duplicated); the peer each
    packet reaches must be the one a linear longest-prefix scan picks."""
    import random
    rnd = random.Random(1234)
    sinks = [rig.peer() for _ in range(8)]
    ports = [s.getsockname()[1] for s in sinks]
    table = {}
    for _ in range(3000):
        plen = rnd.choice([8, 12, 16, 20, 23, 24, 24, 24, 28, 31, 32])
        net = ipaddress.IPv4Network((rnd.randrange(10 << 24, 11 << 24), plen), strict=False)
        table[net] = rnd.choice(ports)          # a duplicate keeps the last one
    rig.engine.set_routes([Route(n, ipaddress.IPv4Address("127.0.0.1"), p)
                           for n, p in table.items()])
    by_len = sorted(table.items(), key=lambda kv: -kv[0].prefixlen)

    def oracle(dst):
        a = ipaddress.IPv4Address(dst)
        return next((p for n, p in by_len if a in n), None)

    rig.engine.start()
    dsts = []
    for _ in range(400):
        n = rnd.choice(list(table)) if rnd.random() < 0.8 else None
        a = (rnd.randrange(int(n.network_address), int(n.broadcast_address) + 1) if n
             else rnd.randrange(1 << 24, 1 << 31))
        dsts.append(str(ipaddress.IPv4Address(a)))
    want = {d: oracle(d) for d in dsts}
    hits = sum(want[d] is not None for d in dsts)
    for i, d in enumerate(dsts):
        rig.tun.send(ipv4("10.5.1.2", d, proto=1))   # ICMP: misses are silent
        if i % 50 == 49:
            time.sleep(0.01)
    got = recv_all(sinks, hits)
    for s, port in zip(sinks, ports):
        for pkt in got[s]:
            assert want[socket.inet_ntoa(pkt[16:20])] == port
    assert sum(map(len, got.values())) == hits
    assert wait_for(lambda: rig.engine.stats()["drop_no_route"] == len(dsts) - hits)
