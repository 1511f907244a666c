"""Two keys that name one IPv4 subnet or one IPv6 part: the key created first holds it, the other
is a conflict whose put and delete move nothing (issue 44; control/claims.py). No etcd, no root:
the rule itself, then the watcher over a registry the test drives (list, events, re-list)."""
from __future__ import annotations

import itertools
import logging
import random
from ipaddress import IPv4Address, IPv4Network, IPv6Network

import pytest

from dataplane.control.claims import Claims
from dataplane.control.etcd_watch import WatchEvent
from dataplane.control.lease import LeaseAttrs, lease_from_kv
from tests.unit.test_peer_batches import PREFIX, watch  # noqa: F401 (watch: the fixture)

B = "10.5.2.0-24&fc00:5:0:2::-64"                 # B's key, created first
STRAY4 = "10.5.2.0-24&fc00:5:0:ee::-64"           # B's IPv4 subnet, another IPv6 part
STRAY6 = "10.5.200.0-24&fc00:5:0:2::-64"          # B's IPv6 part, another IPv4 subnet


def value(ip: str) -> bytes:
    return LeaseAttrs(IPv4Address(ip), forwards_ipv6=True).to_json()


def lease(name: str, ip: str, created: int, rev: int | None = None):
    return lease_from_kv(PREFIX + name, value(ip), mod_revision=rev or created,
                         create_revision=created)


def view(claims: Claims) -> dict:
    return {str(s): (l.key[len(PREFIX):], str(l.public_ip)) for s, l in claims.held.items()}


def conflicts(claims: Claims) -> list:
    return sorted(k[len(PREFIX):] for k in claims.conflicts)


# -- the rule ------------------------------------------------------------------------------------
@pytest.mark.parametrize("stray", [STRAY4, STRAY6])
def test_the_key_created_first_holds_whichever_arrives_first(stray):
    b, s = lease(B, "192.168.77.2", 5), lease(stray, "192.168.77.66", 9)
    for order in ((b, s), (s, b)):
        claims = Claims()
        for one in order:
            claims.put(one)
        assert view(claims) == {"10.5.2.0/24": (B, "192.168.77.2")}, order
        assert conflicts(claims) == [stray] and claims.seen == 1
        assert ("subnet 10.5.2.0/24" if stray == STRAY4 else "IPv6 part fc00:5:0:2::/64") \
            in claims.conflicts[PREFIX + stray]


@pytest.mark.parametrize("stray", [STRAY4, STRAY6])
def test_the_junior_key_put_again_and_deleted_moves_nothing(stray, caplog):
    claims = Claims()
    claims.put(lease(B, "192.168.77.2", 5))
    held = dict(claims.held)
    with caplog.at_level(logging.INFO, logger="dataplane.control.claims"):
        assert claims.put(lease(stray, "192.168.77.66", 9)) == {}
        assert claims.put(lease(stray, "192.168.77.67", 9, rev=10)) == {}   # rewritten
        assert claims.delete(PREFIX + stray) == {}
    assert claims.held == held and claims.conflicts == {} and claims.seen == 1
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and said[0].startswith(f"Skipping subnet lease {PREFIX}{stray}: "), said
    assert f"etcdctl del {PREFIX}{stray})" in said[0] and "in conflict, is gone" in said[1]


def test_the_holders_renewal_changes_only_its_own_lease():
    claims = Claims()
    claims.put(lease(B, "192.168.77.2", 5))
    claims.put(lease(STRAY4, "192.168.77.66", 9))
    old = claims.held[IPv4Network("10.5.2.0/24")]
    renewed = lease(B, "192.168.77.2", 5, rev=30)
    assert claims.put(renewed) == {IPv4Network("10.5.2.0/24"): old}
    assert claims.held[IPv4Network("10.5.2.0/24")] is renewed
    assert conflicts(claims) == [STRAY4] and claims.seen == 1


@pytest.mark.parametrize("stray", [STRAY4, STRAY6])
def test_the_holder_gone_the_junior_holds(stray, caplog):
    claims = Claims()
    claims.put(lease(B, "192.168.77.2", 5))
    claims.put(lease(stray, "192.168.77.66", 9))
    with caplog.at_level(logging.INFO, logger="dataplane.control.claims"):
        changed = claims.delete(PREFIX + B)
    net = str(lease(stray, "192.168.77.66", 9).subnet)
    assert view(claims) == {net: (stray, "192.168.77.66")} and claims.conflicts == {}
    assert {str(s) for s in changed} == {"10.5.2.0/24", net}
    assert any("is no longer in conflict" in r.getMessage() for r in caplog.records)
    # the holder comes back, created anew: it is the junior now
    claims.put(lease(B, "192.168.77.2", 12))
    assert view(claims) == {net: (stray, "192.168.77.66")} and conflicts(claims) == [B]


def test_unknown_create_revisions_come_last_then_the_key_decides():
    claims = Claims()
    claims.put(lease(STRAY4, "192.168.77.66", 0))
    claims.put(lease(B, "192.168.77.2", 40))
    assert conflicts(claims) == [STRAY4]
    claims.delete(PREFIX + B)
    claims.put(lease(B, "192.168.77.2", 0))       # neither known: the key's order
    assert conflicts(claims) == [STRAY4] and "revision unknown" in claims.conflicts[PREFIX + STRAY4]


