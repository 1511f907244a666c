"""The IPv6 underlay, both engines (dataplane.h, "The IPv6 underlay"): a route whose peer is an
IPv6 address sends over the engine's second socket (set_udp), datagrams on that socket are
accepted only from such peers, and one table mixes peers of both underlays.

Loopback has one IPv6 address: every IPv6 peer here is ::1 on a port of its own, and a test of
the source check names its peers elsewhere (2001:db8::/32, never sent to) and sends from ::1.
The one test that needs two IPv6 peers at one port runs in a network namespace of its own
(unshare: it goes with its process), whose loopback gets two more addresses.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import socket

import pytest

from dataplane.engine import OFF_UDP_GSO, Route, ipv4, ipv6
from tests.conftest import require_engine
from tests.engine_harness import Harness, expect_only

OWN, THEIRS, OTHER = "fd00:5:1::9", "fd00:5:2::7", "fd00:5:3::7"
ELSEWHERE = "2001:db8::9"             # a peer address no test socket has


def v6(src, dst, data=b"hello", hop=64) -> bytes:
    return ipv6.build(src, dst, ipv6.udp_payload(src, dst, 1000, 2000, data), hop_limit=hop)


def forwarded(p: bytes) -> bytes:
    """The packet as the engines forward it: hop limit (IPv6) or TTL (IPv4) - 1."""
    if p[0] >> 4 == 4:
        out = bytearray(p)
        ipv4.decrement_ttl(out)
        return bytes(out)
    return p[:7] + bytes([p[7] - 1]) + p[8:]


@pytest.fixture
def h(engine_kind):
    with Harness(engine_kind, udp6=True, accept_any=False) as h:
        yield h


def test_forwarding_both_ways_over_the_ipv6_underlay(h):
    a6 = h.add_peer(family=socket.AF_INET6)
    a4 = h.add_peer()
    h.set_routes([h.route("fd00:5:2::/64", a6), h.route("10.5.2.0/24", a4)])
    out, back = v6(OWN, THEIRS), v6(THEIRS, OWN, b"reply")
    four = ipv4.build("10.5.2.3", "10.5.1.4", b"four")     # an inner IPv4 packet from a6
    h.inject_tun(out)
    h.inject_udp(a6, back, four)
    st = h.settle()
    assert a6.received == [forwarded(out)] and a4.received == []
    assert sorted(h.tun_received) == sorted([forwarded(back), forwarded(four)])
    expect_only(st, tun_rx_packets=1, tun_rx_bytes=len(out), udp_tx_packets=1,
                udp_tx_bytes=len(out), udp_rx_packets=2, udp_rx_bytes=len(back) + len(four),
                tun_tx_packets=2, tun_tx_bytes=len(back) + len(four))


def test_one_table_mixes_both_underlays_longest_prefix_first(h):
    a6, b6 = h.add_peer(family=socket.AF_INET6), h.add_peer(family=socket.AF_INET6)
    a4, b4 = h.add_peer(), h.add_peer()
    h.set_routes([h.route("fd00:5::/32", a4),                 # IPv4-mapped
                  h.route("fd00:5:2::/48", a6),
                  h.route("fd00:5:2:1::/64", b4),
                  h.route("fd00:5:2:1:8000::/65", b6),
                  h.route("10.5.2.0/24", a4)])
    cases = [("fd00:5:9::1", a4), ("fd00:5:2::1", a6), ("fd00:5:2:1::1", b4),
             ("fd00:5:2:1:8000::1", b6), ("fd00:5:2:2::1", a6)]
    # Alternating peers and runs of one peer in one batch: each goes on its own socket, in
    # order per peer.
    sent = [v6(OWN, dst, bytes([i])) for i, (dst, _) in enumerate(cases * 3)]
    h.inject_tun(*sent)
    h.inject_tun(*[v6(OWN, "fd00:5:2::5", bytes([n])) for n in range(8)])
    st = h.settle()
    for peer in (a6, b6, a4, b4):
        want = [forwarded(p) for p, (_, to) in zip(sent, cases * 3) if to is peer]
        if peer is a6:
            want += [forwarded(v6(OWN, "fd00:5:2::5", bytes([n]))) for n in range(8)]
        assert peer.received == want
    assert st["udp_tx_packets"] == len(sent) + 8 and st["drop_send_error"] == 0


def test_forged_datagrams_on_the_ipv6_socket_are_refused_as_ipv4_ones_are(h):
    a4 = h.add_peer()
    # The IPv6 peers are elsewhere; ::1 (every socket of this test) is none of them, and
    # neither is the IPv4 peer's mapped form a source the IPv6 socket can see.
    h.set_routes([h.route("fd00:5:2::/64", a4),
                  Route.make("fd00:5:3::/64", ELSEWHERE, 8285)])
    forger = h.add_peer(family=socket.AF_INET6)
    back = v6(THEIRS, OWN)
    h.inject_udp(forger, back, ipv4.build("10.5.2.3", "10.5.1.4", b"x"))
    h.inject_udp(None, back)                   # the IPv4 stranger, for comparison
    st = h.settle()
    assert h.tun_received == []
    expect_only(st, udp_rx_packets=3, udp_rx_bytes=2 * len(back) + 21, drop_bad_source=3)
    h.set_routes([h.route("fd00:5:3::/64", forger)])      # ::1 is a peer now
    h.inject_udp(forger, back)
    st = h.settle()
    assert h.tun_received == [forwarded(back)]


def test_strict_sources_compare_the_underlay_too(h):
    a6, a4 = h.add_peer(family=socket.AF_INET6), h.add_peer()
    h.set_routes([h.route("fd00:5:2::/64", a6), h.route("fd00:5:3::/64", a4),
                  h.route("10.5.2.0/24", a4)])
    h.engine.set_strict_sources(True)
    mine, theirs4, four = v6(THEIRS, OWN), v6(OTHER, OWN), ipv4.build("10.5.2.3", "10.5.1.4",
                                                                      b"x")
    h.inject_udp(a6, mine, theirs4, four)      # only the first is a6's to send
    h.inject_udp(a4, theirs4, mine)            # only the first is a4's
    st = h.settle()
    assert sorted(h.tun_received) == sorted([forwarded(mine), forwarded(theirs4)])
    assert st["drop_inner_foreign"] == 3 and st["tun_tx_packets"] == 2


def test_an_ipv6_peer_needs_the_socket_and_the_socket_comes_first(engine_kind):
    route = Route.make("fd00:5:2::/64", ELSEWHERE, 8285)
    with Harness(engine_kind) as h, socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as six:
        h.set_routes([h.route("10.5.2.0/24", h.add_peer())])
        with pytest.raises(OSError) as e:
            h.engine.set_routes([route])
        assert e.value.errno == errno.EINVAL
        assert h.stats()["route_swaps"] == 1              # nothing published
        with pytest.raises(OSError) as e:
            h.engine.set_udp(6, six)
        assert e.value.errno == errno.EBUSY               # after start()
    with Harness(engine_kind, start=False) as h, \
            socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as six:
        for bad in (h.udp.fileno(), h.tun_engine.fileno(), -1):
            with pytest.raises(OSError) as e:
                h.engine.set_udp(6, bad)
            assert e.value.errno == errno.EBADF
        with pytest.raises(OSError) as e:
            h.engine.set_udp(4, six)
        assert e.value.errno == errno.EBUSY               # IPv4's is the constructor's
        h.engine.set_udp(6, six)
        with pytest.raises(OSError) as e:
            h.engine.set_udp(6, six)
        assert e.value.errno == errno.EBUSY               # a second time
        h.engine.set_routes([route])


def test_gso_trains_never_mix_peers_or_sockets():
    """The C engine's UDP_GSO trains are keyed by their run of one peer: equal-sized
    datagrams to peers of both underlays, in runs and alternating, each reach their peer
    only, in order, and the runs go as trains."""
    require_engine("c")
    with Harness("c", start=False, udp6=True) as h:
        h.engine.set_offloads(OFF_UDP_GSO)
        a6, b6 = h.add_peer(family=socket.AF_INET6), h.add_peer(family=socket.AF_INET6)
        a4 = h.add_peer()
        h.set_routes([h.route("fd00:5:2::/64", a6), h.route("fd00:5:3::/64", b6),
                      h.route("fd00:5:4::/64", a4)], wait=False)
        order = [a6] * 5 + [b6] * 5 + [a4] * 5 + [a6, b6, a4] * 3 + [b6] * 4
        dst = {a6: "fd00:5:2::1", b6: "fd00:5:3::1", a4: "fd00:5:4::1"}
        sent = [v6(OWN, dst[p], bytes([i]) * 100) for i, p in enumerate(order)]
        h.inject_tun(*sent)
        # started with all of them waiting: its first batch holds the runs (injected into a
        # running loop, a slow machine - QEMU's arm64 - reads them one by one: no train)
        h.engine.start()
        st = h.settle()
        for peer in (a6, b6, a4):
            assert peer.received == [forwarded(s) for s, p in zip(sent, order) if p is peer]
        assert st["udp_tx_packets"] == len(sent) and st["udp_tx_gso"] >= 1


NETNS_PEERS = ("2001:db8::1", "2001:db8::2")


def trains_in_netns(kind: str) -> None:
    """Run inside a new network namespace (test_ipv6_peers_at_one_port_are_told_apart)."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for a in NETNS_PEERS:
        subprocess.run(["ip", "-6", "addr", "add", f"{a}/128", "dev", "lo", "nodad"], check=True)
    with Harness(kind, start=False, udp6=True) as h:
        if kind == "c":
            h.engine.set_offloads(OFF_UDP_GSO)
        a = h.add_peer(NETNS_PEERS[0], family=socket.AF_INET6)
        b = h.add_peer(NETNS_PEERS[1], a.port, family=socket.AF_INET6)
        h.set_routes([h.route("fd00:5:2::/64", a), h.route("fd00:5:3::/64", b)], wait=False)
        order = [a] * 6 + [b] * 6 + [a, b] * 4 + [a] * 3
        dst = {a: "fd00:5:2::1", b: "fd00:5:3::1"}
        sent = [v6(OWN, dst[p], bytes([i]) * 100) for i, p in enumerate(order)]
        h.inject_tun(*sent)
        h.engine.start()                        # its first batch: all of them waiting
        st = h.settle()
        for peer in (a, b):
            assert peer.received == [forwarded(s) for s, p in zip(sent, order) if p is peer]
        assert st["udp_tx_packets"] == len(sent)
        assert kind != "c" or st["udp_tx_gso"] >= 2


def test_ipv6_peers_at_one_port_are_told_apart(engine_kind):
    """Two IPv6 peers at one port and two addresses, in runs and alternating: each gets its
    own datagrams only (a GSO train keyed by the port alone would mix them). In a network
    namespace of its own, which ends with its process."""
    require_engine(engine_kind)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run(["unshare", "--net", sys.executable, "-c",
                        "from tests.unit.test_engine_underlay6 import trains_in_netns; "
                        f"trains_in_netns({engine_kind!r})"],
                       cwd=root, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
