"""The IPv6 underlay's path MTU (csrc/dataplane.h "Path MTU"), both engines, over loopback: the
engine's IPv6 socket has the daemon's options (host/udpsock.py path_mtu_options) and an
IPV6_MTU that stands for what the kernel learnt of a narrower path (ICMPv6 packet too big on
the way). A packet whose datagram the kernel refuses as over that MTU gets packet too big with
the path's MTU less the outer IPv6 and UDP headers (never under 1280), not a silent drop; an
ICMPv6 error of the network on the socket costs no packet and no busy loop.
"""
from __future__ import annotations

import ipaddress
import select
import socket
import time

import pytest

from dataplane.engine import ipv4, ipv6
from dataplane.engine.api import COALESCE_MAX_US
from dataplane.host.udpsock import path_mtu_options
from tests.conftest import wait_until
from tests.engine_harness import Harness, expect_only

IPV6_MTU = 24                       # <linux/in6.h>: the socket's own cap on the path MTU
IPV6_MTU_DISCOVER, IPV6_RECVERR, IPV6_PMTUDISC_DO = 23, 25, 2
IP_MTU_DISCOVER, IP_RECVERR, IP_PMTUDISC_DO = 10, 11, 2
MTU = 1472
OWN6 = "fc00:5:0:1::"               # flannel0's IPv6 address
POD = "fc00:5:0:1::9"               # a pod of ours, the sender
FAR = "fc00:5:0:2::1"               # a pod of the peer's
HDRS = 48
TOO_BIG = 2


def make(engine_kind, path_mtu: int, start: bool = True, closed: bool = False) -> Harness:
    """A harness whose IPv6 peer takes FAR's /64; with ``closed``, a second IPv6 peer whose
    socket is closed takes fc00:5:0:4::/64."""
    h = Harness(engine_kind, mtu=MTU, udp6=True, start=False)
    path_mtu_options(h.udp6)
    h.udp6.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU, path_mtu)
    if start:
        h.engine.start()
    routes = [h.route("fc00:5:0:2::/64", h.add_peer(family=socket.AF_INET6))]
    if closed:
        gone = h.add_peer(family=socket.AF_INET6)
        gone.sock.close()
        routes.append(h.route("fc00:5:0:4::/64", gone))
    h.set_routes(routes, wait=start)
    h.engine.set_tun_addr(OWN6)
    return h


def sized(dst: str, length: int, fill: int) -> bytes:
    return ipv6.build(POD, dst, bytes([fill]) * (length - 40), hop_limit=64)


def expected_error(offender: bytes, mtu: int) -> bytes:
    """Packet too big about ``offender`` as read, with ``mtu`` (its bytes are pinned down by
    test_engine_icmp6.py: here, which packet and which MTU)."""
    return ipv6.icmp_error(offender, TOO_BIG, 0, ipaddress.IPv6Address(OWN6).packed, mtu)


def test_packet_too_big_with_the_path_mtu(engine_kind):
    with make(engine_kind, 1400) as h:
        fits, over, big = (sized(FAR, n, i) for i, n in enumerate((1400 - HDRS, 1353, MTU)))
        h.inject_tun(fits, over, big)
        st = h.settle()
        assert h.peers[0].received == [fits[:7] + bytes([63]) + fits[8:]]
        # the quote is each packet as read (hop limit 64), the MTU the path's less 48
        assert h.tun_received == [expected_error(over, mtu=1352),
                                  expected_error(big, mtu=1352)]
        assert [e[44:48] for e in h.tun_received] == [(1352).to_bytes(4, "big")] * 2
        expect_only(st, tun_rx_packets=3, tun_rx_bytes=1352 + 1353 + MTU, udp_tx_packets=1,
                    udp_tx_bytes=1352, drop_too_big=2, icmp_too_big_sent=2)


def test_a_path_under_1328_bytes(engine_kind):
    """Packet too big never says less than IPv6's 1280; what fits 1280 but not the path, which a
    pod may always send, goes in outer fragments, as from a tunnel entry (RFC 2473), and the
    socket refuses to fragment again after that one send."""
    with make(engine_kind, 1300) as h:
        small, mid, over = sized(FAR, 1252, 1), sized(FAR, 1270, 2), sized(FAR, 1281, 3)
        h.inject_tun(small, mid, over)
        st = h.settle(outputs=False)
        wait_until(lambda: len(h.peers[0].received) == 2, 5, what="the packets to the live peer")
        assert [len(p) for p in h.peers[0].received] == [1252, 1270]
        assert h.tun_received == [expected_error(over, mtu=1280)]
        expect_only(st, tun_rx_packets=3, tun_rx_bytes=1252 + 1270 + 1281, udp_tx_packets=2,
                    udp_tx_bytes=1252 + 1270, udp_tx_fragmented=1, drop_too_big=1,
                    icmp_too_big_sent=1)
        assert h.udp6.getsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER) == IPV6_PMTUDISC_DO


@pytest.mark.parametrize("first", ["network error", "nothing"])
def test_an_icmp_error_of_the_network_costs_no_packet(engine_kind, first):
    """A datagram to a closed port comes back as ICMPv6 port unreachable: queued on the
    socket, and pending for its next call. The loop empties the queue (no busy loop on
    EPOLLERR) and the next packet, to a live peer, goes through."""
    with make(engine_kind, 1400, closed=True) as h:
        if first == "network error":
            h.inject_tun(sized("fc00:5:0:4::1", 100, 9))
            h.settle(outputs=False)
            time.sleep(0.1)
        polls = h.engine.stats()["polls"]
        time.sleep(0.3)
        assert h.engine.stats()["polls"] - polls <= 3, "the loop spins on EPOLLERR"
        h.inject_tun(sized(FAR, 100, 7))
        st = h.settle(outputs=False)
        wait_until(lambda: len(h.peers[0].received) == 1, 5, what="the packet to the live peer")
        assert st["udp_tx_packets"] == (2 if first == "network error" else 1)
        assert st["drop_send_error"] == 0


