"""What a new daemon takes over (dataplane/daemon/inherited.py), no root: the state document,
its memfd, and the checks that decide between taking over and a fresh start."""
from __future__ import annotations

import json
import time
from dataclasses import replace
from ipaddress import IPv4Address, IPv4Interface, IPv4Network, IPv6Address, IPv6Network
from types import SimpleNamespace

import pytest

from dataplane.control.config import parse_config
from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.daemon import inherited
from dataplane.daemon.inherited import Observed, StateFile, kept_lease, mismatch
from dataplane.host.tun import IFF_MULTI_QUEUE, IFF_NO_PI, IFF_TUN, IFF_VNET_HDR

CONFIG = {"Network": "10.5.0.0/16", "Backend": {"Type": "udp"}}
SUBNET = IPv4Network("10.5.7.0/24")
EXT = SimpleNamespace(name="eth1", iface_addr=IPv4Address("192.168.1.5"),
                      ext_addr=IPv4Address("192.168.1.5"), tun_mtu=1472)


def _lease(**kw) -> Lease:
    fields = dict(subnet=SUBNET, attrs=LeaseAttrs(public_ip=EXT.ext_addr),
                  expiration=time.time() + 86400, lease_id=0x1234, mod_revision=17,
                  key="/coreos.com/network/subnets/10.5.7.0-24")
    fields.update(kw)
    return Lease(**fields)


def _state(queues: int = 2, vnet: bool = True, config=None) -> dict:
    return {"version": inherited.STATE_VERSION, "pid": 4242, "engine": "c",
            "tun": {"name": "flannel0", "queues": queues, "vnet": vnet},
            "udp": {"addr": str(EXT.iface_addr), "port": 8285}, "mtu": 1472,
            "config": config or CONFIG, "lease": inherited.lease_json(_lease()),
            "peers": [["10.5.9.0/24", "192.168.1.9"]]}


def _observed(queues: int = 2, vnet: bool = True, **kw) -> Observed:
    flags = IFF_TUN | IFF_NO_PI | (IFF_VNET_HDR if vnet else 0) | \
        (IFF_MULTI_QUEUE if queues > 1 else 0)
    obs = Observed(tun=[("flannel0", flags)] * queues, mtu=1472,
                   addrs=[IPv4Interface("10.5.7.0/32")],
                   udp=[(str(EXT.iface_addr), 8285)] * queues)
    for k, v in kw.items():
        setattr(obs, k, v)
    return obs


def _why(state=None, obs=None, *, queues=2, vnet=True, config=None, lease=None):
    return mismatch(state or _state(), obs or _observed(), ext=EXT,
                    config=parse_config(json.dumps(config or CONFIG)), lease=lease or _lease(),
                    queues=queues, vnet=vnet)


def test_the_same_setup_is_taken_over():
    assert _why() is None
    assert _why(_state(queues=1, vnet=False), _observed(queues=1, vnet=False), queues=1,
                vnet=False) is None


@pytest.mark.parametrize("change,reason", [
    (dict(queues=1), "flannel0 has 2 queue(s) and 2 socket(s); this daemon runs 1 queue(s)"),
    (dict(vnet=False), "opened with vnet headers and this daemon runs without offloads"),
    (dict(config={"Network": "10.6.0.0/16", "Backend": {"Type": "udp"}}),
     "the network config changed (Network 10.5.0.0/16 -> 10.6.0.0/16"),
    (dict(config={"Network": "10.5.0.0/16", "Backend": {"Type": "udp", "Port": 8300}}),
     "port 8285 -> 8300"),
    (dict(lease=_lease(subnet=IPv4Network("10.5.8.0/24"))),
     "has the address(es) 10.5.7.0/32, not 10.5.8.0/32 of the lease 10.5.8.0/24"),
])
def test_what_this_daemon_would_set_up_otherwise_is_not(change, reason):
    why = _why(**change)
    assert why is not None and reason in why, why


