"""The shared engine test harness: one engine of a given kind, no root needed.

Topology (everything on loopback, nothing leaves the host)::

    test ──send──> tun_test ═══ socketpair(AF_UNIX, SOCK_DGRAM) ═══ tun_engine ──> engine
    test <──recv── tun_test                                          (the "TUN")
                                                                          │
    peer 127.0.0.1x:p  <──── UDP ────  engine UDP socket 127.0.0.1:<port> ┘
    peer 127.0.0.1x:p  ─────────────>
    peer [::1]:p       <──── UDP ────  engine IPv6 socket [::1]:<port>  (udp6=True: the
    peer [::1]:p       ─────────────>                                    IPv6 underlay)

Loopback has one IPv6 address, so every IPv6 peer is ::1 (on a port of its
own); a test of the IPv6 source check names peers elsewhere and sends from ::1.

A SOCK_DGRAM socketpair keeps packet boundaries, as a TUN does. A collector
thread drains the test's end of the TUN and every peer socket all the time
(the engine's TUN end is non-blocking, so output nobody reads would be
dropped as drop_tun_full). Tests inject, then :meth:`Harness.settle` waits
(bounded) until the engine has consumed what was injected and everything
its counters say it sent has been collected.

Usage::

    with Harness(engine_kind) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        h.inject_tun(pkt)
        h.settle(tun=1)
        assert p.received == [expected]
"""
from __future__ import annotations

import os
import select
import socket
import threading
import time

from dataplane.engine import DROP_STATS, STAT_NAMES, SYSCALL_STATS, Route, create_engine
from dataplane.engine.api import V6_SHARES
from tests.conftest import wait_until

ENGINE_IP = "127.0.0.1"
DEFAULT_TUN_ADDR = "10.5.1.0"
PEER_BASE = 16               # peers get 127.0.0.16, 127.0.0.17, ...
SETTLE_TIMEOUT = 10.0


def big_rcvbuf(sock, size: int = 4 << 20) -> None:
    """A receive buffer that a test's bursts cannot overflow: SO_RCVBUFFORCE
    (root) passes net.core.rmem_max, which caps SO_RCVBUF at ~208 KiB."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


ENGINE_IP6 = "::1"


def udp6_socket(ip: str = ENGINE_IP6, port: int = 0) -> socket.socket:
    """An IPv6 underlay's socket as the daemon opens one: IPV6_V6ONLY, bound."""
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    big_rcvbuf(s)
    s.bind((ip, port))
    return s


class Peer:
    """A UDP socket standing for a remote node; ``received`` is what the
    engine sent to it, in order (payloads as bytes). ``family`` AF_INET6: a
    peer of the IPv6 underlay."""

    def __init__(self, ip: str, port: int = 0, family: int = socket.AF_INET):
        if family == socket.AF_INET6:
            self.sock = udp6_socket(ip, port)
        else:
            self.sock = socket.socket(family, socket.SOCK_DGRAM)
            big_rcvbuf(self.sock)
            self.sock.bind((ip, port))
        self.sock.setblocking(False)
        self.family = family
        self.ip, self.port = self.sock.getsockname()[:2]
        self.received: list[bytes] = []

    @property
    def addr(self):
        return (self.ip, self.port)

    def close(self):
        self.sock.close()


