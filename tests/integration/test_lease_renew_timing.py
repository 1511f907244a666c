"""When the lease is renewed, as etcd sees it (real etcd, shortened TTLs): at `expiration - margin`,
so renewals come TTL - margin apart, as flanneld's (docs/flannel-compat.md#lease-ttl); a margin that
reaches the TTL renews no more often than MIN_RENEW_GAP_S. The arithmetic with flanneld's own values
(24 h, 1439 min -> 60 s): tests/unit/test_lease_renew_due.py."""
from __future__ import annotations

import time
from ipaddress import IPv4Address

import pytest

from dataplane.control.lease_manager import MIN_RENEW_GAP_S, LeaseManager
from tests.conftest import wait_until

pytestmark = pytest.mark.etcd

ME = IPv4Address("192.168.77.1")
POLL_S = 0.01


def observe(reg, key: str, seconds: float) -> list[tuple[float, int, float]]:
    """Every etcd lease the key is put under during ``seconds``: (seen, lease id, expiration),
    ``seen`` the moment the key first showed it (polled every POLL_S), ``expiration`` as etcd
    tells it: ``seen`` plus the lease's remaining TTL (whole seconds, rounded down by etcd)."""
    out: list[tuple[float, int, float]] = []
    end = time.time() + seconds
    while time.time() < end:
        kvs, _ = reg.get(key)
        assert kvs, f"{key} is gone: the lease ran out between two renewals"
        if not out or kvs[0].lease != out[-1][1]:
            seen = time.time()
            out.append((seen, kvs[0].lease, seen + reg.time_to_live(kvs[0].lease)))
        time.sleep(POLL_S)
    return out


def running(make_registry, shared_etcd, ttl: int, margin: float):
    reg = make_registry(shared_etcd)
    watcher = make_registry(shared_etcd, prefix=reg.prefix, config=None)
    mgr = LeaseManager(reg, ME, lease_ttl=ttl, renew_margin_s=margin, retry_interval=0.2,
                       watch_retry_interval=0.2)
    lease = mgr.acquire()
    mgr.start()
    return mgr, lease, watcher


@pytest.mark.parametrize("ttl, margin, apart, window", [
    (6, 5.0, 1.0, 5.5),            # T = 6 s, M = 5 s: T - M = 1 s between renewals
    (5, 3.0, 2.0, 7.0),            # T = 5 s, M = 3 s: 2 s
])
def test_renewals_come_ttl_minus_margin_apart(shared_etcd, make_registry, ttl, margin, apart,
                                              window):
    mgr, first, watcher = running(make_registry, shared_etcd, ttl, margin)
    try:
        seen = observe(watcher, first.key, window)
    finally:
        mgr.stop()
    n = len(seen) - 1                                   # renewals seen after the first grant
    assert n == pytest.approx(window / apart, abs=1), seen
    moments = [s for s, _, _ in seen]
    gaps = [b - a for a, b in zip(moments, moments[1:])]
    # each renewal T - M after the one before (the poll and etcd's answer add a little)
    assert all(apart - 0.15 <= g <= apart + 0.3 for g in gaps), gaps
    # etcd's expirations move on by T - M per renewal (averaged: etcd says whole seconds)
    exps = [e for _, _, e in seen]
    assert (exps[-1] - exps[0]) / n == pytest.approx(apart, abs=1.0 / n + 0.15), exps
    # each is a fresh grant of the TTL, so it expires T after it was made (whole seconds)
    assert all(ttl - 1 <= e - s <= ttl for s, _, e in seen), seen
    assert mgr.renewals == pytest.approx(n, abs=1) and mgr.reacquisitions == 0


@pytest.mark.parametrize("margin", [4.0, 30.0])
def test_a_margin_that_reaches_the_ttl_renews_at_the_floor_and_keeps_the_lease(
        shared_etcd, make_registry, margin):
    """T = 4 s and M >= T: `expiration - margin` is past at every renewal; without the floor the
    renewals would follow each other as fast as etcd answers."""
    mgr, first, watcher = running(make_registry, shared_etcd, 4, margin)
    window = 4.5
    try:
        seen = observe(watcher, first.key, window)      # fails if the key ever runs out
    finally:
        mgr.stop()
    moments = [s for s, _, _ in seen]
    gaps = [b - a for a, b in zip(moments, moments[1:])]
    assert len(gaps) == pytest.approx(window / MIN_RENEW_GAP_S, abs=1), gaps
    assert all(MIN_RENEW_GAP_S - 0.15 <= g <= MIN_RENEW_GAP_S + 0.3 for g in gaps), gaps
    assert mgr.reacquisitions == 0
    wait_until(lambda: watcher.get(first.key)[0], what="the key, still there after stop")