@pytest.mark.parametrize("obs,reason", [
    (_observed(mtu=1400), "flannel0 has MTU 1400, this daemon would set 1472 (eth1 - 28)"),
    (_observed(tun=[("flannel0", IFF_TUN | IFF_VNET_HDR | IFF_MULTI_QUEUE),
                    OSError(77, "File descriptor in bad state")]),
     "a flannel0 queue has no device any more (File descriptor in bad state)"),
    (_observed(tun=[("flannel1", IFF_TUN | IFF_VNET_HDR | IFF_MULTI_QUEUE)] * 2),
     "a queue belongs to flannel1, not to flannel0"),
    (_observed(udp=[("192.168.1.5", 8285), ("0.0.0.0", 8285)]),
     "a UDP socket is bound to 0.0.0.0:8285, this daemon would bind 192.168.1.5:8285"),
    (_observed(queues=2, vnet=True, tun=[("flannel0", IFF_TUN | IFF_VNET_HDR)] * 2),
     "flannel0 is not a multi-queue device"),
])
def test_what_the_kernel_reports_must_match(obs, reason):
    why = _why(obs=obs)
    assert why is not None and reason in why, why


def test_a_state_of_another_version_is_not_read():
    assert "version 99" in _why(dict(_state(), version=99))


def test_the_lease_is_kept_while_it_is_valid():
    lease, why = kept_lease(_state(), EXT, parse_config(json.dumps(CONFIG)))
    assert why == "" and lease == _lease(expiration=lease.expiration)
    assert lease.key.endswith("10.5.7.0-24") and lease.lease_id == 0x1234


@pytest.mark.parametrize("lease,reason", [
    (_lease(expiration=time.time() + 10), "expires in less than 60 s"),
    (_lease(attrs=LeaseAttrs(public_ip=IPv4Address("192.168.1.6"))),
     "the lease is for PublicIP 192.168.1.6, this host is 192.168.1.5"),
    (_lease(subnet=IPv4Network("10.6.1.0/24")), "does not fit the network config"),
])
def test_a_lease_that_cannot_be_kept_is_acquired_again(lease, reason):
    state = dict(_state(), lease=inherited.lease_json(lease))
    got, why = kept_lease(state, EXT, parse_config(json.dumps(CONFIG)))
    assert got is None and reason in why


def test_a_reservation_is_kept_without_expiry():
    state = dict(_state(), lease=inherited.lease_json(_lease(expiration=None, lease_id=0)))
    lease, why = kept_lease(state, EXT, parse_config(json.dumps(CONFIG)))
    assert why == "" and lease.reservation


def test_peers_come_back_as_leases():
    assert inherited.peers_of(_state()) == [
        Lease(subnet=IPv4Network("10.5.9.0/24"),
              attrs=LeaseAttrs(public_ip=IPv4Address("192.168.1.9")))]
    # with their IPv6 parts and PublicIPv6s: the engine routes over the IPv6 underlay at once
    state = dict(_state(), peers6=[["10.5.9.0/24", "fc00:5:0:9::/64"]],
                 peers_public_ipv6=[["10.5.9.0/24", "fd00:99::9"]])
    assert inherited.peers_of(state) == [
        Lease(subnet=IPv4Network("10.5.9.0/24"),
              attrs=LeaseAttrs(public_ip=IPv4Address("192.168.1.9"), forwards_ipv6=True,
                               public_ipv6=IPv6Address("fd00:99::9")),
              ipv6_subnet=IPv6Network("fc00:5:0:9::/64"))]