class Harness:
    """One engine between a socketpair "TUN" and a loopback UDP socket."""

    def __init__(self, kind: str, *, mtu: int = 1472, batch: int = 64, accept_any: bool = True,
                 tun_addr: str = DEFAULT_TUN_ADDR, start: bool = True, collect_tun: bool = True,
                 tun_sndbuf: int | None = None, icmp_rate: int | None = 0,
                 icmp_burst: int = 1, udp6: bool = False):
        self.kind = kind
        self.mtu = mtu
        self.tun_addr = tun_addr
        self.peers: list[Peer] = []
        self.tun_received: list[bytes] = []
        self._injected_tun = 0
        self._injected_udp = 0
        self._tables = 0
        self.kernel_drops0 = kernel_drops()
        self._lock = threading.Lock()
        self.tun_engine, self.tun_test = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        # Room for a few batches either way; a small engine-side buffer makes
        # large writes into the "TUN" fail (EMSGSIZE -> drop_tun_error).
        self.tun_test.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        self.tun_engine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF,
                                   1 << 20 if tun_sndbuf is None else tun_sndbuf)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        big_rcvbuf(self.udp)
        self.udp.bind((ENGINE_IP, 0))
        self.udp_addr = self.udp.getsockname()
        # A socket to send from a source that is no route's peer.
        self.stranger = Peer("127.0.0.254")
        # The IPv6 underlay's socket, when asked for: [::1]:<port>.
        self.udp6 = udp6_socket() if udp6 else None
        self.udp6_addr = self.udp6.getsockname()[:2] if udp6 else None
        self.engine = create_engine(kind, tun_fd=self.tun_engine.fileno(),
                                    udp_fd=self.udp.fileno(), tun_addr=tun_addr, mtu=mtu,
                                    batch=batch, accept_any=accept_any)
        if udp6:
            self.engine.set_udp(6, self.udp6.fileno())
        # Tests see every ICMP error unless they ask for a limit (None: the
        # engine's default, 100/s with a burst of 50).
        if icmp_rate is not None:
            self.engine.set_icmp_limit(icmp_rate, icmp_burst)
        self._ep = select.epoll()
        self._stop_r, self._stop_w = os.pipe()
        self._ep.register(self._stop_r, select.EPOLLIN)
        self._by_fd: dict[int, object] = {}
        if collect_tun:
            self._watch(self.tun_test, None)
        self._watch(self.stranger.sock, self.stranger)
        self._collector = threading.Thread(target=self._collect, name="harness-collector",
                                           daemon=True)
        self._collector.start()
        if start:
            self.engine.start()

    # ---- setup ---------------------------------------------------------------

    def _watch(self, sock, peer):
        self._by_fd[sock.fileno()] = (sock, peer)
        self._ep.register(sock.fileno(), select.EPOLLIN)

    def add_peer(self, ip: str | None = None, port: int = 0,
                 family: int = socket.AF_INET) -> Peer:
        if ip is None:
            ip = ENGINE_IP6 if family == socket.AF_INET6 else \
                f"127.0.0.{PEER_BASE + len(self.peers)}"
        p = Peer(ip, port, family)
        self.peers.append(p)
        self._watch(p.sock, p)
        return p

    @staticmethod
    def route(subnet, peer: Peer, mtu: int = 0) -> Route:
        return Route.make(subnet, peer.ip, peer.port, mtu)

    def set_routes(self, routes, wait: bool = True) -> None:
        """Publish a table; with ``wait``, return once the loop has adopted
        it (two quick publications would otherwise count one route swap)."""
        self.engine.set_routes(list(routes))
        self._tables += 1
        if wait and self.engine.join(0) is False:
            n = self._tables
            self.wait_for(lambda st: st["route_swaps"] >= n, what=f"route table {n} adopted")

    # ---- the collector thread --------------------------------------------------

    def _collect(self):
        bufsize = 65536
        while True:
            for fd, _ in self._ep.poll():
                if fd == self._stop_r:
                    return
                sock, peer = self._by_fd[fd]
                while True:
                    try:
                        data = sock.recv(bufsize, socket.MSG_DONTWAIT)
                    except OSError:       # EAGAIN: drained
                        break
                    with self._lock:
                        (peer.received if peer is not None else self.tun_received).append(data)

    # ---- injecting --------------------------------------------------------------

    def inject_tun(self, *packets: bytes) -> None:
        """Write packets into the TUN as the kernel would (blocks if the
        engine's end is full, so nothing is lost)."""
        for p in packets:
            self.tun_test.send(p)
            self._injected_tun += 1

    def inject_udp(self, peer: Peer | None, *payloads: bytes) -> None:
        """Send datagrams to the engine from ``peer`` (None: the stranger); an IPv6 peer
        sends to the engine's IPv6 socket."""
        s = (peer or self.stranger).sock
        to = self.udp6_addr if s.family == socket.AF_INET6 else self.udp_addr
        for p in payloads:
            while True:
                try:
                    s.sendto(p, to)
                    break
                except BlockingIOError:
                    time.sleep(0.0005)
            self._injected_udp += 1

    # ---- waiting ----------------------------------------------------------------

    def stats(self) -> dict:
        return self.engine.stats()

    def wait_for(self, pred, timeout: float = SETTLE_TIMEOUT, what: str = "condition"):
        """The stats once ``pred(stats)`` holds; a timeout names the stats and the kernel's drops."""
        def done():
            st = self.engine.stats()
            return st if pred(st) else None

        def seen():
            return (f"{what}; stats: {nonzero(self.engine.stats())}; kernel drops on this host "
                    f"since the harness started: {kernel_drops() - self.kernel_drops0}")
        return wait_until(done, timeout, 0.01, seen)

    def outputs(self):
        with self._lock:
            return len(self.tun_received), sum(len(p.received) for p in self.peers + [self.stranger])

    def settle(self, timeout: float = SETTLE_TIMEOUT, outputs: bool = True) -> dict:
        """Wait until every injected packet has been read by the engine and
        (if ``outputs``) every output its counters report has arrived;
        returns the stats."""
        def consumed(st):
            # Read, and every packet read has met its fate: forwarded, or
            # counted in one drop reason (a failed ICMP write adds a second
            # drop, so `done` may overshoot, never undershoot).
            done = st["udp_tx_packets"] + st["tun_tx_packets"] + sum(
                st[k] for k in DROP_STATS)
            return (st["tun_rx_packets"] >= self._injected_tun
                    and st["udp_rx_packets"] >= self._injected_udp
                    and done >= st["tun_rx_packets"] + st["udp_rx_packets"])
        st = self.wait_for(consumed, timeout, f"{self._injected_tun} TUN + "
                           f"{self._injected_udp} UDP packets consumed")

        def delivered(st):
            tun_n, udp_n = self.outputs()
            return (tun_n >= st["tun_tx_packets"] + st["icmp_unreach_sent"] + st["icmp_ttl_sent"]
                    + st["icmp_too_big_sent"] and udp_n >= st["udp_tx_packets"])
        deadline = time.monotonic() + timeout
        st = self.wait_for(delivered, timeout, "outputs collected") if outputs else st
        # The C engine counts a packet as received before it has finished
        # with it (an ICMP error is counted after its write): return once the
        # counters have stood still for three looks in a row.
        still = 0
        while time.monotonic() < deadline:
            time.sleep(0.003)
            st2 = self.engine.stats()
            still = still + 1 if st2 == st and (not outputs or delivered(st2)) else 0
            if still == 3:
                return st2
            st = st2
        raise AssertionError(f"counters never settled: {nonzero(st)}")

    def take_tun(self) -> list[bytes]:
        with self._lock:
            out, self.tun_received = self.tun_received, []
        return out

    # ---- teardown ---------------------------------------------------------------

    def close(self):
        try:
            self.engine.close()
        finally:
            os.write(self._stop_w, b"x")
            self._collector.join(5)
            self._ep.close()
            os.close(self._stop_r)
            os.close(self._stop_w)
            for p in self.peers + [self.stranger]:
                p.close()
            self.udp.close()
            if self.udp6 is not None:
                self.udp6.close()
            self.tun_engine.close()
            self.tun_test.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def kernel_drops() -> int:
    """Datagrams the kernel dropped on this host so far: the per-CPU
    backlog that loopback traffic goes through (/proc/net/softnet_stat,
    column 2; net.core.netdev_max_backlog deep, shared by every process)
    plus UDP receive-buffer overflows. Loopback is lossy under load: a test
    that sees these move lost a packet to the machine, not to an engine."""
    total = 0
    try:
        with open("/proc/net/softnet_stat") as f:
            total += sum(int(line.split()[1], 16) for line in f if line.strip())
        with open("/proc/net/snmp") as f:
            rows = [line.split() for line in f if line.startswith("Udp:")]
        total += int(rows[1][rows[0].index("RcvbufErrors")])
    except (OSError, ValueError, IndexError):
        pass
    return total


