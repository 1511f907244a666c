"""Leases other flannels wrote, and reservations, against a real etcd.

flanneld reuses the key whose PublicIP is ours whatever else its value holds, rewrites it with its own
value, and keeps a key with no etcd lease (a reservation) without a TTL for ever. The guarded renew still
refuses a key that names another host, now by PublicIP instead of by bytes.
"""
from __future__ import annotations

import time
from ipaddress import IPv4Address, IPv4Network

import pytest

from dataplane.control.lease import LeaseAttrs
from dataplane.control.peers import PeerWatcher
from dataplane.control.registry import SUBNET_TTL, Registry
from dataplane.control.lease_manager import MIN_RENEW_GAP_S, LeaseManager
from tests.conftest import wait_until

pytestmark = pytest.mark.etcd
ME = IPv4Address("192.168.77.1")
OTHER = IPv4Address("192.168.77.9")
MINE = IPv4Network("10.5.200.0/24")
PREV = IPv4Network("10.5.7.0/24")         # what subnet.env says: the lease for our IP must win over it
OURS = LeaseAttrs(ME).to_json()
VXLAN_ERA = (b'{"PublicIP":"192.168.77.1","PublicIPv6":null,"BackendType":"vxlan",'
             b'"BackendData":{"VtepMAC":"7a:1c:4e:02:9b:10"}}')

SHAPES = {
    "backend-fields": (b'{"PublicIP":"192.168.77.1","PublicIPv6":null,"BackendType":"host-gw",'
                       b'"BackendData":null,"BackendV6Data":{"VtepMAC":"aa:bb:cc:dd:ee:ff"}}'),
    "order-and-spacing": b'{ "PublicIPv6" : null,\n  "PublicIP" : "192.168.77.1" }',
    "hand-written": b'{"PublicIP":"192.168.77.1"}',
    "go-case-insensitive": b'{"publicip":"192.168.77.1"}',
    "vxlan-era": VXLAN_ERA,
}


def stage(reg: Registry, subnet: IPv4Network, value: bytes, reserved: bool) -> int:
    """Write `value` under the subnet's key as another flannel would: with an etcd lease, or none
    (a reservation). Returns the etcd lease id (0 for a reservation)."""
    lease_id = 0 if reserved else reg.grant(600)
    reg.put(reg.lease_key(subnet), value, lease_id=lease_id)
    return lease_id


def kv_of(reg: Registry, subnet: IPv4Network):
    kvs, _ = reg.get(reg.lease_key(subnet))
    return kvs[0] if kvs else None


def held(reg) -> dict:
    leases, _ = reg.list_leases()
    return {l.subnet: l.attrs.public_ip for l in leases}


