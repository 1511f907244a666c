"""Dual-stack leases against a real etcd (docs/flannel-compat.md#lease-acquisition).

With EnableIPv6 a host holds one key for both families, `10.5.1.0-24&fc00:5:0:1::-64`, whose value is
the udp backend's usual `{"PublicIP":...,"PublicIPv6":null}`: flanneld v0.20.2 panics at its start on
a key without an IPv6 part in such a cluster. Where flanneld would give up a host's IPv4 subnet
because only the IPv6 part does not fit, flannel-udp keeps the IPv4 subnet under a key of the new
shape (a deliberate difference).
"""
from __future__ import annotations

import contextlib
import logging
import re
import time
from dataclasses import replace
from ipaddress import IPv4Address, IPv4Network, IPv6Network

import pytest

from dataplane.control.lease import LeaseAttrs
from dataplane.control.lease_manager import LeaseManager, OutOfSubnetsError
from dataplane.control.registry import SUBNET_TTL
from dataplane.control.subnetfile import (previous_ipv6_subnet, previous_subnet, read_subnet_env,
                                          write_subnet_env)
from dataplane.host.family import Part
from tests.conftest import wait_until
from tests.integration.test_subnets import _watched, ip

pytestmark = pytest.mark.etcd
ME, OTHER = IPv4Address("192.168.77.1"), IPv4Address("192.168.77.9")
OURS = b'{"PublicIP":"192.168.77.1","PublicIPv6":null}'
MINE = IPv4Network("10.5.200.0/24")
N6 = IPv6Network("fc00:5::/48")
DUAL = '{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00:5::/48","Backend":{"Type":"udp"}}'
V4 = '{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}'


def v6(i: int, plen: int = 64) -> IPv6Network:
    return IPv6Network((int(N6.network_address) + (i << 64), plen))


def dual(**more) -> str:
    """The dual-stack config with more keys, e.g. dual(IPv6SubnetMax="fc00:5:0:8::")."""
    return DUAL[:-1] + "".join(f',"{k}":"{v}"' for k, v in more.items()) + "}"


def keys(reg) -> dict:
    """Every key under subnets/ (its last component) -> value."""
    kvs, _ = reg.get(reg.subnets_prefix, prefix=True)
    return {kv.key.decode().rsplit("/", 1)[-1]: kv.value for kv in kvs}


def stage(reg, subnet, six, public_ip=ME, reserved=False):
    """A key of ours or another host's, as another flannel would have left it."""
    lease_id = 0 if reserved else reg.grant(600)
    reg.put(reg.lease_key((subnet, six)), LeaseAttrs(public_ip).to_json(), lease_id=lease_id)


def name(subnet, six=None) -> str:
    return f"{subnet.network_address}-{subnet.prefixlen}" + (
        f"&{six.network_address}-{six.prefixlen}" if six is not None else "")


def test_allocation_is_one_dual_key_with_flanneld_value_and_ttl(shared_etcd, make_registry):
    reg = make_registry(shared_etcd, config=DUAL)
    lease = LeaseManager(reg, ME).acquire()
    assert lease.ipv6_subnet is not None and lease.ipv6_subnet.subnet_of(N6)
    assert lease.ipv6_subnet.prefixlen == 64 and lease.ipv6_subnet != v6(0)
    assert re.fullmatch(re.escape(reg.subnets_prefix) + r"10\.5\.\d+\.0-24&fc00:5:0:[0-9a-f]+::-64",
                        lease.key)
    assert keys(reg) == {name(lease.subnet, lease.ipv6_subnet): OURS}
    kv = reg.get(lease.key)[0][0]
    assert SUBNET_TTL - 10 <= reg.time_to_live(kv.lease) <= SUBNET_TTL
    listed, _ = reg.list_leases()
    assert [(l.subnet, l.ipv6_subnet) for l in listed] == [(lease.subnet, lease.ipv6_subnet)]


def test_own_dual_key_reused_by_public_ip(shared_etcd, make_registry):
    reg = make_registry(shared_etcd, config=DUAL)
    stage(reg, MINE, v6(0x77))
    old_id = reg.get(reg.lease_key((MINE, v6(0x77))))[0][0].lease
    lease = LeaseManager(reg, ME, subnet_file_prev=IPv4Network("10.5.7.0/24")).acquire()
    assert (lease.subnet, lease.ipv6_subnet) == (MINE, v6(0x77)) and lease.lease_id != old_id
    assert keys(reg) == {name(MINE, v6(0x77)): OURS}