def test_nothing_cascades_and_the_order_never_matters():
    """Keys that share parts in a chain; any order of puts, deletes in any order, and one
    ``replace`` of what is left all end in one outcome: the outcome of the keys alone."""
    rng = random.Random(44)
    names = [f"10.5.{rng.choice((2, 3, 4))}.0-24&fc00:5:0:{rng.choice((2, 3, 4))}::-64"
             for _ in range(12)]
    leases = {n: lease(n, f"192.168.77.{i + 10}", rng.choice((0, 3, 5, 7, 9, 11)))
              for i, n in enumerate(dict.fromkeys(names))}
    outcomes = set()
    for _ in range(30):
        claims = Claims()
        order = list(leases.values())
        rng.shuffle(order)
        for one in order:
            claims.put(one)
        gone = rng.sample(sorted(leases), len(leases) // 3)
        for name in gone:
            claims.delete(PREFIX + name)
        outcome = (tuple(sorted(view(claims).items())), tuple(conflicts(claims)))
        fresh = Claims()
        fresh.replace(l for n, l in leases.items() if n not in gone)
        assert (tuple(sorted(view(fresh).items())), tuple(conflicts(fresh))) == outcome
        # every held subnet's key holds its parts: no two held leases share an IPv6 part
        parts = [l.ipv6_subnet for l in claims.held.values()]
        assert len(parts) == len(set(parts))
        outcomes.add((outcome, tuple(sorted(gone))))
    assert len(outcomes) > 1


def test_a_re_list_says_nothing_again_and_ends_what_is_gone(caplog):
    claims = Claims()
    claims.replace([lease(B, "192.168.77.2", 5), lease(STRAY4, "192.168.77.66", 9)])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dataplane.control.claims"):
        claims.replace([lease(B, "192.168.77.2", 5, rev=20), lease(STRAY4, "192.168.77.66", 9)])
        assert not caplog.records and claims.seen == 1
        claims.replace([lease(B, "192.168.77.2", 5, rev=20)])
    assert claims.conflicts == {} and "in conflict, is gone" in caplog.records[0].getMessage()


# -- the watcher: first list, events, re-list --------------------------------------------------
def put(name: str, ip: str, rev: int, created: int | None = None) -> WatchEvent:
    return WatchEvent("put", PREFIX + name, value(ip), rev, 0,
                      created if created is not None else rev)


def delete(name: str, rev: int) -> WatchEvent:
    return WatchEvent("delete", PREFIX + name, b"", rev, 0)


def routes(w) -> dict:
    return {str(s): (str(l.public_ip), str(l.ipv6_subnet)) for s, l in w.peers().items()}


HELD = {"10.5.2.0/24": ("192.168.77.2", "fc00:5:0:2::/64")}


@pytest.mark.parametrize("stray", [STRAY4, STRAY6])
def test_a_stray_key_put_and_deleted_is_never_reported(watch, stray):
    w, reg, reports = watch([lease(B, "192.168.77.2", 5)])
    n = len(reports.changes)
    reg.send(put(stray, "192.168.77.66", 11))
    w.flush()
    assert routes(w) == HELD and list(w.bad()) == [PREFIX + stray] and w.bad_total == 1
    reg.send(put(stray, "192.168.77.66", 12, created=11), delete(stray, 13))
    w.flush()
    assert routes(w) == HELD and w.bad() == {} and w.bad_total == 1
    assert len(reports.changes) == n, "no report: nothing downstream (routes, DirectRouting) moves"
    # the holder's renewal neither
    reg.send(put(B, "192.168.77.2", 14, created=5))
    w.flush()
    assert len(reports.changes) == n


@pytest.mark.parametrize("stray", [STRAY4, STRAY6])
def test_list_events_and_re_list_agree(watch, stray):
    both = [lease(B, "192.168.77.2", 5), lease(stray, "192.168.77.66", 9)]
    for first in itertools.permutations(both):     # the list's order is no rule
        w, reg, _ = watch(list(first))
        assert routes(w) == HELD and list(w.bad()) == [PREFIX + stray]
        said = w.bad_total
        w._snapshot(relist=True)                   # the watch's re-list after a compaction
        assert routes(w) == HELD and w.bad_total == said
    # events: the stray first, then B created before it (a re-list would see just that)
    w, reg, reports = watch()
    reg.send(put(stray, "192.168.77.66", 9), put(B, "192.168.77.2", 10, created=5))
    w.flush()
    assert routes(w) == HELD and list(w.bad()) == [PREFIX + stray]
    # the holder deleted while the watch was away (a compaction), the stray holds after the re-list
    reg.leases = [lease(stray, "192.168.77.66", 9)]
    w._snapshot(relist=True)
    s = lease(stray, "192.168.77.66", 9)
    assert routes(w) == {str(s.subnet): ("192.168.77.66", str(s.ipv6_subnet))} and w.bad() == {}
    assert reports.changes[-1].added == (s,)


def test_a_stray_key_for_our_own_subnet_routes_nothing_and_takes_nothing(watch):
    """Our key holds our subnet and IPv6 part: a stray naming either is no route here, and its
    delete takes nothing of ours (nor of the peers')."""
    ours = "10.5.1.0-24&fc00:5:0:1::-64"
    w, reg, reports = watch([lease(ours, "192.168.77.1", 3), lease(B, "192.168.77.2", 5)])
    n = len(reports.changes)
    for stray in ("10.5.1.0-24&fc00:5:0:ee::-64", "10.5.201.0-24&fc00:5:0:1::-64"):
        reg.send(put(stray, "192.168.77.66", 20))
        w.flush()
        assert routes(w) == HELD and list(w.bad()) == [PREFIX + stray]
        reg.send(delete(stray, 21))
        w.flush()
        assert routes(w) == HELD and w.bad() == {}
    assert len(reports.changes) == n
    assert set(w._claims.held) == {IPv4Network("10.5.1.0/24"), IPv4Network("10.5.2.0/24")}
    assert w._claims.held[IPv4Network("10.5.1.0/24")].ipv6_subnet == IPv6Network("fc00:5:0:1::/64")
