"""Dual stack without etcd: the config's IPv6 half, subnet.env's IPv6 lines, the free IPv6 subnets.

flanneld's facts (docs/flannel-compat.md#network-config, #subnet-env, #lease-acquisition): with
EnableIPv6 a lease has an IPv6 part of IPv6SubnetLen in [IPv6SubnetMin, IPv6SubnetMax], picked among
the first 100 free ones as the IPv4 subnet is; subnet.env then has FLANNEL_IPV6_NETWORK and
FLANNEL_IPV6_SUBNET (the part's network address + 1) right after FLANNEL_SUBNET.
"""
from __future__ import annotations

import json
import logging
import random
import time
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from dataplane.control.allocate import (OutOfSubnetsError, free_in_range, free_ipv6_subnets,
                                        free_subnets, ipv6_part, other_holder, pick_pair)
from dataplane.control.config import ConfigError, parse_config
from dataplane.control.lease import Lease, LeaseAttrs, with_ipv6_of_key
from dataplane.control.subnetfile import (format_subnet_env, previous_ipv6_subnet, previous_subnet,
                                          read_subnet_env, write_subnet_env)
from dataplane.host.family import Part

DUAL = '{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00:5::/48"}'
N, S = IPv4Network("10.5.0.0/16"), IPv4Network("10.5.84.0/24")
N6, S6 = IPv6Network("fc00:5::/48"), IPv6Network("fc00:5:0:54::/64")
ME, OTHER = IPv4Address("192.168.77.1"), IPv4Address("192.168.77.9")


def v6(i: int, plen: int = 64) -> IPv6Network:
    """The i-th /64 of fc00:5::/48 (or the network of that length around it)."""
    return IPv6Network((int(N6.network_address) + (i << 64), plen), strict=False)


def lease(subnet: str, six=None, ip=OTHER) -> Lease:
    return Lease(IPv4Network(subnet), LeaseAttrs(ip), ipv6_subnet=six)


# -- the config --------------------------------------------------------------------------------------

def test_enable_ipv6_parsed_with_flanneld_defaults_and_no_warning(caplog):
    caplog.set_level(logging.DEBUG)
    c = parse_config(DUAL)
    assert c.enable_ipv4 and c.enable_ipv6 and c.ipv6_network == N6 and c.ipv6_subnet_len == 64
    assert c.ipv6_subnet_min == IPv6Address("fc00:5:0:1::")        # the network's second subnet
    assert c.ipv6_subnet_max == IPv6Address("fc00:5:0:ffff::")     # its last
    assert "IPv6" not in caplog.text                                # the daemon says what it does


def test_ipv6_subnet_compatible_is_flanneld_is_ipv6_subnet_config_compat():
    c = parse_config('{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00:5::/48",'
                     '"IPv6SubnetMin":"fc00:5:0:10::","IPv6SubnetMax":"fc00:5:0:20::"}')
    assert c.ipv6_subnet_compatible(v6(0x10)) and c.ipv6_subnet_compatible(v6(0x20))
    assert not c.ipv6_subnet_compatible(None)                      # EnableIPv6 wants a part
    assert not c.ipv6_subnet_compatible(v6(0x0f)) and not c.ipv6_subnet_compatible(v6(0x21))
    assert not c.ipv6_subnet_compatible(v6(0x10, 56)) and not c.ipv6_subnet_compatible(v6(0x10, 80))
    v4 = parse_config('{"Network":"10.5.0.0/16"}')
    assert v4.ipv6_subnet_compatible(None) and not v4.ipv6_subnet_compatible(v6(0x10))


def test_ipv6_only_still_refused_and_dual_checks_the_ipv6_half():
    with pytest.raises(ConfigError, match="IPv6-only"):
        parse_config('{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00:5::/48"}')
    with pytest.raises(ConfigError, match="IPv6SubnetMin is not in the range of the IPv6Network"):
        parse_config(DUAL[:-1] + ',"IPv6SubnetMin":"fc00:6::"}')


# -- subnet.env ----------------------------------------------------------------------------------------