@pytest.mark.parametrize("reserved", [False, True], ids=["leased", "reserved"])
def test_v4_only_key_with_enable_ipv6_keeps_its_subnet_and_gains_an_ipv6_part(
        shared_etcd, make_registry, reserved):
    reg = make_registry(shared_etcd, config=DUAL)
    stage(reg, MINE, None, reserved=reserved)
    stage(reg, IPv4Network("10.5.1.0/24"), v6(1), public_ip=OTHER)
    lease = LeaseManager(reg, ME).acquire()
    assert lease.subnet == MINE and lease.ipv6_subnet not in (None, v6(1))
    assert lease.reservation == reserved               # an operator's reservation stays one
    assert keys(reg) == {name(MINE, lease.ipv6_subnet): OURS,
                         name(IPv4Network("10.5.1.0/24"), v6(1)): LeaseAttrs(OTHER).to_json()}


def test_dual_key_with_enable_ipv6_off_keeps_its_subnet_and_loses_the_ipv6_part(
        shared_etcd, make_registry):
    reg = make_registry(shared_etcd, config=V4)
    stage(reg, MINE, v6(0x77))
    lease = LeaseManager(reg, ME).acquire()
    assert (lease.subnet, lease.ipv6_subnet) == (MINE, None)
    assert keys(reg) == {name(MINE): OURS}


@pytest.mark.parametrize("six", [IPv6Network("fc00:6:0:1::/64"), v6(0x5), v6(0x10, 60), v6(0x10, 80)],
                         ids=["outside-network", "below-min", "shorter", "longer"])
def test_ipv6_part_that_does_not_fit_is_replaced_and_the_subnet_kept(shared_etcd, make_registry, six):
    reg = make_registry(shared_etcd, config=dual(IPv6SubnetMin="fc00:5:0:10::",
                                                 IPv6SubnetMax="fc00:5:0:20::"))
    stage(reg, MINE, six)
    lease = LeaseManager(reg, ME).acquire()
    assert lease.subnet == MINE and lease.ipv6_subnet != six
    assert v6(0x10) <= lease.ipv6_subnet <= v6(0x20)
    assert keys(reg) == {name(MINE, lease.ipv6_subnet): OURS}


def _subnet_env(tmp_path, subnet, six):
    p = str(tmp_path / "subnet.env")
    write_subnet_env(p, [Part(IPv4Network("10.5.0.0/16"), subnet), Part(N6, six)], 1472, False)
    env = read_subnet_env(p)
    return previous_subnet(env), previous_ipv6_subnet(env)


def test_previous_pair_from_subnet_env_reused(shared_etcd, make_registry, tmp_path):
    reg = make_registry(shared_etcd, config=DUAL)
    prev, prev6 = _subnet_env(tmp_path, IPv4Network("10.5.7.0/24"), v6(0x77))
    lease = LeaseManager(reg, ME, (prev, prev6)).acquire()
    assert (lease.subnet, lease.ipv6_subnet) == (IPv4Network("10.5.7.0/24"), v6(0x77))
    assert keys(reg) == {name(lease.subnet, v6(0x77)): OURS}


def test_previous_subnet_kept_when_its_ipv6_part_is_anothers(shared_etcd, make_registry, tmp_path):
    reg = make_registry(shared_etcd, config=DUAL)
    stage(reg, IPv4Network("10.5.1.0/24"), v6(0x70, 60), public_ip=OTHER)
    prev, prev6 = _subnet_env(tmp_path, IPv4Network("10.5.7.0/24"), v6(0x77))
    lease = LeaseManager(reg, ME, (prev, prev6)).acquire()
    assert lease.subnet == prev and not lease.ipv6_subnet.overlaps(v6(0x70, 60))