def test_over_the_ipv4_underlay_too(engine_kind):
    """Inner IPv6 to an IPv4 peer goes with IPv4's per-datagram "don't fragment"; one the
    kernel refuses is probed once more, and the path MTU it then says (here loopback's, which
    no IPv4 datagram of 65535 bytes and 28 of headers fits) is the packet too big's, less 28.
    Inner IPv4 that long stays a send error, as ever."""
    with open("/sys/class/net/lo/mtu") as f:
        lo = int(f.read())
    with Harness(engine_kind, mtu=65535, batch=8) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p), h.route("fc00:5:0:2::/64", p)])
        h.engine.set_tun_addr(OWN6)
        small, big = sized(FAR, 1400, 1), sized(FAR, 65535, 2)
        h.inject_tun(small, big, ipv4.build("10.5.1.2", "10.5.2.3", bytes(65535 - 20)))
        st = h.settle()
        assert p.received == [small[:7] + bytes([63]) + small[8:]]
        assert h.tun_received == [expected_error(big, mtu=min(lo, 65535) - 28)]
        expect_only(st, tun_rx_packets=3, tun_rx_bytes=1400 + 2 * 65535, udp_tx_packets=1,
                    udp_tx_bytes=1400, drop_send_error=1, drop_too_big=1, icmp_too_big_sent=1)


def test_a_send_failed_by_the_network_s_error_goes_again(engine_kind):
    """Two packets of one batch: the first's datagram to a closed port comes back (on loopback,
    at once) as port unreachable, which the kernel also hands to the next send on the socket;
    that send, the second packet's to a live peer, is made again and goes."""
    with make(engine_kind, 1400, start=False, closed=True) as h:
        h.inject_tun(sized("fc00:5:0:4::1", 100, 9), sized(FAR, 100, 7))
        h.engine.start()
        st = h.settle(outputs=False)
        wait_until(lambda: len(h.peers[0].received) == 1, 5, what="the packet to the live peer")
        assert (st["udp_tx_packets"], st["drop_send_error"]) == (2, 0), st


def test_the_engine_takes_its_sockets_with_the_path_mtu_options_it_wants(engine_kind):
    """make_engine puts an IPv4 socket a probe left switched (a daemon killed inside it, its
    sockets handed over) back to the kernel's defaults; IPv6 ones get path_mtu_options all, or,
    when one refuses them, none keeps half of them."""
    from dataplane.engine import engine_class
    from dataplane.host.assembly import make_engine
    from dataplane.host.family import V4, V6
    tun, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    v4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    v6, not6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM), socket.socket(socket.AF_INET)
    with tun, peer, v4, v6, not6:
        v4.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
        v4.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        # (no engine comes of it: two IPv6 sockets for one queue; the options come first)
        with pytest.raises(ValueError, match="2 IPv6 UDP socket"):
            make_engine(engine_class(engine_kind), [tun.fileno()], {V4: [v4], V6: [v6, not6]},
                        tun_addr="10.5.1.0", mtu=MTU).close()
        assert [v4.getsockopt(socket.IPPROTO_IP, o) for o in (IP_RECVERR, IP_MTU_DISCOVER)] == \
            [0, 1]
        assert [v6.getsockopt(socket.IPPROTO_IPV6, o) for o in (IPV6_RECVERR, IPV6_MTU_DISCOVER)] \
            == [0, 1]


def test_the_coalescing_wait_empties_the_error_queue(engine_kind):
    """Under load the loop stays in its coalescing waits, never in epoll_wait: an ICMPv6 error
    queued on the IPv6 socket meanwhile is emptied there too, not left to fill the socket's
    receive buffer until the load stops."""
    with make(engine_kind, 1400, closed=True) as h:
        h.engine.set_coalesce(COALESCE_MAX_US)
        v4 = h.add_peer()
        h.set_routes([h.route("fc00:5:0:2::/64", h.peers[0]),
                      h.route("fc00:5:0:4::/64", h.peers[1]), h.route("10.5.2.0/24", v4)])
        err = select.poll()
        err.register(h.udp6, 0)             # POLLERR alone: the error queue is not empty
        flood = ipv4.build("10.5.2.3", "10.5.1.2", bytes(36))     # from the peer: the
        sent, polls, tx, emptied = 0, None, 1 << 62, False        # socket busy, unwatched
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not emptied and sent < 200_000:
            h.inject_udp(v4, *[flood] * 20)
            sent += 20
            st = h.stats()
            if polls != st["polls"] and st["coalesce_waits"]:   # (again) while in the waits
                polls, tx = st["polls"], st["v6_udp_tx_packets"]
                h.inject_tun(sized("fc00:5:0:4::1", 100, 9))    # to the closed port
            elif st["v6_udp_tx_packets"] > tx:
                # the error came back as it went; gone with no epoll_wait since: the waits
                emptied = not err.poll(0) and h.stats()["polls"] == polls
            time.sleep(0.0001)              # the Python engine shares our GIL
        assert emptied, "the ICMPv6 error stays queued while the load lasts"
