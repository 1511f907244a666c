"""The kernel's side of DirectRouting (control/direct.py decides which peers): plain routes
``<peer subnet> via <peer PublicIP> dev <external interface>`` and, for a dual-stack peer's
IPv6 part, ``<part> via <peer PublicIPv6> dev <external interface>`` (same protocol number and
type), the question the decision asks the kernel (is an address reached without a gateway, on
that interface?), and a watch of this host's addresses and routes of both families, after which
the answers may differ.

Our routes carry their own protocol number, PROTO (``ip route`` shows ``proto 153``): the
daemon finds its own among the host's routes after a restart or a handover, and ``flannel-udp
cleanup`` removes them. They stay when the daemon exits, as flanneld leaves its rules: the
packets they carry never passed through the daemon.
"""
from __future__ import annotations

import errno
import logging
import select
import socket
import struct
import threading
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

log = logging.getLogger(__name__)

PROTO = 153
MAIN_TABLE = 254
RTN_UNICAST = 1
# rtnetlink multicast groups: links, IPv4 addresses, IPv4 routes, IPv6 addresses, IPv6 routes
# (an IPv6 prefix that comes or goes changes which PublicIPv6 is on the link)
_GROUPS = 0x1 | 0x10 | 0x40 | 0x100 | 0x400
_RTM_NEWROUTE, _RTM_DELROUTE = 24, 25
_NLMSG_HDR = struct.Struct("=IHHII")


def _family(net) -> int:
    return socket.AF_INET6 if net.version == 6 else socket.AF_INET


def on_link(ip: "IPv4Address | IPv6Address | str", ifindex: int) -> bool:
    """The kernel's own lookup: ``ip`` (either family) is reached on ``ifindex`` with no
    gateway (its route is the interface's connected network, or a host route on it)."""
    with IPRoute() as ipr:
        try:
            answer = ipr.route("get", dst=str(ip))
        except NetlinkError:            # unreachable, no route
            return False
    for msg in answer:
        if msg.get_attr("RTA_GATEWAY") is None and msg.get_attr("RTA_OIF") == ifindex \
                and msg["type"] == RTN_UNICAST:     # not local, not a blackhole
            return True
    return False


def replace(subnet: "IPv4Network | IPv6Network", via: "IPv4Address | IPv6Address",
            ifindex: int) -> None:
    """``<subnet> via <via> dev <ifindex> proto 153`` in the main table, replacing any route of
    that subnet there (a PublicIP that changed); both of one family."""
    with IPRoute() as ipr:
        ipr.route("replace", family=_family(subnet), dst=str(subnet), gateway=str(via),
                  oif=ifindex, proto=PROTO, table=MAIN_TABLE, type=RTN_UNICAST)


def replace_all(routes, ifindex: int) -> None:
    """:func:`replace` for each ``(subnet, via)`` of ``routes``, over one netlink socket: a
    start with thousands of peers on the link pays one socket, not one per route."""
    routes = list(routes)
    if not routes:
        return
    with IPRoute() as ipr:
        for subnet, via in routes:
            ipr.route("replace", family=_family(subnet), dst=str(subnet), gateway=str(via),
                      oif=ifindex, proto=PROTO, table=MAIN_TABLE, type=RTN_UNICAST)


def delete_all(subnets) -> None:
    """:func:`delete` for each of ``subnets``, over one netlink socket."""
    subnets = list(subnets)
    if not subnets:
        return
    with IPRoute() as ipr:
        for subnet in subnets:
            _delete(ipr, subnet)


def delete(subnet: "IPv4Network | IPv6Network") -> None:
    """Our route of ``subnet``, if it is there. The type is named: --ip-blackhole-route's
    blackhole carries PROTO too (host/blackhole.py), and a delete that leaves the type open takes
    whichever of the two the kernel finds first (a lease moved into a former peer's subnet)."""
    with IPRoute() as ipr:
        _delete(ipr, subnet)


def _delete(ipr, subnet) -> None:
    try:
        ipr.route("del", family=_family(subnet), dst=str(subnet), proto=PROTO,
                  table=MAIN_TABLE, type=RTN_UNICAST)
    except NetlinkError as e:
        if e.code not in (errno.ESRCH, errno.ENOENT):
            raise


def installed() -> dict:
    """Our routes in the main table, both families: subnet -> gateway (IPv4Network ->
    IPv4Address, IPv6Network -> IPv6Address)."""
    out = {}
    with IPRoute() as ipr:
        for family in (socket.AF_INET, socket.AF_INET6):
            for msg in ipr.route("dump", family=family, table=MAIN_TABLE):
                if msg["proto"] != PROTO or msg.get_attr("RTA_GATEWAY") is None:
                    continue
                dst = msg.get_attr("RTA_DST")
                if dst is None:
                    continue
                out[ip_network(f"{dst}/{msg['dst_len']}")] = ip_address(msg.get_attr("RTA_GATEWAY"))
    return out


class HostRouteWatch:
    """Calls ``changed()`` (its own thread) once the host's links, addresses or routes have
    changed and then stayed still for ``quiet`` seconds; our own routes' changes do not count.
    Raw rtnetlink: only whether something changed matters, not what."""

    def __init__(self, changed, quiet: float = 0.1, name: str = "direct-routes-watch"):
        self.changed = changed
        self.quiet = quiet
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._sock.bind((0, _GROUPS))
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "HostRouteWatch":
        self._thread.start()
        return self

    def _run(self) -> None:
        pending = False
        while not self._stop.is_set():
            ready, _, _ = select.select([self._sock], [], [], self.quiet if pending else 0.5)
            if ready:
                try:
                    data = self._sock.recv(65536)
                except OSError as e:
                    if e.errno == errno.ENOBUFS:        # events lost: something changed
                        pending = True
                        continue
                    if self._stop.is_set():
                        return
                    raise
                pending = pending or _counts(data)
                continue
            if pending:
                pending = False
                try:
                    self.changed()
                except Exception:
                    log.exception("re-deciding the direct routes failed")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()


def _counts(data: bytes) -> bool:
    """Whether a batch of rtnetlink messages holds one that is not about our own routes."""
    off = 0
    while off + _NLMSG_HDR.size <= len(data):
        length, kind = _NLMSG_HDR.unpack_from(data, off)[:2]
        if length < _NLMSG_HDR.size:
            return True
        if kind not in (_RTM_NEWROUTE, _RTM_DELROUTE) or len(data) < off + 22 \
                or data[off + 16 + 5] != PROTO:
            return True
        off += (length + 3) & ~3
    return False