def test_ipv6_pick_avoids_every_other_leases_ipv6_part(shared_etcd, make_registry):
    reg = make_registry(shared_etcd, config=dual(IPv6SubnetMax="fc00:5:0:8::"))
    # others hold 1, 2, 3 and (as one /62) 4..7: only fc00:5:0:8::/64 is left
    for i, six in enumerate([v6(1), v6(2), v6(3), v6(4, 62)], 1):
        stage(reg, IPv4Network(f"10.5.{i}.0/24"), six, public_ip=ip(100 + i))
    lease = LeaseManager(reg, ME).acquire()
    assert lease.ipv6_subnet == v6(8)
    assert lease.subnet not in {IPv4Network(f"10.5.{i}.0/24") for i in range(1, 5)}
    with pytest.raises(OutOfSubnetsError, match="no free IPv6 /64"):
        LeaseManager(reg, OTHER).acquire()           # IPv4 has hundreds free, IPv6 none


def test_deleted_dual_key_taken_back_as_the_same_key(shared_etcd, make_registry):
    reg = make_registry(shared_etcd, config=DUAL)
    with _watched(reg) as (mgr, first, changes):
        reg.delete_lease(first.subnets)
        wait_until(lambda: changes, what="on_lease_change after delete")
        assert (changes[0].subnet, changes[0].ipv6_subnet) == (first.subnet, first.ipv6_subnet)
        assert changes[0].key == first.key and changes[0].lease_id != first.lease_id
        assert keys(reg) == {name(first.subnet, first.ipv6_subnet): LeaseAttrs(ip(1)).to_json()}


def test_subnet_taken_under_another_key_meanwhile_is_not_taken_back(shared_etcd, make_registry):
    reg = make_registry(shared_etcd, config=DUAL)
    with _watched(reg) as (mgr, first, changes):
        # another host got our subnet with another IPv6 part while our key was gone: creating
        # ours again would succeed (another key) and give the subnet to two hosts
        rival = v6(0xfff0)
        stage(reg, first.subnet, rival, public_ip=OTHER)
        reg.delete_lease(first.subnets)
        wait_until(lambda: changes, what="on_lease_change after delete")
        assert changes[0].subnet != first.subnet and changes[0].ipv6_subnet not in (None, rival)
        assert set(keys(reg)) == {name(first.subnet, rival),
                                  name(changes[0].subnet, changes[0].ipv6_subnet)}


@pytest.mark.parametrize("handed_over", [False, True], ids=["acquired", "handed-over"])
def test_renewal_keeps_the_dual_key(shared_etcd, make_registry, handed_over):
    reg = make_registry(shared_etcd, config=DUAL)
    mgr = LeaseManager(reg, ME, lease_ttl=3, renew_margin_s=2.0, retry_interval=0.2)
    first = mgr.acquire()
    if handed_over:        # daemon/inherited.py's state carries the key, not the IPv6 part
        mgr.adopt(replace(first, ipv6_subnet=None))
    mgr.start()
    try:
        wait_until(lambda: mgr.renewals >= 2, timeout=8, what="two renewals")
        assert (mgr.lease.subnet, mgr.lease.ipv6_subnet) == (first.subnet, first.ipv6_subnet)
        assert keys(reg) == {name(first.subnet, first.ipv6_subnet): OURS}
        assert reg.get(first.key)[0][0].lease not in (0, first.lease_id)
    finally:
        mgr.stop()


def test_public_ipv6_is_written_and_an_adopted_value_without_it_rewritten(shared_etcd,
                                                                          make_registry):
    """The IPv6 underlay's address is the value's PublicIPv6 (with EnableIPv6 only); a lease
    handed over whose value says another (an older daemon's: none) is rewritten as the lease
    manager starts, not at the renewal 23 h later."""
    reg = make_registry(shared_etcd, config=DUAL)
    pub6 = "fd00:99::1"
    mgr = LeaseManager(reg, (ME, pub6), config=reg.get_config())     # 24 h
    first = mgr.acquire()
    value = b'{"PublicIP":"192.168.77.1","PublicIPv6":"fd00:99::1","ForwardsIPv6":true}'
    assert keys(reg) == {name(first.subnet, first.ipv6_subnet): value}
    # a daemon of an older version wrote it without; ours takes it over
    first = reg.renew_lease(first.subnets, LeaseAttrs(ME, forwards_ipv6=True), SUBNET_TTL)
    mgr = LeaseManager(reg, (ME, pub6), config=reg.get_config())
    mgr.adopt(replace(first, attrs=LeaseAttrs(ME)))
    mgr.start()
    try:
        wait_until(lambda: keys(reg) == {name(first.subnet, first.ipv6_subnet): value},
                   timeout=5, what="the value rewritten with PublicIPv6")
    finally:
        mgr.stop()
    # without EnableIPv6 none is written
    v4 = LeaseManager(reg, (ME, pub6), config=make_registry(shared_etcd, config=V4)
                      .get_config())
    assert v4.attrs.public_ipv6 is None


