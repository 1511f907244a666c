"""When the lease manager renews: at `expiration - margin`, exactly as flanneld, with a floor only
where a margin reaches a shortened TTL (docs/flannel-compat.md#lease-ttl). The renewals as etcd sees
them: tests/integration/test_lease_renew_timing.py."""
from ipaddress import IPv4Address, IPv4Network

import pytest

from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.control.lease_manager import MIN_RENEW_GAP_S, LeaseManager
from dataplane.control.registry import SUBNET_TTL

SUBNET = IPv4Network("10.5.3.0/24")
RENEWED_AT = 1_800_000_000.0          # a unix time: the moment of the last grant


def manager(**kw) -> LeaseManager:
    return LeaseManager(None, IPv4Address("192.168.77.1"), **kw)


def granted(ttl: float, lease_id: int = 7) -> Lease:
    return Lease(SUBNET, LeaseAttrs(IPv4Address("192.168.77.1")), expiration=RENEWED_AT + ttl,
                 lease_id=lease_id)


def test_the_largest_margin_renews_one_minute_after_the_last_renewal():
    # flanneld's values: a 24 h grant, --subnet-lease-renew-margin 1439 (minutes)
    mgr = manager(renew_margin_min=1439)
    assert SUBNET_TTL == 86400 and mgr.lease_ttl == 86400 and mgr.renew_margin == 1439 * 60
    due = mgr._renew_due(granted(86400))
    assert due - RENEWED_AT == pytest.approx(86400 - 1439 * 60) == 60


@pytest.mark.parametrize("minutes, after_h", [(60, 23), (1, 86340 / 3600), (720, 12)])
def test_every_margin_of_flanneld_renews_at_expiration_minus_margin(minutes, after_h):
    mgr = manager(renew_margin_min=minutes)
    lease = granted(86400)
    assert mgr._renew_due(lease) == pytest.approx(lease.expiration - minutes * 60)
    assert (mgr._renew_due(lease) - RENEWED_AT) / 3600 == pytest.approx(after_h)


def test_a_short_ttl_renews_ttl_minus_margin_after_the_last_renewal():
    # T = 6 s, M = 5 s: one second after each renewal
    mgr = manager(lease_ttl=6, renew_margin_s=5.0)
    assert mgr._renew_due(granted(6)) - RENEWED_AT == pytest.approx(1.0)


@pytest.mark.parametrize("margin", [6.0, 9.5, 86400.0])
def test_a_margin_that_reaches_the_ttl_renews_no_sooner_than_the_floor(margin):
    mgr = manager(lease_ttl=6, renew_margin_s=margin)
    due = mgr._renew_due(granted(6))
    assert due - RENEWED_AT == pytest.approx(MIN_RENEW_GAP_S)
    assert due < RENEWED_AT + 6           # still before the grant runs out


def test_the_floor_never_delays_a_margin_that_leaves_more_than_it():
    assert 86400 - 1439 * 60 > MIN_RENEW_GAP_S
    mgr = manager(lease_ttl=3, renew_margin_s=2.0)
    assert mgr._renew_due(granted(3)) - RENEWED_AT == pytest.approx(1.0)
    mgr = manager(lease_ttl=10, renew_margin_s=2.0)
    assert mgr._renew_due(granted(10)) - RENEWED_AT == pytest.approx(8.0)


def test_a_key_whose_etcd_lease_ends_sooner_than_our_ttl_is_renewed_at_once():
    """An etcd lease of another's (an operator gave our reservation a 2 s one): the daemon takes
    its expiration as now, and the renewal is due now, not a floor later."""
    mgr = manager(renew_margin_min=60)
    lease = granted(0)                    # expiration = RENEWED_AT: now
    assert mgr._renew_due(lease) <= RENEWED_AT


def test_a_reservation_is_never_due():
    assert manager()._renew_due(granted(86400, lease_id=0)) == float("inf")
