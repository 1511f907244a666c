"""The ICMP error rate limit of both engines (dataplane.h, "ICMP rate limit"):
a flood of packets that each call for an ICMP error yields at most
burst + rate * t errors, the rest are counted in icmp_ratelimited, and every
offender is still counted in its drop reason (drop_no_route, drop_ttl).

Bounds are checked against the wall-clock time of the flood, measured
around it (so the engine's own clock can only have seen less time). Exact
counts are used where no token can come back during the test (rate 1/s,
floods far shorter than a second); one per second the flood took is allowed
for, so a loaded machine makes the check looser, never wrong.
"""
import time

import pytest

from dataplane.engine import ipv4
from dataplane.engine import EngineClosed
from dataplane.engine.api import ICMP_BURST_DEFAULT, ICMP_RATE_DEFAULT
from tests.engine_harness import Harness, expect_only

SRC = "10.5.1.9"


def no_route(i):
    return ipv4.build(SRC, f"10.9.{i >> 8 & 255}.{i & 255}",
                      ipv4.udp_payload(4000, 5000, b"x" * 8), ident=i & 0xFFFF)


def ttl_expired(i):
    return ipv4.build(SRC, "10.5.2.3", ipv4.udp_payload(4000, 5000, b"y" * 8), ttl=1,
                      ident=i & 0xFFFF)


def flood(h, packets):
    t0 = time.monotonic()
    h.inject_tun(*packets)
    st = h.settle()
    return st, time.monotonic() - t0


def test_flood_is_limited_to_burst_plus_rate_times_t(engine_kind):
    rate, burst, n = 200, 20, 600
    with Harness(engine_kind, icmp_rate=rate, icmp_burst=burst) as h:
        st, t = flood(h, [no_route(i) for i in range(n)])
        sent = st["icmp_unreach_sent"]
        assert burst <= sent <= burst + rate * t, (sent, t)
        assert sent + st["icmp_ratelimited"] == n
        assert st["drop_no_route"] == n and st["tun_rx_packets"] == n
        assert len(h.take_tun()) == sent


def test_exact_burst_when_no_token_can_come_back(engine_kind):
    # One token per second: a flood much shorter than that gets exactly the
    # burst, in both engines; the errors are the first `burst` offenders'.
    burst, n = 7, 100
    with Harness(engine_kind, icmp_rate=1, icmp_burst=burst) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        offenders = [no_route(i) if i % 2 else ttl_expired(i) for i in range(n)]
        st, t = flood(h, offenders)
        out = h.take_tun()
        assert out[:burst] == [ipv4.icmp_error(o, 3 if i % 2 else 11, 0, h.tun_addr)
                               for i, o in enumerate(offenders[:burst])]
        assert burst <= len(out) <= burst + int(t)       # int(t): tokens back, 0 on a flood < 1 s
        unreach = sum(p[20] == 3 for p in out)             # ICMP type after the 20-byte header
        expect_only(st, tun_rx_packets=n, tun_rx_bytes=sum(map(len, offenders)),
                    drop_no_route=n // 2, drop_ttl=n // 2, icmp_unreach_sent=unreach,
                    icmp_ttl_sent=len(out) - unreach, icmp_ratelimited=n - len(out), route_swaps=1)


def test_tokens_come_back_with_time(engine_kind):
    rate, burst = 50, 5
    with Harness(engine_kind, icmp_rate=rate, icmp_burst=burst) as h:
        st, _ = flood(h, [no_route(i) for i in range(30)])
        first = st["icmp_unreach_sent"]
        assert burst <= first < 30
        time.sleep((burst + 1) / rate + 0.05)            # a full bucket again
        st, _ = flood(h, [no_route(i) for i in range(30, 60)])
        assert st["icmp_unreach_sent"] - first >= burst
        assert st["icmp_unreach_sent"] + st["icmp_ratelimited"] == 60
        assert st["drop_no_route"] == 60


def test_default_limit(engine_kind):
    n = 300
    with Harness(engine_kind, icmp_rate=None) as h:       # the engine's default
        st, t = flood(h, [no_route(i) for i in range(n)])
        sent = st["icmp_unreach_sent"]
        assert ICMP_BURST_DEFAULT <= sent <= ICMP_BURST_DEFAULT + ICMP_RATE_DEFAULT * t
        assert sent + st["icmp_ratelimited"] == n and st["drop_no_route"] == n


def test_unlimited_and_change_at_run_time(engine_kind):
    with Harness(engine_kind, icmp_rate=0) as h:
        st, _ = flood(h, [no_route(i) for i in range(200)])
        assert st["icmp_unreach_sent"] == 200 and st["icmp_ratelimited"] == 0
        h.engine.set_icmp_limit(1, 3)                   # takes effect while running
        st, t = flood(h, [no_route(i) for i in range(50)])
        assert t < 0.9
        assert st["icmp_unreach_sent"] == 203 and st["icmp_ratelimited"] == 47


def test_suppressed_errors_do_not_take_tokens(engine_kind):
    # ICMP offenders and later fragments never get an error, so they neither
    # use a token nor count as rate-limited.
    with Harness(engine_kind, icmp_rate=1, icmp_burst=2) as h:
        quiet = [ipv4.build(SRC, "10.9.0.1", ipv4.echo_request(), proto=1),
                 ipv4.build(SRC, "10.9.0.1", b"f" * 16, frag_offset=3)]
        st, _ = flood(h, quiet * 10 + [no_route(1), no_route(2), no_route(3)])
        expect_only(st, tun_rx_packets=23, tun_rx_bytes=st["tun_rx_bytes"], drop_no_route=23,
                    icmp_unreach_sent=2, icmp_ratelimited=1)


def test_udp_side_is_not_limited(engine_kind):
    # The UDP side generates no ICMP: a TTL flood from a peer is only dropped.
    with Harness(engine_kind, icmp_rate=1, icmp_burst=1) as h:
        p = h.add_peer()
        h.inject_udp(p, *[ipv4.build("10.5.2.3", SRC, b"z", ttl=1) for _ in range(20)])
        st = h.settle()
        expect_only(st, udp_rx_packets=20, udp_rx_bytes=20 * 21, drop_ttl=20)


@pytest.mark.parametrize("rate,burst", [(1, 0), (-1, 5), (2 ** 32, 1), (5, 2 ** 32)])
def test_bad_limits_rejected(engine_kind, rate, burst):
    with Harness(engine_kind, start=False) as h:
        with pytest.raises(ValueError):
            h.engine.set_icmp_limit(rate, burst)


def test_limit_on_closed_engine(engine_kind):
    h = Harness(engine_kind)
    h.close()
    with pytest.raises(EngineClosed):
        h.engine.set_icmp_limit(10, 10)
