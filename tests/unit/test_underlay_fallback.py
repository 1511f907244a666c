"""--ipv6-underlay-fallback, nearly without I/O: when a peer is probed and found failed or working
again (control/underlay_health.py), the probe and its answer as bytes (host/underlay_probe.py),
the routes a failed peer's part and the probes take (control/routes.py), and what
`flannel-udp status` shows; a probe's send on a loopback socket. The whole path between namespaces:
tests/integration/test_ipv6_underlay_fallback.py."""
from __future__ import annotations

import random
import select
import socket
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from dataplane.cli.status import render
from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.control.peerset import PeerChange, PeerSnapshot
from dataplane.control.routes import Ipv6Parts, PeerRoute, probe_subnet, route_changes, route_table
from dataplane.control.underlay_health import (ANSWERS_TO_RECOVER, MISSES_TO_FAIL, PROBE_EVERY_S,
                                               UnderlayHealth)
from dataplane.engine import Route, ipv6
from dataplane.host import underlay_probe
from dataplane.host.udpsock import IPV6_RECVERR
from dataplane.host.underlay_probe import Prober


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def health(**kw):
    clock = Clock()
    return UnderlayHealth(clock=clock, wall=lambda: 7.0, rng=lambda: 0.0, **kw), clock


def run(h, clock, seconds: float, answer=lambda key: True, step: float = 0.25) -> list:
    """``seconds`` of the daemon's rounds: due probes sent, those ``answer`` says answered at
    once; the turns seen, in order."""
    turns = []
    end = clock.t + seconds
    while clock.t < end:
        for key, _target, number in h.due():
            if answer(key):
                assert h.answer(number)
        turns += h.judge()
        clock.t += step
    return turns


def test_a_peer_fails_after_missed_probes_within_30_s_and_comes_back_when_answered():
    h, clock = health()
    h.follow({"a": "fd00::2", "b": "fd00::3"})
    assert run(h, clock, 3 * PROBE_EVERY_S) == [] and h.failed() == {}
    # b stops answering just after an answer: failed once, within 30 s, a stays
    start = clock.t
    turns = run(h, clock, 40, answer=lambda key: key != "b")
    assert [(t.key, t.failed) for t in turns] == [("b", True)]
    assert f"{MISSES_TO_FAIL} probes in a row unanswered" == turns[0].why
    assert h.failed() == {"b": 7.0} and h.fallbacks == 1
    assert h.sent > 2 * 40 / PROBE_EVERY_S - 2
    # the turn came within 30 s of the last answer
    h2, clock2 = health()
    h2.follow({"b": "x"})
    run(h2, clock2, PROBE_EVERY_S + 0.25)
    t0 = clock2.t
    while not h2.judge() and clock2.t < t0 + 60:
        for _key, _t, _n in h2.due():
            pass
        clock2.t += 0.25
    assert clock2.t - t0 <= 30 - PROBE_EVERY_S
    # answered again: back after ANSWERS_TO_RECOVER probes, said once
    turns = run(h, clock, 3 * PROBE_EVERY_S)
    assert [(t.key, t.failed) for t in turns] == [("b", False)]
    assert turns[0].why == f"{ANSWERS_TO_RECOVER} probes in a row answered"
    assert h.failed() == {} and h.fallbacks == 1 and start < clock.t


def test_a_late_or_foreign_answer_counts_for_nothing():
    h, clock = health()
    h.follow({"a": "x"})
    (key, _t, number), = h.due()
    assert not h.answer(number + 100)
    clock.t += 2.5
    h.judge()                               # overdue: missed
    assert not h.answer(number)
    assert h.answered == 0


def test_one_lost_answer_in_a_spell_does_not_fail_a_peer():
    h, clock = health()
    h.follow({"a": "x"})
    lost = iter([False, False, False, True] * 20)
    assert run(h, clock, 60, answer=lambda key: next(lost)) == []


def test_many_peers_are_probed_at_a_bounded_rate():
    h, clock = health(max_rate=200)
    h.follow({i: "x" for i in range(16000)})
    assert h.interval() == 80
    sent = 0
    for _ in range(40):                     # 10 s of rounds
        sent += len(h.due())
        clock.t += 0.25
    assert sent <= 200 * 10 + 1


def test_a_peer_gone_or_changed_is_forgotten():
    h, clock = health()
    h.follow({"a": "x", "b": "y"})
    run(h, clock, 40, answer=lambda key: False)
    assert set(h.failed()) == {"a", "b"}
    h.follow({"a": "x2"})                   # b gone, a's PublicIPv6 changed: start afresh
    assert h.failed() == {} and h.probed() == 1


