"""The kernel's route lookup for many addresses at once, done in Python from one dump of the
routing tables: which route the kernel would take to each address (``ip route get``).

DirectRouting asks it of every peer's PublicIP (host/direct_routes.py on_link_all): asked of the
kernel one address at a time that is a netlink round trip each, ~1 s for 16,000 peers, against
~0.1 s for one dump and a longest-prefix match here. The answer is the kernel's own only while
the host's policy rules are the defaults (local, main, default, nothing selected by source,
mark or interface): :func:`lookup` returns None otherwise, and the caller asks the kernel.

A route by a nexthop object is read through the gateway and device the kernel puts beside its
id in the dump; where it puts none (net.ipv4.nexthop_compat_mode off), through the object.

Our own routes (proto 153: the direct routes and --ip-blackhole-route's blackhole) are left out of
the match: they go to pod subnets inside the flannel network, never to a host's PublicIP, and
there are as many as peers.
"""
from __future__ import annotations

import socket
import struct
from . import netlink_batch as nl, nexthops as nh

_RTM_GETROUTE, _RTM_GETRULE = 26, 34
_RTA_DST, _RTA_OIF, _RTA_GATEWAY, _RTA_PRIORITY, _RTA_MULTIPATH, _RTA_TABLE = 1, 4, 5, 6, 9, 15
_FRA_PRIORITY, _FRA_TABLE, _FRA_PROTOCOL = 6, 15, 21
_FRA_SUPPRESS_IFGROUP, _FRA_SUPPRESS_PREFIXLEN = 13, 14     # -1: none (the kernel's default)
_NONE = b"\xff\xff\xff\xff"
_FR_ACT_TO_TBL = 1
_RTN_UNICAST, _RTN_THROW = 1, 9
_FIB_RULE_HDR = struct.Struct("=BBBBBBBBI")
_LOCAL, _MAIN, _DEFAULT = 255, 254, 253
# The tables the default rules look up, in their order (IPv6 has no "default" rule)
_DEFAULT_RULES = {socket.AF_INET: [_LOCAL, _MAIN, _DEFAULT], socket.AF_INET6: [_LOCAL, _MAIN]}


def _tables(family: int):
    """The tables the rules look up in order, if the rules are the defaults; else None."""
    rules = []
    for body in nl.dump(_RTM_GETRULE, _FIB_RULE_HDR.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)):
        fam, dst_len, src_len, tos, table, _, _, action, _ = _FIB_RULE_HDR.unpack_from(body)
        found = nl.attrs(body, _FIB_RULE_HDR.size)
        for unset in (_FRA_SUPPRESS_IFGROUP, _FRA_SUPPRESS_PREFIXLEN):
            if found.get(unset) == _NONE:
                del found[unset]
        if dst_len or src_len or tos or action != _FR_ACT_TO_TBL \
                or set(found) - {_FRA_PRIORITY, _FRA_TABLE, _FRA_PROTOCOL}:
            return None
        if _FRA_TABLE in found:
            table = struct.unpack("=I", found[_FRA_TABLE])[0]
        prio = struct.unpack("=I", found[_FRA_PRIORITY])[0] if _FRA_PRIORITY in found else 0
        rules.append((prio, table))
    tables = [table for _, table in sorted(rules)]
    return tables if tables == _DEFAULT_RULES[family] else None


def _routes(family: int, skip_proto: int) -> dict:
    """{table: {prefix length: {network as int: (metric, route)}}} of the routes of
    ``family``, the lowest metric of a prefix kept; route: (type, gateway or multipath, oif)."""
    out: dict = {}
    objects = None
    for body in nl.dump(_RTM_GETROUTE, nl.RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)):
        if len(body) < nl.RTMSG.size or body[5] == skip_proto or body[3]:     # ours; a tos
            continue
        found = nl.attrs(body)
        table = struct.unpack("=I", found[_RTA_TABLE])[0] if _RTA_TABLE in found else body[4]
        dst = int.from_bytes(found[_RTA_DST], "big") if _RTA_DST in found else 0
        metric = struct.unpack("=I", found[_RTA_PRIORITY])[0] if _RTA_PRIORITY in found else 0
        oif = struct.unpack("=i", found[_RTA_OIF])[0] if _RTA_OIF in found else 0
        route = (body[7], _RTA_GATEWAY in found or _RTA_MULTIPATH in found, oif)
        if nh.RTA_NH_ID in found and _RTA_OIF not in found:
            # by a nexthop object, dumped without its nexthop (nexthop_compat_mode off)
            if objects is None:
                objects = _nexthops()
            gateway, oif = objects.get(struct.unpack("=I", found[nh.RTA_NH_ID])[0], (True, 0))
            route = (body[7], gateway, oif)
        by_net = out.setdefault(table, {}).setdefault(body[1], {})
        if dst not in by_net or metric < by_net[dst][0]:
            by_net[dst] = (metric, route)
    return out


def _nexthops() -> dict:
    """{id: (has a gateway, oif)} of the namespace's nexthop objects (a group, a blackhole:
    as through a gateway, never on the link)."""
    out = {}
    try:
        bodies = nl.dump(nh.RTM_GETNEXTHOP, nh.NHMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0))
    except OSError:
        return out
    for body in bodies:
        found = nl.attrs(body, nh.NHMSG.size)
        if nh.NHA_ID not in found:
            continue
        simple = nh.NHA_OIF in found and nh.NHA_GROUP not in found \
            and nh.NHA_BLACKHOLE not in found
        out[struct.unpack("=I", found[nh.NHA_ID])[0]] = (
            nh.NHA_GATEWAY in found or not simple,
            struct.unpack("=I", found[nh.NHA_OIF])[0] if simple else 0)
    return out


def lookup(ips, skip_proto: int):
    """For each of ``ips`` (addresses of one family), in order, (type, has a gateway, oif) of
    the route the kernel takes to it (None: none); None when the host's rules are not the
    defaults."""
    if not ips:
        return []
    family = socket.AF_INET6 if ips[0].version == 6 else socket.AF_INET
    tables = _tables(family)
    if tables is None:
        return None
    routes = _routes(family, skip_proto)
    bits = ips[0].max_prefixlen
    order = [(table, [(plen, routes[table][plen]) for plen in sorted(routes.get(table, {}),
                                                                     reverse=True)])
             for table in tables]
    out = []
    for ip in ips:
        value, answer = int(ip), None
        for _, by_len in order:
            for plen, by_net in by_len:
                hit = by_net.get(value >> (bits - plen) << (bits - plen) if plen else 0)
                if hit is not None:
                    answer = hit[1]
                    break
            if answer is not None and answer[0] != _RTN_THROW:
                break
            answer = None
        out.append(answer)
    return out


def on_link(answer, ifindex: int) -> bool:
    """Whether a :func:`lookup` answer is reached without a gateway on ``ifindex``."""
    return answer is not None and answer[0] == _RTN_UNICAST and not answer[1] \
        and answer[2] == ifindex
