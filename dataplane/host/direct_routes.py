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
import os
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


# Raw rtnetlink for the batches (linux/rtnetlink.h): a header, an rtmsg, attributes.
_RTM_GETROUTE, _NLMSG_ERROR, _NLMSG_DONE = 26, 2, 3
_F_REQUEST, _F_ACK, _F_REPLACE, _F_CREATE = 0x1, 0x4, 0x100, 0x400
_RTA_DST, _RTA_OIF, _RTA_GATEWAY, _RTA_TABLE = 1, 4, 5, 15
_RT_SCOPE_NOWHERE = 255
_RTMSG = struct.Struct("=BBBBBBBBI")
_BATCH = 64                 # requests per send: their answers (an ack, a route) fit its buffer


def _attr(kind: int, data: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(data), kind) + data + bytes(-len(data) % 4)


def _route_msg(kind: int, flags: int, subnet, via=None, ifindex: int = 0) -> tuple:
    """(type, flags, body) of one RTM_NEWROUTE/RTM_DELROUTE of our routes: proto PROTO,
    unicast, the main table; a delete matches any scope (the type is named: see delete)."""
    net = subnet.network_address
    body = _RTMSG.pack(_family(subnet), subnet.prefixlen, 0, 0, MAIN_TABLE, PROTO,
                       _RT_SCOPE_NOWHERE if via is None else 0, RTN_UNICAST, 0)
    body += _attr(_RTA_DST, net.packed)
    if via is not None:
        body += _attr(_RTA_GATEWAY, via.packed) + _attr(_RTA_OIF, struct.pack("=i", ifindex))
    return kind, flags, body


def _get_msg(ip) -> tuple:
    ip = ip_address(ip)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return (_RTM_GETROUTE, 0,
            _RTMSG.pack(family, ip.max_prefixlen, 0, 0, 0, 0, 0, 0, 0) + _attr(_RTA_DST, ip.packed))


def _batch(msgs: list, ignore=()) -> list:
    """Send ``msgs`` ((type, flags, body)) with acks, ``_BATCH`` at a time; per message the
    answer's attributes ({type: data} with "type": the rtm_type) or None for an ack or an
    error. With ``ignore`` a tuple, an error not in it raises NetlinkError (the first); with
    None, errors are answers of None."""
    out: list = [None] * len(msgs)
    if not msgs:
        return out
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.bind((0, 0))
        failed = None
        for start in range(0, len(msgs), _BATCH):
            chunk = msgs[start:start + _BATCH]
            data = b"".join(_NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), kind,
                                            _F_REQUEST | _F_ACK | flags, start + i + 1, 0) + body
                            for i, (kind, flags, body) in enumerate(chunk))
            sock.sendall(data)
            pending = len(chunk)
            while pending:
                data = sock.recv(1 << 20)
                off = 0
                while off + _NLMSG_HDR.size <= len(data):
                    length, kind, _, seq, _ = _NLMSG_HDR.unpack_from(data, off)
                    if length < _NLMSG_HDR.size:
                        break
                    i = seq - 1
                    if kind == _NLMSG_ERROR:
                        code = -struct.unpack_from("=i", data, off + 16)[0]
                        pending -= 1
                        if code and ignore is not None and code not in ignore and failed is None:
                            failed = NetlinkError(code, f"{os.strerror(code)} "
                                                  f"(route request {i + 1} of {len(msgs)})")
                    elif kind != _NLMSG_DONE and 0 <= i < len(out):
                        out[i] = _attrs(data[off + 16:off + length])
                    off += (length + 3) & ~3
        if failed is not None:
            raise failed
    return out


def _attrs(payload: bytes) -> dict:
    """An rtmsg's attributes by type, and its rtm_type as "type"."""
    found: dict = {"type": payload[7]}
    off = _RTMSG.size
    while off + 4 <= len(payload):
        length, kind = struct.unpack_from("=HH", payload, off)
        if length < 4:
            break
        found[kind] = payload[off + 4:off + length]
        off += (length + 3) & ~3
    return found


def _no_gateway_on(answer: dict, ifindex: int) -> bool:
    oif = answer.get(_RTA_OIF)
    return _RTA_GATEWAY not in answer and answer["type"] == RTN_UNICAST \
        and oif is not None and struct.unpack("=i", oif)[0] == ifindex


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
    """:func:`replace` for each ``(subnet, via)`` of ``routes``, the requests sent in batches
    on one netlink socket: pyroute2 takes ~3 ms a route, so a start with 16,000 peers on the
    link took 46 s (perf/README.md#direct-routes); NetlinkError for the first refused."""
    _batch([_route_msg(_RTM_NEWROUTE, _F_CREATE | _F_REPLACE, subnet, via, ifindex)
            for subnet, via in routes])


def delete_all(subnets) -> None:
    """:func:`delete` for each of ``subnets``, in batches on one netlink socket."""
    _batch([_route_msg(_RTM_DELROUTE, 0, subnet) for subnet in subnets],
           ignore=(errno.ESRCH, errno.ENOENT))


def on_link_all(ips, ifindex: int) -> set:
    """Those of ``ips`` that :func:`on_link` answers yes for, asked in batches."""
    ips = list(ips)
    answers = _batch([_get_msg(ip) for ip in ips], ignore=None)
    return {ip for ip, answer in zip(ips, answers)
            if answer is not None and _no_gateway_on(answer, ifindex)}


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