def probe_times(h, clock, seconds: float, step: float = 0.25) -> list:
    """When the probes of ``seconds`` of rounds went out, all answered at once."""
    times, end = [], clock.t + seconds
    while clock.t < end:
        for _key, _target, number in h.due():
            times.append(clock.t)
            h.answer(number)
        h.judge()
        clock.t += step
    return times


@pytest.mark.parametrize("change", ["target", "forgotten and back"])
def test_a_restarted_peer_is_probed_once_per_interval(change):
    h, clock = health()
    h.follow({"a": "t1"})
    assert len(h.due()) == 1                # its entry is next due 5 s from now
    clock.t += 1
    if change == "target":
        h.follow({"a": "t2"})               # its PublicIPv6 changed
    else:
        h.follow({})                        # DirectRouting flipped, and back
        clock.t += 1
        h.follow({"a": "t1"})
    times = probe_times(h, clock, 59)
    assert len(times) <= 59 // PROBE_EVERY_S + 1
    assert all(b - a >= PROBE_EVERY_S for a, b in zip(times, times[1:]))


def test_a_restarted_peer_that_failed_recovers_when_answered_within_the_round_trip():
    """A second entry of one peer 0.25 s after the first, with answers taking 0.5 s, would
    count each first probe missed just before its answer came: never two answers in a row."""
    h, clock = health()
    h.follow({"a": "t1"})
    assert len(h.due()) == 1                # next due 5 s from now
    clock.t += 4.75
    h.follow({"a": "t2"})
    run(h, clock, 40, answer=lambda key: False)
    assert set(h.failed()) == {"a"}
    late, turns = [], []                    # (when answered, number)
    for _ in range(int(40 / 0.25)):
        for number in [n for t, n in late if t <= clock.t]:
            h.answer(number)
        late = [(t, n) for t, n in late if t > clock.t]
        late += [(clock.t + 0.5, number) for _k, _t, number in h.due()]
        turns += h.judge()
        clock.t += 0.25
    assert [(t.key, t.failed) for t in turns] == [("a", False)] and h.failed() == {}


def test_the_probe_is_an_echo_request_between_the_flannel0s_and_its_answer_is_recognised():
    p = Prober()
    src, dst = IPv6Address("fc00:66:0:1::"), IPv6Address("fc00:66:0:2::")
    packet = p.request(src, dst, 70000)
    hdr = ipv6.parse(packet)
    assert (hdr.src, hdr.dst, hdr.next_header) == (src, dst, ipv6.NH_ICMPV6)
    msg = packet[40:]
    assert msg[0] == ipv6.ICMPV6_ECHO_REQUEST
    assert ipv6.upper_checksum(src, dst, ipv6.NH_ICMPV6, msg) == 0       # a valid checksum
    # the peer's kernel answers with the identifier, sequence and data it got
    reply = ipv6.icmp_message(dst, src, ipv6.ICMPV6_ECHO_REPLY, 0,
                              rest=int.from_bytes(msg[4:8], "big"), data=msg[8:])
    assert p.number(reply) == 70000
    assert Prober().number(reply) is None                               # another daemon's
    assert p.number(msg) is None                                        # a request
    assert p.number(reply[:20]) is None


# -- the routes ----------------------------------------------------------------------------
NET6 = IPv6Network("fc00:66::/56")
OWN = IPv4Network("10.5.1.0/24")


def test_a_probe_is_sent_though_another_peers_error_is_pending_on_the_socket():
    """The engines' IPv6 sockets have IPV6_RECVERR: a dead peer's port unreachable stays
    pending and fails the next send on the socket, here a probe to a listening peer."""
    listener = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    closed = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        listener.bind(("::1", 0))
        listener.settimeout(5)
        closed.bind(("::1", 0))
        dead_port = closed.getsockname()[1]
        closed.close()
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVERR, 1)
        sock.bind(("::1", 0))
        sock.sendto(b"to a dead peer", ("::1", dead_port))
        poller = select.poll()
        poller.register(sock, select.POLLERR)
        assert poller.poll(5000), "no port unreachable came back"
        assert underlay_probe.send(sock, b"probe", "::1", listener.getsockname()[1])
        assert listener.recv(64) == b"probe"
        # a refusal about the send itself is still a refusal, after one more try
        assert not underlay_probe.send(sock, b"x" * 70000, "::1", listener.getsockname()[1])
    finally:
        for s in (listener, sock, closed):
            s.close()