def test_format_writes_the_ipv6_lines_after_flannel_subnet_in_flanneld_order():
    text = format_subnet_env([Part(N, S), Part(N6, S6)], 1472, True)
    assert text == ("FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.84.1/24\n"
                    "FLANNEL_IPV6_NETWORK=fc00:5::/48\nFLANNEL_IPV6_SUBNET=fc00:5:0:54::1/64\n"
                    "FLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n")
    assert "IPV6" not in format_subnet_env([Part(N, S)], 1472, True)       # v4 only: as before
    assert "IPV6" not in format_subnet_env([Part(N, S), Part(N6, None)], 1472, True)  # no part
    with pytest.raises(ValueError, match="both"):
        format_subnet_env([Part(N, S), Part(None, S6)], 1472, True)


def test_ipv6_lines_written_and_read_back_as_the_previous_pair(tmp_path):
    p = str(tmp_path / "subnet.env")
    write_subnet_env(p, [Part(N, S), Part(N6, S6)], 1472, False)
    env = read_subnet_env(p)
    assert env["FLANNEL_IPV6_NETWORK"] == "fc00:5::/48"
    assert previous_subnet(env) == S and previous_ipv6_subnet(env) == S6


def test_no_ipv6_line_no_previous_ipv6_subnet(tmp_path):
    p = str(tmp_path / "subnet.env")
    write_subnet_env(p, [Part(N, S)], 1472, False)
    assert previous_ipv6_subnet(read_subnet_env(p)) is None
    assert previous_ipv6_subnet(None) is None


@pytest.mark.parametrize("name,value", [
    ("FLANNEL_IPV6_SUBNET", "10.5.84.1/24"),          # IPv4
    ("FLANNEL_IPV6_SUBNET", "fc00:5:0:54::1"),        # no length
    ("FLANNEL_IPV6_SUBNET", "fc00:zz::1/64"),
    ("FLANNEL_IPV6_NETWORK", "10.5.0.0/16"),
    ("FLANNEL_IPV6_NETWORK", "garbage"),
])
def test_a_bad_ipv6_line_is_dropped_with_a_warning_and_the_ipv4_kept(tmp_path, caplog, name, value):
    p = tmp_path / "subnet.env"
    good = {"FLANNEL_IPV6_NETWORK": "fc00:5::/48", "FLANNEL_IPV6_SUBNET": "fc00:5:0:54::1/64"}
    good[name] = value
    p.write_text("FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.84.1/24\n"
                 + "".join(f"{k}={v}\n" for k, v in good.items()) + "FLANNEL_MTU=1472\n")
    env = read_subnet_env(str(p))
    assert name not in env and previous_subnet(env) == S
    assert f"ignoring {name}=" in caplog.text
    other = "FLANNEL_IPV6_SUBNET" if name == "FLANNEL_IPV6_NETWORK" else "FLANNEL_IPV6_NETWORK"
    assert env[other] == good[other]                   # each line stands on its own
    assert previous_ipv6_subnet(env) == (S6 if name == "FLANNEL_IPV6_NETWORK" else None)


# -- free IPv6 subnets ---------------------------------------------------------------------------------

def test_first_100_free_ipv6_subnets_from_ipv6_subnet_min():
    c = parse_config(DUAL)
    free = free_ipv6_subnets(c, [])
    assert free == [v6(i) for i in range(1, 101)]
    taken = [v6(1), v6(3), v6(50)]
    free = free_ipv6_subnets(c, taken)
    assert len(free) == 100 and not set(taken) & set(free)
    assert free[:3] == [v6(2), v6(4), v6(5)] and free[-1] == v6(103)


def test_overlaps_of_other_lengths_are_taken():
    c = parse_config(DUAL)
    # a /56 covers 256 /64s (skipped at once), a /80 inside a /64 takes that /64, a /40 around the
    # whole network takes everything
    free = free_ipv6_subnets(c, [v6(0x100, 56), v6(2, 80)])
    assert v6(2) not in free and not any(f.subnet_of(v6(0x100, 56)) for f in free)
    assert free[:2] == [v6(1), v6(3)] and len(free) == 100 and free[-1] == v6(101)
    free = free_ipv6_subnets(c, [v6(1, 56)])           # fc00:5:0:1::/56 is fc00:5::/56
    assert free[0] == v6(0x100)
    assert free_ipv6_subnets(c, [IPv6Network("fc00::/16")]) == []