def nonzero(st: dict) -> dict:
    return {k: v for k, v in st.items() if v}


def with_v6_shares(expect: dict, packet: bytes) -> dict:
    """The counters of one packet, ``expect``, with IPv6's shares (dataplane.h, "Counters by
    family") as the rule says them: a packet whose version nibble is 6 counts in the share of
    each of its counters that has one, any other packet in none."""
    if packet[:1] and packet[0] >> 4 == 6:
        expect = {**expect, **{V6_SHARES[k]: v for k, v in expect.items() if k in V6_SHARES}}
    return expect


def behaviour_stats(st: dict) -> dict:
    """The counters both engines must agree on (all but SYSCALL_STATS)."""
    return {k: st[k] for k in STAT_NAMES if k not in SYSCALL_STATS}


def expect_only(st: dict, **expected) -> None:
    """Assert that, among the behaviour counters, exactly those given are
    non-zero and have the given values (route_swaps is ignored unless given,
    and so are IPv6's shares unless one is: each within its total)."""
    got = {k: v for k, v in behaviour_stats(st).items() if v}
    if "route_swaps" not in expected:
        got.pop("route_swaps", None)
    if not any(k in expected for k in V6_SHARES.values()):
        for total, share in V6_SHARES.items():
            assert got.pop(share, 0) <= st[total], f"{share} {st[share]} > {total} {st[total]}"
    assert got == {k: v for k, v in expected.items() if v}, f"counters {got} != {expected}"


def full_checksum(header: bytes) -> int:
    """The header checksum recomputed from scratch (checksum field zeroed)."""
    from dataplane.engine import ipv4
    return ipv4.checksum(header[:10] + b"\0\0" + header[12:])


def assert_forwarded(original: bytes, out: bytes) -> None:
    """``out`` is ``original`` with TTL - 1 and a header checksum that is
    valid and equal to a full recomputation (for a valid original)."""
    assert len(out) == len(original), (len(out), len(original))
    ihl = (original[0] & 15) * 4
    assert out[8] == original[8] - 1
    assert out[:8] == original[:8] and out[9:10] == original[9:10]
    assert out[12:] == original[12:], "only TTL and checksum may change"
    check = out[10] << 8 | out[11]
    assert check == full_checksum(out[:ihl]), "checksum != full recomputation"