def test_v4_only_host_beside_dual_stack_hosts(shared_etcd, make_registry):
    reg = make_registry(shared_etcd, config='{"Network":"10.5.0.0/16","SubnetMin":"10.5.1.0",'
                                            '"SubnetMax":"10.5.4.0"}')
    for i in (1, 2, 4):
        stage(reg, IPv4Network(f"10.5.{i}.0/24"), v6(i), public_ip=ip(100 + i))
    lease = LeaseManager(reg, ME).acquire()
    assert (lease.subnet, lease.ipv6_subnet) == (IPv4Network("10.5.3.0/24"), None)
    assert keys(reg)[name(lease.subnet)] == OURS and len(keys(reg)) == 4
    # and it finds its own v4-only key among them again
    assert LeaseManager(reg, ME).acquire().key == lease.key


@pytest.mark.parametrize("rival_parts", ["same-ipv4", "same-ipv6"])
def test_second_creator_of_an_overlapping_dual_key_gives_it_up(shared_etcd, make_registry,
                                                                rival_parts):
    """Two hosts that list at once and pick the same IPv4 subnet with other IPv6 parts (or the
    reverse) both create their keys: the create-if-absent of a dual key guards neither part. The
    later creator sees the earlier key after its create, deletes its own and picks again."""
    reg = make_registry(shared_etcd, config=dual(SubnetMin="10.5.200.0", SubnetMax="10.5.202.0",
                                                 IPv6SubnetMin="fc00:5:0:1::",
                                                 IPv6SubnetMax="fc00:5:0:3::"))
    # the rival got there first, with a key whose other part differs from our pick
    rival = ((MINE, v6(2)) if rival_parts == "same-ipv4" else (IPv4Network("10.5.201.0/24"), v6(1)))
    stage(reg, *rival, public_ip=OTHER)
    real = reg.list_leases
    calls = []

    def stale_first(*a, **kw):                  # our first listing predates the rival's create
        calls.append(1)
        leases, rev = real(*a, **kw)
        return ([l for l in leases if l.attrs.public_ip != OTHER] if len(calls) == 1 else leases), rev
    reg.list_leases = stale_first

    class Pick:                                 # the rng picks 10.5.200.0/24 and v6(1) first
        def choice(self, seq):
            seq = list(seq)
            for x in seq:
                if x in (MINE, v6(1)):
                    return x
            return seq[0]

        def randrange(self, n):
            return 0
    mgr = LeaseManager(reg, ME)
    mgr._rng = Pick()
    lease = mgr.acquire()
    assert lease.subnet != rival[0] and lease.ipv6_subnet != rival[1], lease
    assert set(keys(reg)) == {name(*rival), name(lease.subnet, lease.ipv6_subnet)}
    assert mgr.races_lost == 1


def _hide_others(reg, listings: int) -> None:
    """The next `listings` of reg's leases miss OTHER's keys: they predate its create."""
    real, left = reg.list_leases, [listings]

    def listing(*a, **kw):
        leases, rev = real(*a, **kw)
        if left[0] > 0:
            left[0] -= 1
            leases = [l for l in leases if l.attrs.public_ip != OTHER]
        return leases, rev
    reg.list_leases = listing