def test_ipv6_parts_of_peers_whose_ipv4_goes_direct_come_back_for_the_engine():
    """The engine routes every peer's IPv6 part, DirectRouting or not: "peers6_via" has the
    PublicIPs of those not in "peers" (their IPv4 goes direct), which a daemon reading
    "peers" alone (an older one) leaves out."""
    state = dict(_state(), peers=[["10.5.9.0/24", "192.168.1.9"]],
                 peers6=[["10.5.9.0/24", "fc00:5:0:9::/64"], ["10.5.8.0/24", "fc00:5:0:8::/64"]],
                 peers6_via=[["10.5.8.0/24", "192.168.1.8"]])
    v4 = inherited.peers_of(state)
    assert [(str(l.subnet), str(l.ipv6_subnet)) for l in v4] == [("10.5.9.0/24", "fc00:5:0:9::/64")]
    v6 = inherited.peers_of(state, ipv6=True)
    assert sorted((str(l.subnet), str(l.public_ip), str(l.ipv6_subnet), l.attrs.forwards_ipv6)
                  for l in v6) == [("10.5.8.0/24", "192.168.1.8", "fc00:5:0:8::/64", True),
                                   ("10.5.9.0/24", "192.168.1.9", "fc00:5:0:9::/64", True)]
    # a state written before "peers6_via": the parts of "peers"
    old = dict(state)
    del old["peers6_via"]
    assert [str(l.subnet) for l in inherited.peers_of(old, ipv6=True)] == ["10.5.9.0/24"]


def test_state_file_is_rewritten_in_place():
    sf = StateFile.create()
    try:
        sf.write({"version": 1, "peers": [["10.5.%d.0/24" % i, "192.168.1.1"] for i in range(50)]})
        fd = sf.fd
        sf.write({"version": 1, "peers": []})          # shorter: the rest is cut
        assert sf.read() == {"version": 1, "peers": []} and sf.fd == fd
    finally:
        sf.close()


def test_state_file_reads_a_document_a_kill_left_uncut():
    """Killed between the write and the cut: the new document, then the old one's tail."""
    import os
    sf = StateFile.create()
    try:
        os.write(sf.fd, json.dumps({"version": 1, "pid": 1, "peers": [1, 2, 3, 4]}).encode())
        os.pwrite(sf.fd, json.dumps({"version": 1, "pid": 2}).encode() + b"\n", 0)
        assert sf.read() == {"version": 1, "pid": 2}
    finally:
        sf.close()


DUAL_CONFIG = dict(CONFIG, EnableIPv6=True, IPv6Network="fc00:5::/48")
DUAL_LEASE = dict(ipv6_subnet=IPv6Network("fc00:5:0:7::/64"),
                  key="/coreos.com/network/subnets/10.5.7.0-24&fc00:5:0:7::-64")


def test_a_dual_stack_lease_is_handed_over_with_its_ipv6_part():
    state = dict(_state(config=DUAL_CONFIG), lease=inherited.lease_json(_lease(**DUAL_LEASE)))
    lease, why = kept_lease(state, EXT, parse_config(json.dumps(DUAL_CONFIG)))
    assert why == "" and lease.ipv6_subnet == IPv6Network("fc00:5:0:7::/64")
    assert lease.attrs.public_ipv6 is None
    # the value's PublicIPv6 comes along (the lease manager rewrites a value that differs)
    with_pub6 = replace(_lease(**DUAL_LEASE), attrs=LeaseAttrs(
        _lease(**DUAL_LEASE).public_ip, public_ipv6=IPv6Address("fd00:99::1")))
    state["lease"] = inherited.lease_json(with_pub6)
    lease, _ = kept_lease(state, EXT, parse_config(json.dumps(DUAL_CONFIG)))
    assert lease.attrs.public_ipv6 == IPv6Address("fd00:99::1")


def test_a_state_from_before_dual_stack_takes_the_ipv6_part_from_the_key():
    doc = inherited.lease_json(_lease(**DUAL_LEASE))
    del doc["ipv6_subnet"]
    assert inherited.lease_of_json(doc).ipv6_subnet == IPv6Network("fc00:5:0:7::/64")


@pytest.mark.parametrize("config,lease,reason", [
    (DUAL_CONFIG, {}, "IPv6 part (none) does not fit the network config (EnableIPv6 on)"),
    (CONFIG, DUAL_LEASE, "IPv6 part (fc00:5:0:7::/64) does not fit the network config "
                         "(EnableIPv6 off)"),
], ids=["switched-on", "switched-off"])
def test_a_lease_whose_ipv6_part_no_longer_fits_is_acquired_again(config, lease, reason):
    state = dict(_state(config=config), lease=inherited.lease_json(_lease(**lease)))
    got, why = kept_lease(state, EXT, parse_config(json.dumps(config)))
    assert got is None and reason in why
