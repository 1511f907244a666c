"""LeaseManager against a real etcd: flanneld's acquisition order, races, renewal, lost leases."""
from __future__ import annotations

import contextlib
import random
import threading
from ipaddress import IPv4Address, IPv4Network

import pytest

from dataplane.control.lease import LeaseAttrs, split_parts
from dataplane.control.registry import Registry
from dataplane.control.lease_manager import LeaseManager, OutOfSubnetsError, check_renew_margin, free_subnets
from tests.conftest import wait_until

pytestmark = pytest.mark.etcd
N = IPv4Network("10.5.0.0/16")


def ip(i: int) -> IPv4Address:
    return IPv4Address(f"192.168.{i // 250}.{i % 250 + 1}")


def held(reg) -> dict:
    leases, _ = reg.list_leases()
    return {l.subnet: l.attrs.public_ip for l in leases}


def test_random_pick_within_first_100_free(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    picks = set()
    for i in range(5):
        mgr = LeaseManager(reg, ip(i))
        lease = mgr.acquire()
        assert lease.subnet.prefixlen == 24 and lease.subnet.subnet_of(N)
        assert IPv4Address("10.5.1.0") <= lease.subnet.network_address <= IPv4Address("10.5.105.0")
        picks.add(lease.subnet)
    assert len(picks) == 5
    # 100 candidates counted after skipping the taken ones.
    cfg = reg.get_config()
    free = free_subnets(cfg, list(picks))
    assert len(free) == 100 and not picks & set(free)
    assert free[0] >= IPv4Network("10.5.1.0/24")


def test_value_and_ttl_as_flanneld(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    lease = LeaseManager(reg, "192.168.77.1").acquire()
    kv = reg.get(lease.key)[0][0]
    assert kv.value == b'{"PublicIP":"192.168.77.1","PublicIPv6":null}'
    assert 86390 <= reg.time_to_live(kv.lease) <= 86400


def test_reuse_by_public_ip_wins_over_previous(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    mine = IPv4Network("10.5.200.0/24")
    old = reg.create_lease(mine, LeaseAttrs(IPv4Address("192.168.77.1")), ttl=600)
    mgr = LeaseManager(reg, "192.168.77.1", subnet_file_prev=IPv4Network("10.5.7.0/24"))
    lease = mgr.acquire()
    assert lease.subnet == mine and lease.lease_id != old.lease_id          # renewed: a new grant
    assert IPv4Network("10.5.7.0/24") not in held(reg)


def test_incompatible_lease_for_our_ip_is_deleted(shared_etcd, make_registry):
    reg = make_registry(shared_etcd, config='{"Network":"10.5.0.0/16","SubnetMin":"10.5.10.0",'
                                            '"SubnetMax":"10.5.20.0"}')
    me = IPv4Address("192.168.77.1")
    reg.create_lease(IPv4Network("10.5.30.0/24"), LeaseAttrs(me), ttl=600)   # outside SubnetMax
    reg.create_lease(IPv4Network("10.5.11.0/25"), LeaseAttrs(me), ttl=600)   # wrong length
    lease = LeaseManager(reg, me).acquire()
    assert IPv4Network("10.5.10.0/24").network_address <= lease.subnet.network_address <= IPv4Address("10.5.20.0")
    assert held(reg) == {lease.subnet: me}


def test_previous_subnet_reused_when_free(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    prev = IPv4Network("10.5.77.0/24")
    assert LeaseManager(reg, ip(1), subnet_file_prev=prev).acquire().subnet == prev


def test_previous_subnet_taken_falls_through_to_random(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    prev = IPv4Network("10.5.77.0/24")
    reg.create_lease(prev, LeaseAttrs(ip(2)), ttl=600)
    lease = LeaseManager(reg, ip(1), subnet_file_prev=prev).acquire()
    assert lease.subnet != prev and held(reg)[prev] == ip(2)


def test_previous_subnet_incompatible_ignored(shared_etcd, make_registry):
    reg = make_registry(shared_etcd, config='{"Network":"10.5.0.0/16","SubnetLen":25}')
    prev = IPv4Network("10.5.77.0/24")
    lease = LeaseManager(reg, ip(1), subnet_file_prev=prev).acquire()
    assert lease.subnet.prefixlen == 25


def test_out_of_subnets_is_a_clear_error(shared_etcd, make_registry):
    reg = make_registry(shared_etcd, config='{"Network":"10.5.0.0/28"}')     # /30s: .4, .8, .12
    got = {LeaseManager(reg, ip(i)).acquire().subnet for i in range(3)}
    assert got == {IPv4Network(f"10.5.0.{n}/30") for n in (4, 8, 12)}
    with pytest.raises(OutOfSubnetsError, match="out of subnets"):
        LeaseManager(reg, ip(9)).acquire()


class RacingRegistry(Registry):
    """A registry whose first `races` creates are beaten by another node's create (a real write)."""

    def __init__(self, *a, rival: Registry, races: int, **kw):
        super().__init__(*a, **kw)
        self.rival = rival
        self.races = races
        self.lost = []

    def create_lease(self, subnets, attrs, ttl=86400):
        if len(self.lost) < self.races:
            self.lost.append(split_parts(subnets)[0])
            assert self.rival.create_lease(subnets, LeaseAttrs(IPv4Address("10.99.0.1")),
                                           ttl) is not None
        return super().create_lease(subnets, attrs, ttl)


class PrefersSubnet(random.Random):
    def __init__(self, subnet):
        super().__init__(7)
        self.subnet = subnet

    def choice(self, seq):
        return self.subnet if self.subnet in seq else super().choice(seq)


def test_losing_a_creation_race_retries_another_subnet(shared_etcd, make_registry):
    rival = make_registry(shared_etcd)
    reg = RacingRegistry([shared_etcd.client_url], prefix=rival.prefix, rival=rival, races=3)
    try:
        prev = IPv4Network("10.5.77.0/24")
        # An rng that picks the lost previous subnet whenever it is offered: it must not be.
        lease = LeaseManager(reg, ip(1), subnet_file_prev=prev, rng=PrefersSubnet(prev)).acquire()
        assert lease.subnet not in reg.lost and reg.lost[0] == prev and len(reg.lost) == 3
        owners = held(reg)
        assert owners[lease.subnet] == ip(1)
        assert all(owners[s] == IPv4Address("10.99.0.1") for s in reg.lost)
    finally:
        reg.close()


def test_two_nodes_concurrently(shared_etcd, make_registry):
    regs = [make_registry(shared_etcd, prefix=None, config=None)]
    regs[0].put_config('{"Network":"10.5.0.0/16"}')
    regs.append(make_registry(shared_etcd, prefix=regs[0].prefix, config=None))
    barrier = threading.Barrier(2)
    out = [None, None]

    def node(i):
        barrier.wait()
        # Same seed: both pick the same subnet first, so one of them must lose the race and retry.
        out[i] = LeaseManager(regs[i], ip(i), rng=random.Random(42)).acquire()

    ts = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    [t.start() for t in ts]
    [t.join(30) for t in ts]
    assert out[0].subnet != out[1].subnet
    assert held(regs[0]) == {out[0].subnet: ip(0), out[1].subnet: ip(1)}


def test_renewal_observed_with_short_ttl(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    mgr = LeaseManager(reg, ip(1), lease_ttl=3, renew_margin_s=2.0, retry_interval=0.2)
    first = mgr.acquire()
    mgr.start()
    try:
        wait_until(lambda: mgr.renewals >= 2, timeout=6, what="two renewals")
        # Once the first grant has expired, only the renewals' grants keep the key alive.
        wait_until(lambda: reg.time_to_live(first.lease_id) < 0, timeout=6, interval=0.2,
                   what="the first grant to expire")
        kv = reg.get(first.key)[0][0]
        assert kv.lease != first.lease_id and kv.value == LeaseAttrs(ip(1)).to_json()
        assert reg.time_to_live(kv.lease) > 0
        assert mgr.lease.subnet == first.subnet and mgr.reacquisitions == 0
    finally:
        mgr.stop()
    # Nothing deleted on stop (flanneld keeps the lease until it expires).
    assert reg.get(first.key)[0]


def test_renew_margin_range():
    assert check_renew_margin(1) == 1 and check_renew_margin(1439) == 1439
    for bad in (0, 1440, -5):
        with pytest.raises(ValueError, match="out of acceptable range"):
            check_renew_margin(bad)


@contextlib.contextmanager
def _watched(reg):
    """A started LeaseManager once the watch of its lease key is connected: (the manager, its first
    lease, what it reported to on_lease_change); stopped after."""
    changes: list = []
    mgr = LeaseManager(reg, ip(1), on_lease_change=changes.append, reacquire_interval=0.1,
                       watch_retry_interval=0.2)
    first = mgr.acquire()
    mgr.start()
    try:
        wait_until(lambda: mgr.watch_loop is not None and mgr.watch_loop.connected.is_set(),
                   what="the watch of our lease key")
        yield mgr, first, changes
    finally:
        mgr.stop()


def test_deleted_lease_reacquired_same_subnet(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    with _watched(reg) as (mgr, first, changes):
        reg.delete_lease(first.subnet)
        wait_until(lambda: changes, what="on_lease_change after delete")
        assert changes[0].subnet == first.subnet and changes[0].lease_id != first.lease_id
        assert held(reg) == {first.subnet: ip(1)}
        # And again: the watch follows the new lease.
        reg.revoke(changes[0].lease_id)        # the etcd lease expiring has the same effect
        wait_until(lambda: len(changes) == 2, what="second re-acquisition after revoke")
        assert changes[1].subnet == first.subnet and mgr.reacquisitions == 2


def test_lost_lease_taken_by_other_node_gets_new_subnet(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    with _watched(reg) as (mgr, first, changes):
        # Delete and hand our subnet to another node in one revision.
        reg.txn_put_delete({first.key: LeaseAttrs(ip(7)).to_json()})
        wait_until(lambda: changes, what="on_lease_change after takeover")
        assert changes[0].subnet != first.subnet
        owners = held(reg)
        assert owners[first.subnet] == ip(7) and owners[changes[0].subnet] == ip(1)


def test_renewal_retries_while_etcd_is_down(etcd, make_registry, caplog):
    reg = make_registry(etcd)
    mgr = LeaseManager(reg, ip(1), lease_ttl=4, renew_margin_s=3.0, retry_interval=0.3,
                      watch_retry_interval=0.3)
    first = mgr.acquire()
    mgr.start()
    try:
        etcd.kill()
        wait_until(lambda: mgr.renew_failures >= 2, timeout=8, what="a renewal failed and retried")
        said = [r for r in caplog.records if "Renewing our lease" in r.getMessage()]
        assert len(said) == 1 and said[0].levelname == "ERROR"        # said once, not per retry
        before = mgr.renewals
        etcd.start()
        wait_until(lambda: mgr.renewals > before + 1, timeout=8, what="renewals after etcd restart")
        assert mgr.lease.subnet == first.subnet
        assert held(reg) == {first.subnet: ip(1)}
    finally:
        mgr.stop()