@pytest.mark.parametrize("rival_parts", ["same-ipv4", "same-ipv6"])
@pytest.mark.parametrize("how", ["subnet.env", "lost key", "new key shape"])
def test_take_back_of_a_dual_key_gives_it_up_to_an_earlier_overlapping_key(
        shared_etcd, make_registry, tmp_path, how, rival_parts):
    """A host takes its dual-stack key back (subnet.env's pair at start, or its key lost while
    running): it lists, finds the subnet free and creates its key, while another host creates a
    key of another shape with one part the same between that list and that create. The create-if-
    absent of either key cannot see the other, so the taker looks after its create, as an
    allocation does, and the later key goes: ours moves to a pair of its own. The same for our
    IPv4-only key given an IPv6 part (a key of the new shape for the same subnet). A rival of
    our IPv6 part alone takes only that: our IPv4 subnet, where the workloads are, is kept."""
    reg = make_registry(shared_etcd, config=DUAL)
    with contextlib.ExitStack() as running:
        if how != "lost key":
            mine = (IPv4Network("10.5.7.0/24"), v6(0x77))
        else:
            _, first, changes = running.enter_context(_watched(reg))
            mine = (first.subnet, first.ipv6_subnet)
        other4 = IPv4Network("10.5.202.0/24" if mine[0] == IPv4Network("10.5.201.0/24")
                             else "10.5.201.0/24")
        rival = (mine[0], v6(0x7f)) if rival_parts == "same-ipv4" else (other4, mine[1])
        stage(reg, *rival, public_ip=OTHER)
        if how == "subnet.env":
            _hide_others(reg, 2)        # _acquire's listing and the take-back's
            prev, prev6 = _subnet_env(tmp_path, *mine)
            lease = LeaseManager(reg, ME, (prev, prev6)).acquire()
        elif how == "new key shape":
            stage(reg, mine[0], None)
            _hide_others(reg, 2)        # _acquire's listing and the reshape's
            lease = LeaseManager(reg, ME, (None, mine[1])).acquire()
        else:
            _hide_others(reg, 1)        # the take-back's
            reg.delete_lease(mine)
            wait_until(lambda: changes, what="on_lease_change after delete")
            lease = changes[0]
        assert not lease.subnet.overlaps(rival[0]) and not lease.ipv6_subnet.overlaps(rival[1])
        assert set(keys(reg)) == {name(*rival), name(lease.subnet, lease.ipv6_subnet)}
        if rival_parts == "same-ipv6":   # the IPv4 subnet kept, however the key was taken
            assert lease.subnet == mine[0]


@pytest.mark.parametrize("rival_parts", ["same-ipv4", "same-ipv6"])
def test_renewal_that_recreates_a_vanished_dual_key_yields_to_an_earlier_overlapping_key(
        shared_etcd, make_registry, rival_parts, caplog):
    """A renewal finds our dual key gone (deleted, expired) before the watch of it said so, and
    puts it again: a create, which no transaction guards against another host's key made
    meanwhile with one part the same. It looks after its write as a take-back does and yields:
    the host moves (its IPv6 part alone when only that is the other's), says so as the outage
    it is, and goes on with the new lease."""
    reg = make_registry(shared_etcd, config=DUAL)
    changes: list = []
    mgr = LeaseManager(reg, ME, on_lease_change=changes.append, reacquire_interval=0.1,
                       watch_retry_interval=0.2)
    first = mgr.acquire()
    reg.delete_lease(first.subnets)
    other4 = IPv4Network("10.5.202.0/24" if first.subnet == IPv4Network("10.5.201.0/24")
                         else "10.5.201.0/24")
    rival = ((first.subnet, v6(0x7f)) if rival_parts == "same-ipv4"
             else (other4, first.ipv6_subnet))
    stage(reg, *rival, public_ip=OTHER)
    # the watch starts after the delete, as one that missed it; the renewal is due at once
    mgr.adopt(replace(first, mod_revision=reg.current_revision(), expiration=time.time()))
    with caplog.at_level(logging.INFO, logger="dataplane.control.lease_manager"):
        mgr.start()
        try:
            wait_until(lambda: changes or mgr.renewals, timeout=10, what="the renewal's outcome")
            assert changes, f"renewed beside {name(*rival)}: {sorted(keys(reg))}"
            lease = changes[0]
            assert not lease.subnet.overlaps(rival[0]) and not lease.ipv6_subnet.overlaps(rival[1])
            assert set(keys(reg)) == {name(*rival), name(lease.subnet, lease.ipv6_subnet)}
            assert mgr.lease == lease
            assert (lease.subnet == first.subnet) == (rival_parts == "same-ipv6")
        finally:
            mgr.stop()
    said = caplog.text
    assert f"overlaps {reg.lease_key(rival)}, created just before ours" \
        in said
    assert f"Lease {first.subnet} is now held by another host (PublicIP {OTHER}, key " in said
    gone = first.subnet if rival_parts == "same-ipv4" else first.ipv6_subnet
    assert (f"was {first.subnet} (ipv6: {first.ipv6_subnet}). That is an outage for this host's "
            f"workloads with addresses in {gone}" in said and "until the workloads are restarted"
            in said), said
