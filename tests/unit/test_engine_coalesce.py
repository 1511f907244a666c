"""Bounded-delay batching (dp_loop_set_coalesce), both engines: with a wait after each pass
that forwarded something, every packet still goes through, a lone packet is not held back,
work within DENSE_WAITS waits of the last counts as dense, and the waits are counted
(harness: tests/engine_harness.py)."""
from __future__ import annotations

import time

import pytest

from dataplane.engine import ipv4
from dataplane.engine.api import COALESCE_MAX_US
from dataplane.engine.contract import DENSE_WAITS
from tests.engine_harness import Harness, assert_forwarded, expect_only


def packet(src, dst, ident, size=64):
    return ipv4.build(src, dst, ipv4.udp_payload(4000, 5000, bytes(size - 28)), ident=ident)


def test_everything_forwarded_both_ways_and_waits_counted(engine_kind):
    with Harness(engine_kind) as h:
        # the longest wait: work within 4 ms of the last is dense, even on a loaded machine
        h.engine.set_coalesce(COALESCE_MAX_US)
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        out, back = [], []
        for burst in range(100):            # back to back bursts, until the waits begin
            for i in range(len(out), len(out) + 10):
                out.append(packet("10.5.1.2", "10.5.2.3", i))
                back.append(packet("10.5.2.3", "10.5.1.2", i))
            h.inject_tun(*out[-10:])
            h.inject_udp(p, *back[-10:])
            # the next burst as soon as this one is in (the Python engine shares our GIL: a
            # test thread that never sleeps would let it run only every 5 ms, never densely)
            deadline = time.monotonic() + 5
            while (h.stats()["udp_rx_packets"] < len(back) or
                   h.stats()["tun_rx_packets"] < len(out)) and time.monotonic() < deadline:
                time.sleep(0.0001)
            if burst >= 8 and h.stats()["coalesce_waits"]:
                break
        n = len(out)
        st = h.settle()
        for a, b in zip(out, p.received):
            assert_forwarded(a, b)
        for a, b in zip(back, h.tun_received):
            assert_forwarded(a, b)
        assert len(p.received) == len(h.tun_received) == n
        expect_only(st, tun_rx_packets=n, tun_rx_bytes=n * 64, udp_tx_packets=n,
                    udp_tx_bytes=n * 64, udp_rx_packets=n, udp_rx_bytes=n * 64,
                    tun_tx_packets=n, tun_tx_bytes=n * 64)
        assert st["coalesce_waits"] >= 1
        # A pass that finds nothing hands the loop back to epoll: once the traffic is over,
        # the waits stop (a loop that kept waiting and looking would spin on an idle host).
        waits = st["coalesce_waits"]
        time.sleep(0.05)                    # 50 waits' worth
        assert h.stats()["coalesce_waits"] - waits <= 1


def test_a_lone_packet_finds_no_wait(engine_kind):
    """Coalescing starts only when work comes densely: packets far apart (pings, requests)
    are never followed by a wait, so their latency is that of the loop without coalescing."""
    with Harness(engine_kind) as h:
        h.engine.set_coalesce(COALESCE_MAX_US)
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        for i in range(3):
            time.sleep(0.02)                # 20 waits apart: not dense
            pkt = packet("10.5.1.2", "10.5.2.3", i)
            h.inject_tun(pkt)
            h.wait_for(lambda st, n=i + 1: len(p.received) == n, what=f"packet {i}")
            assert_forwarded(pkt, p.received[i])
        assert h.settle()["coalesce_waits"] == 0


def test_work_is_dense_within_dense_waits_waits_of_the_last(engine_kind):
    """The threshold itself: a pass with work that ends within DENSE_WAITS waits of the
    last one is followed by a wait. Lone packets half that apart each find one; three
    times that apart, none do."""
    usecs = COALESCE_MAX_US
    window_s = DENSE_WAITS * usecs / 1e6
    with Harness(engine_kind) as h:
        h.engine.set_coalesce(usecs)
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])

        def lone_packets(n, gap_s):
            """n packets, each sent gap_s after the last one came out: the waits they found."""
            waits = h.settle()["coalesce_waits"]
            for i in range(n):
                sent = len(p.received)
                h.inject_tun(packet("10.5.1.2", "10.5.2.3", i))
                deadline = time.monotonic() + 5
                while len(p.received) == sent and time.monotonic() < deadline:
                    time.sleep(0.0001)
                assert len(p.received) == sent + 1, f"packet {i} not forwarded"
                time.sleep(gap_s)
            return h.settle()["coalesce_waits"] - waits

        far = lone_packets(6, 3 * window_s)
        near = lone_packets(13, window_s / 2)
        assert far == 0
        # each packet after the first finds one wait; a loaded machine may stretch a gap
        # past the window now and then, so half of them are enough
        assert near >= 6, f"{near} waits after 12 gaps of half the window"


def test_off_by_default_and_off_again(engine_kind):
    with Harness(engine_kind) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        h.inject_tun(*(packet("10.5.1.2", "10.5.2.3", i) for i in range(20)))
        assert h.settle()["coalesce_waits"] == 0
        h.engine.set_coalesce(50)
        h.engine.set_coalesce(0)
        h.inject_tun(*(packet("10.5.1.2", "10.5.2.3", i) for i in range(20)))
        assert h.settle()["coalesce_waits"] == 0


@pytest.mark.parametrize("bad", [-1, COALESCE_MAX_US + 1])
def test_out_of_range_is_refused(engine_kind, bad):
    with Harness(engine_kind) as h:
        with pytest.raises(ValueError):
            h.engine.set_coalesce(bad)
