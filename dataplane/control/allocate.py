"""Free subnets and the random pick among them, as flanneld's `allocateSubnet` chooses (no I/O).

flanneld walks the subnets of SubnetLen from SubnetMin to SubnetMax, keeps the first 100 that overlap
no lease's subnet, and picks one uniformly; with EnableIPv6 it does the same, independently, for the
IPv6 part (IPv6SubnetLen from IPv6SubnetMin to IPv6SubnetMax, against the leases' IPv6 parts), and
either list empty is "out of subnets" (docs/flannel-compat.md#lease-acquisition).

The walk here gives the same list, but jumps over a taken range in one step: an IPv6 range holds
billions of subnets, a lease of a shorter prefix covers thousands of candidates, and the list is
taken from thousands of leases.
"""
from __future__ import annotations

import logging
import random
from itertools import accumulate, compress, repeat
from operator import add, gt
from ipaddress import IPv4Address, IPv4Network, IPv6Network
from typing import Iterable, Optional

from .config import NetworkConfig
from .lease import Lease, split_parts

log = logging.getLogger(__name__)

MAX_FREE_CANDIDATES = 100


class SubnetError(RuntimeError):
    """No lease could be acquired."""


class OutOfSubnetsError(SubnetError):
    pass


def free_in_range(family: type, first, last, prefixlen: int, taken: Iterable,
                  limit: int = MAX_FREE_CANDIDATES) -> list:
    """The first `limit` networks of `family` (IPv4Network or IPv6Network) and `prefixlen`, from
    `first` to `last` (network addresses on that length's boundary), overlapping none of `taken`."""
    width = 32 if family is IPv4Network else 128
    size = 1 << (width - prefixlen)
    # Each taken network as its address and length, from ipaddress's own fields (int() and
    # .prefixlen are a Python call each, and the broadcast address an object it keeps: a
    # start's listing has 16,000), then joined into runs of taken addresses, in C calls (a
    # running max of the ends; a run begins where a start lies past all before it reach):
    # the walk below then passes 16,000 adjacent leases in one step, not one each
    # (perf/README.md#start-ints).
    spans = sorted([(n.network_address._ip, n._prefixlen) for n in taken])
    starts = [start for start, _ in spans]
    reach = list(accumulate([start + (1 << (width - n)) - 1 for start, n in spans], max))
    apart = map(gt, starts[1:], map(add, reach, repeat(1)))      # start i+1 > reach i + 1
    firsts = [0] + list(compress(range(1, len(spans)), apart)) if spans else []
    runs = [(starts[i], reach[k - 1]) for i, k in zip(firsts, firsts[1:] + [len(spans)])]
    out: list = []
    i, cur, last = 0, int(first), int(last)
    while cur <= last and len(out) < limit:
        while i < len(runs) and runs[i][1] < cur:
            i += 1
        # runs are sorted and apart: if any overlaps the candidate, the first one left does
        if i < len(runs) and runs[i][0] < cur + size:
            cur = -(-(runs[i][1] + 1) // size) * size
            continue
        out.append(family((cur, prefixlen)))
        cur += size
    return out


def free_subnets(config: NetworkConfig, taken: "Iterable[IPv4Network]",
                 limit: int = MAX_FREE_CANDIDATES) -> list[IPv4Network]:
    """The first `limit` subnets of SubnetLen from SubnetMin to SubnetMax overlapping no taken one."""
    return free_in_range(IPv4Network, config.subnet_min, config.subnet_max, config.subnet_len,
                         taken, limit)


def free_ipv6_subnets(config: NetworkConfig, taken: "Iterable[IPv6Network]",
                      limit: int = MAX_FREE_CANDIDATES) -> list[IPv6Network]:
    """The same for the IPv6 part: IPv6SubnetLen from IPv6SubnetMin to IPv6SubnetMax."""
    return free_in_range(IPv6Network, config.ipv6_subnet_min, config.ipv6_subnet_max,
                         config.ipv6_subnet_len, taken, limit)


def pick_ipv4(config: NetworkConfig, leases: list[Lease], also_taken: Iterable[IPv4Network],
              rng: random.Random) -> IPv4Network:
    free = free_subnets(config, [l.subnet for l in leases] + list(also_taken))
    if not free:
        raise OutOfSubnetsError(
            f"out of subnets: no free /{config.subnet_len} left in {config.subnet_min} ... "
            f"{config.subnet_max} of {config.network} ({len(leases)} leases held)")
    return rng.choice(free)


def pick_ipv6(config: NetworkConfig, leases: list[Lease], also_taken: Iterable[IPv6Network],
              rng: random.Random) -> IPv6Network:
    taken = [l.ipv6_subnet for l in leases if l.ipv6_subnet is not None] + list(also_taken)
    free = free_ipv6_subnets(config, taken)
    if not free:
        raise OutOfSubnetsError(
            f"out of subnets: no free IPv6 /{config.ipv6_subnet_len} left in "
            f"{config.ipv6_subnet_min} ... {config.ipv6_subnet_max} of {config.ipv6_network} "
            f"({len(taken)} IPv6 subnets held)")
    return rng.choice(free)


def ipv6_part(config: NetworkConfig, leases: list[Lease], want: Optional[IPv6Network],
              rng: random.Random, also_taken: Iterable[IPv6Network] = ()) -> Optional[IPv6Network]:
    """The IPv6 part of a lease for a host that keeps its IPv4 subnet: none without EnableIPv6;
    `want` (the part it held) if it fits the config and no lease of another host overlaps it;
    else a random free one. `leases` should hold no key of ours that is being replaced."""
    if not config.enable_ipv6:
        return None
    if (config.ipv6_subnet_compatible(want)
            and not any(l.ipv6_subnet is not None and l.ipv6_subnet.overlaps(want) for l in leases)):
        return want
    return pick_ipv6(config, leases, also_taken, rng)


def pick_pair(config: NetworkConfig, leases: list[Lease],
              lost: "Iterable[IPv4Network | IPv6Network]", rng: random.Random
              ) -> tuple[IPv4Network, Optional[IPv6Network]]:
    """A new lease's subnet and (with EnableIPv6) IPv6 part, each picked on its own; the parts
    of either family in `lost` are taken too (creation races lost since `leases` was read)."""
    log.info("Picking subnet in range %s ... %s", config.subnet_min, config.subnet_max)
    if config.enable_ipv6:
        log.info("Picking ipv6 subnet in range %s ... %s", config.ipv6_subnet_min,
                 config.ipv6_subnet_max)
    lost = list(lost)
    sn = pick_ipv4(config, leases, [p for p in lost if p.version == 4], rng)
    if not config.enable_ipv6:
        return sn, None
    return sn, pick_ipv6(config, leases, [p for p in lost if p.version == 6], rng)


def other_holder(leases: list[Lease], public_ip: IPv4Address, subnets) -> str:
    """Who else holds a lease overlapping a part of ``subnets`` (the subnet, or a lease's
    parts), for a message; "" if nobody."""
    subnet, ipv6_subnet = split_parts(subnets)
    for l in leases:
        if l.attrs.public_ip == public_ip:
            continue
        if l.subnet.overlaps(subnet) or (ipv6_subnet is not None and l.ipv6_subnet is not None
                                         and l.ipv6_subnet.overlaps(ipv6_subnet)):
            return f"PublicIP {l.attrs.public_ip}, key {l.key}"
    return ""


def earlier_rival(leases: list[Lease], ours: Lease) -> Optional[Lease]:
    """Another key created before ``ours`` (a lower create revision) that overlaps either of its
    parts, or None. A dual-stack key names both parts, so the create-if-absent of ours guards
    neither alone: two hosts that picked the same IPv4 subnet with other IPv6 parts, or the
    same IPv6 part with other IPv4 subnets, both succeed. The later creator lists after its own
    create, so it always sees the earlier one and yields; the earlier needs no look."""
    for l in leases:
        if l.key == ours.key or not 0 < l.create_revision < ours.mod_revision:
            continue
        if l.subnet.overlaps(ours.subnet) or (
                ours.ipv6_subnet is not None and l.ipv6_subnet is not None
                and l.ipv6_subnet.overlaps(ours.ipv6_subnet)):
            return l
    return None
