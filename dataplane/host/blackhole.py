"""The route of --ip-blackhole-route: ``blackhole <lease subnet>`` in the main table, so that a
packet for an address of this host's subnet that no workload holds is dropped here instead of
following a less specific route (``<Network> dev flannel0`` back into the overlay, or the default
route out of the host).

flanneld (v0.28) adds it with the kernel's defaults: main table, metric 0. The connected route a
CNI bridge gets from its address (``<subnet> dev cni0``, docker0 with ``--bip``) has the same
prefix and metric 0 too, and the kernel keeps routes of one prefix and one metric in the order they
were added, the first one winning: a bridge that comes up after such a blackhole is shadowed by
it (its workloads are cut off), and one that is up before makes adding the blackhole fail with
EEXIST. Ours has the highest metric there is, METRIC: every other route of the prefix wins
whatever the order, whatever metric a network manager gives it, and the blackhole only takes
over when none is left (the bridge not made yet, or down).

It carries the daemon's protocol number (``proto 153``, host/direct_routes.py): the watch of the
host's routes does not take our own change for the host's, and an operator sees whose it is.
A blackhole of the prefix in the main table counts as present whoever made it, as in flanneld's
check, so that a host moved over from flanneld keeps flanneld's rather than getting a second
one; :func:`remove` removes every one of them, since any would drop what is no longer ours.

The daemon's side (when to add it, the lease moving, failures) is daemon/blackhole_route.py.
"""
from __future__ import annotations

import errno
import os
import socket
import struct
from ipaddress import IPv4Address, IPv4Network

from . import netlink_batch as nl, rtnl
from .direct_routes import MAIN_TABLE, PROTO

METRIC = 0xFFFFFFFF
RTN_BLACKHOLE = 6
# More than one blackhole of a prefix only comes from hands or tools besides ours; a bound keeps
# a kernel that would not delete them from turning removal into an endless loop.
MAX_REMOVALS = 64

_NLMSG = struct.Struct("=IHHII")
_RTMSG = struct.Struct("=BBBBBBBBI")    # family, dst_len, src_len, tos, table, proto, scope, type
_RTA = struct.Struct("=HH")
_RTM_NEWROUTE, _RTM_GETROUTE = 24, 26
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_SOL_NETLINK, _NETLINK_GET_STRICT_CHK = 270, 12
_RTA_DST, _RTA_PRIORITY, _RTA_TABLE = 1, 6, 15


def removal_command(subnet: IPv4Network) -> str:
    """What an operator runs to remove it (any metric, any protocol)."""
    return f"ip route del blackhole {subnet}"


def found(subnet: IPv4Network) -> list[tuple[int, int]]:
    """(metric, protocol) of every blackhole of ``subnet`` in the main table."""
    return [(metric, proto) for dst, dst_len, metric, proto in blackholes()
            if dst_len == subnet.prefixlen and dst == subnet.network_address]


def blackholes() -> list[tuple[IPv4Address, int, int, int]]:
    """(dst, prefix length, metric, protocol) of the main table's IPv4 blackholes.

    Raw netlink rather than a pyroute2 dump: the check runs every resync period in the daemon's
    main thread, and the main table may hold a route per peer (DirectRouting), each of which
    pyroute2 would decode whole. With strict checking (Linux >= 4.20) the kernel sends the main
    table's blackholes only; an older one sends every route, and only their headers are read."""
    out = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                       socket.NETLINK_ROUTE) as sock:
        try:
            sock.setsockopt(_SOL_NETLINK, _NETLINK_GET_STRICT_CHK, 1)
        except OSError:
            pass
        sock.bind((0, 0))
        req = _RTMSG.pack(socket.AF_INET, 0, 0, 0, MAIN_TABLE, 0, 0, RTN_BLACKHOLE, 0)
        sock.send(_NLMSG.pack(_NLMSG.size + len(req), _RTM_GETROUTE, _NLM_F_REQUEST | _NLM_F_DUMP,
                              1, 0) + req)
        while True:
            data = sock.recv(1 << 17)
            off = 0
            while off + _NLMSG.size <= len(data):
                length, kind = _NLMSG.unpack_from(data, off)[:2]
                if length < _NLMSG.size:
                    raise OSError(errno.EPROTO, "malformed netlink message in a route dump")
                if kind == _NLMSG_DONE:
                    return out
                if kind == _NLMSG_ERROR:
                    code = -struct.unpack_from("=i", data, off + _NLMSG.size)[0]
                    if code:
                        raise OSError(code, f"route dump: {os.strerror(code)}")
                elif kind == _RTM_NEWROUTE:
                    route = _blackhole_of(data[off + _NLMSG.size:off + length])
                    if route is not None:
                        out.append(route)
                off += (length + 3) & ~3


def _blackhole_of(msg: bytes):
    """(dst, prefix length, metric, protocol) of one route message, if it is an IPv4 blackhole
    of the main table; else None."""
    if len(msg) < _RTMSG.size:
        return None
    family, dst_len, _, _, table, proto, _, rtype, _ = _RTMSG.unpack_from(msg)
    if family != socket.AF_INET or rtype != RTN_BLACKHOLE:
        return None
    dst, metric = IPv4Address(0), 0
    off = _RTMSG.size
    while off + _RTA.size <= len(msg):
        alen, atype = _RTA.unpack_from(msg, off)
        if alen < _RTA.size:
            break
        value = msg[off + _RTA.size:off + alen]
        if atype == _RTA_DST and len(value) == 4:
            dst = IPv4Address(value)
        elif atype == _RTA_PRIORITY and len(value) == 4:
            metric = struct.unpack("=I", value)[0]
        elif atype == _RTA_TABLE and len(value) == 4:
            table = struct.unpack("=I", value)[0]
        off += (alen + 3) & ~3
    return (dst, dst_len, metric, proto) if table == MAIN_TABLE else None


def present(subnet: IPv4Network) -> bool:
    return bool(found(subnet))


def add(subnet: IPv4Network) -> bool:
    """Ours, unless a blackhole of ``subnet`` is there already: True when it was added."""
    if present(subnet):
        return False
    body = _route(subnet, PROTO) + nl.attr(rtnl.RTA_PRIORITY, struct.pack("=I", METRIC))
    try:
        rtnl.call(rtnl.RTM_NEWROUTE, rtnl.F_CREATE | rtnl.F_EXCL, body,
                  f"add route blackhole {subnet} metric {METRIC}")
    except OSError as e:
        # Another route of this prefix and metric (not a blackhole: we looked) would make
        # this fail for ever; a blackhole added meanwhile is what we wanted.
        if e.errno == errno.EEXIST and present(subnet):
            return False
        raise
    return True


def _route(subnet: IPv4Network, proto: int) -> bytes:
    """A blackhole route message of the main table, no metric."""
    return (_RTMSG.pack(socket.AF_INET, subnet.prefixlen, 0, 0, MAIN_TABLE, proto, 0,
                        RTN_BLACKHOLE, 0)
            + nl.attr(rtnl.RTA_DST, subnet.network_address.packed))


def remove(subnet: IPv4Network) -> int:
    """Every blackhole of ``subnet`` in the main table; how many there were."""
    removed = 0
    while removed < MAX_REMOVALS:
        try:
            # no metric and no protocol: the kernel takes the first blackhole of the prefix
            rtnl.call(rtnl.RTM_DELROUTE, 0, _route(subnet, 0), f"remove route blackhole {subnet}")
        except OSError as e:
            if e.errno in (errno.ESRCH, errno.ENOENT):
                return removed
            raise
        removed += 1
    return removed