def lease6(i: int, pub6: str | None) -> Lease:
    return Lease(IPv4Network(f"10.5.{i}.0/24"),
                 LeaseAttrs(IPv4Address(f"192.168.77.{i}"), forwards_ipv6=True,
                            public_ipv6=IPv6Address(pub6) if pub6 else None),
                 ipv6_subnet=IPv6Network(f"fc00:66:0:{i}::/64"))


def parts(probe_routes=True, fallback=()) -> Ipv6Parts:
    v6 = Ipv6Parts(NET6, public6=IPv6Address("fd00:99::1"), mtu6=1452)
    v6.probe_routes = probe_routes
    v6.fallback = frozenset(IPv4Network(s) for s in fallback)
    return v6


def test_a_failed_peers_part_goes_over_ipv4_and_its_flannel0_address_stays_on_ipv6():
    snap = PeerSnapshot.of([lease6(2, "fd00:99::2"), lease6(3, None)], OWN)
    table = {str(r.subnet): r for r in route_table(snap, 8285, parts(fallback=["10.5.2.0/24"]))}
    assert table["fc00:66:0:2::/64"] == PeerRoute(IPv6Network("fc00:66:0:2::/64"),
                                                  IPv4Address("192.168.77.2"), 8285)
    assert table["fc00:66:0:2::/128"] == PeerRoute(IPv6Network("fc00:66:0:2::/128"),
                                                   IPv6Address("fd00:99::2"), 8285, mtu=1452)
    # a peer over IPv4 anyway has no probe route; without the probes, none at all
    assert "fc00:66:0:3::/128" not in table
    plain = {str(r.subnet): r for r in route_table(snap, 8285, parts(probe_routes=False))}
    assert "fc00:66:0:2::/128" not in plain
    assert plain["fc00:66:0:2::/64"].peer_ip == IPv6Address("fd00:99::2")
    assert probe_subnet(IPv6Network("fc00:66:0:2::/64")) == IPv6Network("fc00:66:0:2::/128")


@pytest.mark.parametrize("fallback", [(), ("10.5.3.0/24", "10.5.5.0/24")])
def test_route_changes_keep_the_probe_routes_equal_to_the_snapshots(fallback):
    """Peers come, go, change their part and PublicIPv6: the kept table stays
    route_table(snapshot), probe routes included."""
    rng = random.Random(44)
    v6 = parts(fallback=fallback)
    snap = PeerSnapshot.of([], OWN)
    table: dict = {}
    for _ in range(300):
        peers = dict(snap.peers)
        i = rng.randint(2, 8)
        if rng.random() < 0.25:
            peers.pop(IPv4Network(f"10.5.{i}.0/24"), None)
        else:
            lease = lease6(i, rng.choice([None, f"fd00:99::{rng.randint(2, 4)}"]))
            if rng.random() < 0.3:
                lease = Lease(lease.subnet, lease.attrs,
                              ipv6_subnet=IPv6Network(f"fc00:66:0:{i * 16 + rng.randint(0, 3):x}::/64"))
            peers[lease.subnet] = lease
        after = PeerSnapshot.of(peers, OWN)
        removed, added = route_changes(PeerChange.between(snap, after), 8285, v6, before=snap)
        for subnet in removed:
            table.pop(subnet, None)
        table.update((r.subnet, r) for r in added)
        assert table == {r.subnet: r for r in route_table(after, 8285, v6)}
        snap = after


def test_status_names_the_peers_on_ipv4():
    doc = {"ready": True, "ipv6_underlay_fallback": {
        "probed": 3, "interval_s": 5.0, "fallbacks": 2, "on_ipv4": [
            {"subnet": "10.5.2.0/24", "public_ipv6": "fd00:99::2", "public_ip": "192.168.77.2",
             "since": 1_800_000_000.0}]}}
    text = render(doc, now=1_800_000_010.0)
    assert "3 peer(s) probed every 5 s, 1 on IPv4 (no answer over IPv6), 2 fallback(s)" in text
    assert "10.5.2.0/24: IPv6 over IPv4 to 192.168.77.2 since " in text
    assert "(PublicIPv6 fd00:99::2 answers no probe)" in text


def test_the_flag_is_on_by_default_and_off_by_flag_or_environment():
    from dataplane.cli import build_parser, flanneld_flags

    def resolve(argv, env):
        return flanneld_flags.resolve(build_parser().parse_args(["run", *argv]), environ=env)
    assert resolve([], {}).ipv6_underlay_fallback is True
    assert resolve(["--ipv6-underlay-fallback=false"], {}).ipv6_underlay_fallback is False
    o = resolve([], {"FLANNELD_IPV6_UNDERLAY_FALLBACK": "false"})
    assert o.ipv6_underlay_fallback is False and o.sources["ipv6_underlay_fallback"] == "env"