def _naive(family, first, last, plen, taken, limit=100):
    size = 1 << ((32 if family is IPv4Network else 128) - plen)
    out, cur = [], int(first)
    while cur <= int(last) and len(out) < limit:
        cand = family((cur, plen))
        if not any(cand.overlaps(t) for t in taken):
            out.append(cand)
        cur += size
    return out


@pytest.mark.parametrize("family,bits", [(IPv4Network, 32), (IPv6Network, 128)])
def test_the_jumping_walk_equals_flanneld_walk(family, bits):
    rng = random.Random(5)
    base = 0x0a050000 if bits == 32 else int(N6.network_address)
    for _ in range(200):
        plen = bits - rng.randint(4, 8)                      # subnets of 16..256 addresses
        size = 1 << (bits - plen)
        first, last = base + size, base + 60 * size
        taken = []
        for _ in range(rng.randint(0, 12)):
            tlen = plen + rng.randint(-3, 3)
            start = base + rng.randint(0, 64 * size)
            taken.append(family((start, tlen), strict=False))
        for limit in (1, 7, 100):
            assert free_in_range(family, first, last, plen, taken, limit) == \
                _naive(family, first, last, plen, taken, limit)


@pytest.mark.parametrize("family,bits", [(IPv4Network, 32), (IPv6Network, 128)])
def test_the_walk_over_runs_of_adjacent_leases_equals_flanneld_walk(family, bits):
    """Runs of adjacent and nested leases with gaps of one subnet or less between them: the
    walk joins a run into one step, and must neither join across a gap nor skip a free one."""
    rng = random.Random(7)
    base = 0x0a050000 if bits == 32 else int(N6.network_address)
    plen = bits - 8
    size = 1 << (bits - plen)
    for _ in range(40):
        taken, cur = [], base + rng.randint(0, 3) * size
        while cur < base + 200 * size:
            for _ in range(rng.randint(1, 20)):              # a run of adjacent leases
                tlen = plen + rng.choice((0, 0, 0, 1, -1))
                net = family((cur, tlen), strict=False)
                taken.append(net)
                if rng.random() < 0.2:                         # one inside it
                    taken.append(family((int(net.network_address), tlen + 1)))
                cur = int(net.broadcast_address) + 1
            cur += rng.choice((0, 1, size // 2, size, 2 * size))   # a gap, or none
        rng.shuffle(taken)
        first, last = base, base + 220 * size
        for limit in (1, 7, 100):
            assert free_in_range(family, first, last, plen, taken, limit) == \
                _naive(family, first, last, plen, taken, limit)


def test_thousands_of_leases_are_quick():
    c = parse_config('{"Network":"10.0.0.0/8","SubnetLen":24,"EnableIPv6":true,'
                     '"IPv6Network":"fc00:5::/32"}')
    taken4 = [IPv4Network((0x0a000000 + (i << 8), 24)) for i in range(1, 20001)]
    taken6 = [IPv6Network((int(IPv6Network("fc00:5::/32").network_address) + (i << 64), 64))
              for i in range(1, 20001)]
    t0 = time.perf_counter()
    assert free_subnets(c, taken4)[0] == IPv4Network("10.78.33.0/24")
    assert free_ipv6_subnets(c, taken6)[0] == IPv6Network("fc00:5:0:4e21::/64")
    assert time.perf_counter() - t0 < 1.0


def test_pick_pair_picks_each_part_independently_among_the_free():
    c = parse_config(DUAL)
    leases = [lease("10.5.1.0/24", v6(2)), lease("10.5.2.0/24", v6(1))]
    free4 = free_subnets(c, [IPv4Network(f"10.5.{i}.0/24") for i in (1, 2, 3)])
    free6 = free_ipv6_subnets(c, [v6(1), v6(2), v6(3)])
    picks = [pick_pair(c, leases, [IPv4Network("10.5.3.0/24"), v6(3)], random.Random(seed))
             for seed in range(60)]
    assert all(sn in free4 and sn6 in free6 for sn, sn6 in picks)
    assert len({sn for sn, _ in picks}) > 20 and len({sn6 for _, sn6 in picks}) > 20
    assert any(free4.index(sn) != free6.index(sn6) for sn, sn6 in picks)   # not one index for both
    v4only = parse_config('{"Network":"10.5.0.0/16"}')
    assert pick_pair(v4only, leases, [], random.Random(1))[1] is None


def test_out_of_ipv6_subnets_alone_is_out_of_subnets():
    c = parse_config(DUAL[:-1] + ',"IPv6SubnetMin":"fc00:5:0:1::","IPv6SubnetMax":"fc00:5:0:2::"}')
    leases = [lease("10.5.1.0/24", v6(1)), lease("10.5.2.0/24", v6(2))]    # IPv4 has 250 free
    with pytest.raises(OutOfSubnetsError, match=r"out of subnets: no free IPv6 /64 left in "
                                                r"fc00:5:0:1:: \.\.\. fc00:5:0:2::"):
        pick_pair(c, leases, [], random.Random(1))
    assert pick_pair(c, leases[:1], [], random.Random(1))[1] == v6(2)


def test_ipv6_part_keeps_a_fitting_free_part_else_picks_one():
    c = parse_config(DUAL)
    rng = random.Random(3)
    assert ipv6_part(parse_config('{"Network":"10.5.0.0/16"}'), [], v6(7), rng) is None
    assert ipv6_part(c, [lease("10.5.1.0/24", v6(8))], v6(7), rng) == v6(7)
    taken = [lease("10.5.1.0/24", v6(7, 56))]
    got = ipv6_part(c, taken, v6(7), rng)
    assert got is not None and got != v6(7) and not got.overlaps(v6(7, 56))
    for bad in (None, v6(9, 80), IPv6Network("fc00:6::/64")):
        got = ipv6_part(c, [], bad, rng)
        assert got != bad and c.ipv6_subnet_compatible(got)


def test_other_holder_names_overlaps_of_either_part_by_another_host():
    mine = IPv4Network("10.5.9.0/24")
    leases = [lease("10.5.9.0/24", v6(1), ip=ME), lease("10.5.10.0/24", v6(9))]
    assert other_holder(leases, ME, (mine, v6(5))) == ""
    assert "192.168.77.9" in other_holder(leases, ME, (mine, v6(9)))
    leases.append(lease("10.5.0.0/20", None))
    assert "192.168.77.9" in other_holder(leases, ME, mine)


def test_a_handed_over_lease_gets_the_ipv6_part_its_key_names():
    key = "/coreos.com/network/subnets/10.5.84.0-24&fc00:5:0:54::-64"
    l = Lease(S, LeaseAttrs(ME), key=key)
    assert with_ipv6_of_key(l).ipv6_subnet == S6
    plain = Lease(S, LeaseAttrs(ME), key="/coreos.com/network/subnets/10.5.84.0-24")
    assert with_ipv6_of_key(plain).ipv6_subnet is None
    assert with_ipv6_of_key(Lease(S, LeaseAttrs(ME))).ipv6_subnet is None


# -- the daemon's start --------------------------------------------------------------------------------

class _Opts:
    subnet_lease_renew_margin = 60

    def __init__(self, path):
        self.subnet_file = path


class _Ext:
    ext_addr = ME


def test_make_lease_manager_hands_subnet_envs_ipv6_part_over(tmp_path):
    from dataplane.daemon.startup import make_lease_manager
    p = str(tmp_path / "subnet.env")
    write_subnet_env(p, [Part(N, S), Part(N6, S6)], 1472, False)
    mgr = make_lease_manager(_Opts(p), object(), _Ext(), parse_config(DUAL), None)
    assert mgr.subnet_file_prev == {4: S, 6: S6}
    write_subnet_env(p, [Part(N, S)], 1472, False)
    mgr = make_lease_manager(_Opts(p), object(), _Ext(), parse_config(DUAL), None)
    assert mgr.subnet_file_prev == {4: S}


@pytest.mark.parametrize("six", [None, S6], ids=["v4-only", "dual"])
def test_a_dual_stack_lease_is_announced_without_a_warning(caplog, six):
    """IPv6 is forwarded now: the held part is said at info, and nothing warns."""
    from dataplane.daemon.startup import acquire_lease

    class Subnets:
        def acquire(self):
            return Lease(S, LeaseAttrs(ME), ipv6_subnet=six, expiration=time.time() + 60)

    caplog.set_level(logging.INFO)
    assert acquire_lease(Subnets(), object(), lambda s: None).ipv6_subnet == six
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    said = [r.getMessage() for r in caplog.records if "IPv6 part" in r.getMessage()]
    assert said == ([] if six is None else [f"Lease's IPv6 part: {S6}"])


def _ext(mtu):
    from types import SimpleNamespace
    return SimpleNamespace(name="eth0", mtu=mtu, tun_mtu=mtu - 28)


def test_ipv6_needs_1280_bytes_on_flannel0():
    from dataplane.daemon.startup import StartupError, check_ipv6
    check_ipv6(parse_config(DUAL), _ext(1308))
    check_ipv6(parse_config(json.dumps({"Network": "10.5.0.0/16"})), _ext(600))  # v4 only
    with pytest.raises(StartupError) as e:
        check_ipv6(parse_config(DUAL), _ext(1307))
    assert "flannel0's MTU would be 1279 (eth0 MTU 1307 - 28)" in str(e.value)
    assert "raise eth0's MTU to 1308" in str(e.value) and "remove EnableIPv6" in str(e.value)


def test_a_kernel_without_ipv6_is_a_clear_error(tmp_path, monkeypatch):
    from dataplane.daemon.startup import StartupError, check_ipv6
    from dataplane.host import netconf
    monkeypatch.setattr(netconf, "PROC_IPV6", str(tmp_path / "ipv6"))
    with pytest.raises(StartupError) as e:
        check_ipv6(parse_config(DUAL), _ext(1500))
    assert "this kernel has no IPv6" in str(e.value) and "ipv6.disable=1" in str(e.value)
    check_ipv6(parse_config(json.dumps({"Network": "10.5.0.0/16"})), _ext(1500))


def test_the_ipv6_underlay_is_chosen_at_start_or_said_why_not(caplog):
    """daemon/startup.py ipv6_underlay: (PublicIPv6, bind address, inner MTU) with EnableIPv6;
    each reason to run without it is one line, and a bad --public-ipv6 stops the start."""
    from types import SimpleNamespace
    from dataplane.daemon.startup import StartupError, ipv6_underlay
    from dataplane.host.iface import select_interface, StaticView, Link
    caplog.set_level(logging.INFO)
    opts = SimpleNamespace(public_ipv6="")
    dual, v4 = parse_config(DUAL), parse_config(json.dumps({"Network": "10.5.0.0/16"}))

    def ext(mtu, *addrs6):
        return select_interface(view=StaticView([Link("eth0", 2, mtu, ("10.0.0.5",), addrs6)], 2))

    assert ipv6_underlay(opts, dual, ext(1500, "fd00:99::5")) == (
        IPv6Address("fd00:99::5"), IPv6Address("fd00:99::5"), 1452)
    assert ipv6_underlay(opts, v4, ext(1500, "fd00:99::5")) is None
    assert ipv6_underlay(opts, dual, ext(1500, "fe80::5")) is None
    assert ipv6_underlay(opts, dual, ext(1327, "fd00:99::5")) is None        # 1279 inside
    assert ipv6_underlay(opts, dual, ext(1328, "fd00:99::5"))[2] == 1280
    said = [r.getMessage() for r in caplog.records]
    assert any("eth0 has no global IPv6 address and no --public-ipv6" in m for m in said), said
    assert any("MTU 1327 leaves 1279 bytes" in m for m in said), said
    opts.public_ipv6 = "2001:db8::9"         # NATed: written, the interface's own bound
    assert ipv6_underlay(opts, dual, ext(1500, "fd00:99::5"))[:2] == (
        IPv6Address("2001:db8::9"), IPv6Address("fd00:99::5"))
    assert ipv6_underlay(opts, dual, ext(1500)) is None
    assert any("is no address of eth0" in r.getMessage() for r in caplog.records)
    assert ipv6_underlay(opts, v4, ext(1500)) is None
    assert any("not used: the network config does not enable IPv6" in r.getMessage()
               for r in caplog.records)
    opts.public_ipv6 = "ff02::1"             # the flag parser refuses it; from elsewhere too
    with pytest.raises(StartupError, match="--public-ipv6 ff02::1 is not a global unicast"):
        ipv6_underlay(opts, dual, ext(1500))