@pytest.mark.parametrize("reserved", [False, True], ids=["leased", "reserved"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_value_shape_is_reused_with_the_same_subnet(shared_etcd, make_registry, shape, reserved):
    reg = make_registry(shared_etcd)
    old_id = stage(reg, MINE, SHAPES[shape], reserved)
    lease = LeaseManager(reg, ME, subnet_file_prev=PREV).acquire()
    assert lease.subnet == MINE and lease.reservation == reserved
    kv = kv_of(reg, MINE)
    assert kv.value == OURS                                  # rewritten with this host's attributes
    if reserved:
        assert kv.lease == 0 and lease.expiration is None   # no TTL attached
    else:
        assert kv.lease == lease.lease_id and kv.lease != old_id
        assert SUBNET_TTL - 10 <= reg.time_to_live(kv.lease) <= SUBNET_TTL
    assert held(reg) == {MINE: ME}                           # nothing allocated besides it


@pytest.mark.parametrize("reserved", [False, True], ids=["leased", "reserved"])
def test_foreign_value_that_no_longer_fits_is_deleted_then_allocation_goes_on(shared_etcd, make_registry,
                                                                            reserved):
    reg = make_registry(shared_etcd, config='{"Network":"10.5.0.0/16","SubnetMin":"10.5.10.0",'
                                            '"SubnetMax":"10.5.20.0"}')
    stage(reg, MINE, VXLAN_ERA, reserved)                    # 10.5.200.0 is past SubnetMax
    lease = LeaseManager(reg, ME).acquire()
    assert IPv4Address("10.5.10.0") <= lease.subnet.network_address <= IPv4Address("10.5.20.0")
    assert kv_of(reg, MINE) is None and held(reg) == {lease.subnet: ME}


def test_vxlan_era_lease_of_the_same_ip_keeps_its_subnet_while_running(shared_etcd, make_registry):
    """A host moving from flanneld's vxlan backend: its lease is reused, renewed as ours from then on,
    and no other subnet is ever taken."""
    reg = make_registry(shared_etcd)
    stage(reg, MINE, VXLAN_ERA, reserved=False)
    changes: list = []
    mgr = LeaseManager(reg, ME, subnet_file_prev=PREV, on_lease_change=changes.append, lease_ttl=3,
                      renew_margin_s=2.0, retry_interval=0.2, watch_retry_interval=0.2)
    first = mgr.acquire()
    mgr.start()
    try:
        wait_until(lambda: mgr.renewals >= 2, timeout=8, what="two renewals of the migrated lease")
        assert mgr.lease.subnet == first.subnet == MINE
        assert mgr.reacquisitions == 0 and not changes
        assert kv_of(reg, MINE).value == OURS and held(reg) == {MINE: ME}
    finally:
        mgr.stop()


def test_reservation_kept_across_restarts_and_never_given_a_ttl(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    stage(reg, MINE, b'{"PublicIP":"192.168.77.1"}', reserved=True)
    for run in range(2):                                     # a restart of the lease manager
        mgr = LeaseManager(reg, ME, subnet_file_prev=PREV, lease_ttl=2, renew_margin_s=1.5,
                          retry_interval=0.1, watch_retry_interval=0.2)
        lease = mgr.acquire()
        assert lease.subnet == MINE and lease.reservation, f"run {run}"
        mgr.start()
        try:
            # Several times the TTL a lease would have: a renewal would have attached one by now.
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                kv = kv_of(reg, MINE)
                assert kv is not None and kv.lease == 0, f"run {run}: reservation changed: {kv}"
                time.sleep(0.1)
            assert mgr.renewals == 0 and mgr.reacquisitions == 0 and mgr.lease.reservation
        finally:
            mgr.stop()
        kv = kv_of(reg, MINE)                                # never deleted at stop
        assert kv is not None and kv.lease == 0 and kv.value == OURS
    assert held(reg) == {MINE: ME}


def test_peers_route_to_a_reserved_subnet(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    own, reserved, later = (IPv4Network(f"10.5.{n}.0/24") for n in (1, 2, 3))
    reg.create_lease(own, LeaseAttrs(ME), ttl=600)
    stage(reg, reserved, b'{"PublicIP":"192.168.77.2"}', reserved=True)
    w = PeerWatcher(reg, own, None, retry_interval=0.2)
    w.start()
    try:
        assert w.wait_ready(10)
        assert {s: l.public_ip for s, l in w.peers().items()} == {reserved: IPv4Address("192.168.77.2")}
        # One written while watching arrives through the watch too, with or without Backend fields.
        stage(reg, later, b'{"PublicIP":"192.168.77.3","BackendType":"udp"}', reserved=True)
        wait_until(lambda: later in w.peers(), what="reservation seen by the peer watch")
        assert w.peers()[later].public_ip == IPv4Address("192.168.77.3") and w.peers()[later].reservation
    finally:
        w.stop()


def _running(reg, **kw):
    changes: list = []
    mgr = LeaseManager(reg, ME, on_lease_change=changes.append, reacquire_interval=0.1,
                      watch_retry_interval=0.2, **kw)
    first = mgr.acquire()
    mgr.start()
    wait_until(lambda: mgr._watch is not None and mgr._watch.connected.is_set(), what="own-lease watch")
    return mgr, first, changes


def test_own_key_rewritten_with_other_spacing_is_not_a_lost_lease(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    mgr, first, changes = _running(reg, lease_ttl=3, renew_margin_s=2.0, retry_interval=0.2)
    try:
        rewritten = b'{ "PublicIP": "192.168.77.1", "PublicIPv6": null, "BackendType": "udp" }'
        rev = reg.put(first.key, rewritten, lease_id=mgr.lease.lease_id)
        wait_until(lambda: mgr._watch.next_revision > rev, what="the watch to see the rewrite")
        wait_until(lambda: mgr.renewals >= 1, timeout=8, what="a renewal of the rewritten key")
        assert not changes and mgr.reacquisitions == 0 and mgr.lease.subnet == first.subnet
        kv = kv_of(reg, first.subnet)
        assert kv.value == OURS and kv.lease == mgr.lease.lease_id != 0
    finally:
        mgr.stop()


def test_own_key_put_again_without_an_etcd_lease_becomes_a_reservation(shared_etcd, make_registry):
    """`etcdctl put` without --lease detaches the key from its etcd lease: from then on it is a
    reservation, as it would be at the next start, and no renewal gives it a TTL again."""
    reg = make_registry(shared_etcd)
    mgr, first, changes = _running(reg, renew_margin_s=SUBNET_TTL - 5, retry_interval=0.2)
    try:
        reg.put(first.key, b'{"PublicIP":"192.168.77.1"}')
        # Seen by the watch at once, not at the renewal the 24 h lease has due 5 s after it began.
        wait_until(lambda: mgr.lease.reservation, timeout=2, what="the watch to see the reservation")
        time.sleep(max(0.0, first.expiration - (SUBNET_TTL - 5) + 1 - time.time()))
        kv = kv_of(reg, first.subnet)
        assert kv.lease == 0 and kv.value == b'{"PublicIP":"192.168.77.1"}' and mgr.renewals == 0
        assert not changes and mgr.lease.subnet == first.subnet and mgr.lease.expiration is None
    finally:
        mgr.stop()
    assert kv_of(reg, first.subnet).lease == 0                # and not deleted at stop


def test_reservation_given_an_etcd_lease_is_renewed_before_it_runs_out(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    stage(reg, MINE, OURS, reserved=True)
    mgr, first, changes = _running(reg, lease_ttl=600, retry_interval=0.2)
    try:
        assert first.reservation and first.subnet == MINE
        short = reg.grant(2)
        given = time.monotonic()
        reg.put(first.key, OURS, lease_id=short)              # the operator ends the reservation
        wait_until(lambda: mgr.renewals >= 1, what="a renewal of the key given a TTL")
        time.sleep(2.5)                                       # the operator's 2 s lease has run out
        kv = kv_of(reg, MINE)
        assert kv is not None and kv.lease == mgr.lease.lease_id not in (0, short)
        assert 590 <= reg.time_to_live(kv.lease) <= 600
        assert not changes and mgr.reacquisitions == 0 and not mgr.lease.reservation
        # the renew margin (an hour) is longer than this TTL: renewed no more often than the
        # floor between renewals (lease_manager.py), not in a loop as fast as etcd answers
        assert mgr.renewals <= (time.monotonic() - given) / MIN_RENEW_GAP_S + 1, mgr.renewals
    finally:
        mgr.stop()


@pytest.mark.parametrize("value", [LeaseAttrs(OTHER).to_json(),
                                   b'{"BackendType":"vxlan","PublicIP":"192.168.77.9"}'],
                         ids=["udp", "vxlan-shaped"])
def test_another_hosts_public_ip_in_our_key_is_a_loss(shared_etcd, make_registry, value):
    reg = make_registry(shared_etcd)
    mgr, first, changes = _running(reg)
    try:
        reg.put(first.key, value, lease_id=mgr.lease.lease_id)
        wait_until(lambda: changes, what="on_lease_change after another host took our key")
        assert changes[0].subnet != first.subnet
        assert held(reg) == {first.subnet: OTHER, changes[0].subnet: ME}
        assert kv_of(reg, first.subnet).value == value        # the other host's key left alone
    finally:
        mgr.stop()


class RivalAfterRead(Registry):
    """A registry whose reads of a lease key are followed, before its own transaction, by a real
    write of `rival_values` (one per read, while any are left): a change between read and put."""

    def __init__(self, *a, rival: Registry, rival_values: list, **kw):
        super().__init__(*a, **kw)
        self.rival = rival
        self.rival_values = list(rival_values)

    def get_raw(self, key):
        kv = super().get_raw(key)
        if self.rival_values:
            self.rival.put(key, self.rival_values.pop(0), lease_id=kv.lease if kv is not None else 0)
        return kv


def _racing(shared_etcd, make_registry, values):
    base = make_registry(shared_etcd)
    reg = RivalAfterRead([shared_etcd.client_url], prefix=base.prefix, rival=base, rival_values=values)
    return base, reg


def test_guarded_renew_loses_to_a_host_that_wrote_in_between(shared_etcd, make_registry):
    base, reg = _racing(shared_etcd, make_registry, [LeaseAttrs(OTHER).to_json()])
    try:
        reg.create_lease(MINE, LeaseAttrs(ME), ttl=600)
        assert reg.renew_lease(MINE, LeaseAttrs(ME), ttl=600) is None
        assert kv_of(base, MINE).value == LeaseAttrs(OTHER).to_json()
    finally:
        reg.close()


def test_guarded_renew_reads_again_after_a_rewrite_that_keeps_our_ip(shared_etcd, make_registry):
    base, reg = _racing(shared_etcd, make_registry, [b'{"PublicIP": "192.168.77.1"}'])
    try:
        reg.create_lease(MINE, LeaseAttrs(ME), ttl=600)
        renewed = reg.renew_lease(MINE, LeaseAttrs(ME), ttl=600)
        assert renewed is not None and renewed.lease_id and not reg.rival_values
        kv = kv_of(base, MINE)
        assert kv.value == OURS and kv.lease == renewed.lease_id
    finally:
        reg.close()


def test_renew_refuses_a_value_that_is_no_lease(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    reg.put(reg.lease_key(MINE), b"not json")
    assert reg.renew_lease(MINE, LeaseAttrs(ME)) is None
    assert kv_of(reg, MINE).value == b"not json"
