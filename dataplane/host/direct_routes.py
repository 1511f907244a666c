"""The kernel's side of DirectRouting (control/direct.py decides which peers): plain routes
``<peer subnet> via <peer PublicIP> dev <external interface>`` and, for a dual-stack peer's
IPv6 part, ``<part> via <peer PublicIPv6> dev <external interface>`` (same protocol number and
type), the question the decision asks the kernel (is an address reached without a gateway, on
that interface?), and a watch of this host's addresses and routes of both families, after which
the answers may differ.

Where the kernel has nexthop objects (host/nexthops.py) a route goes ``<subnet> nhid I`` through
``id I via <PublicIP> dev <external interface>``, both ours (:func:`put_all`, :func:`remove_all`,
:func:`listing`); else, and in :func:`replace_all`/:func:`delete_all`, plain.

Our routes carry their own protocol number, PROTO (``ip route`` shows ``proto 153``): the
daemon finds its own among the host's routes after a restart or a handover, and ``flannel-udp
cleanup`` removes them. They stay when the daemon exits, as flanneld leaves its rules: the
packets they carry never passed through the daemon.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import select
import socket
import struct
import sys
import threading
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

from . import netlink_batch as nl, nexthops, route_lookup

log = logging.getLogger(__name__)

PROTO = 153
MAIN_TABLE = 254
RTN_UNICAST = 1
# rtnetlink multicast groups: links, IPv4 addresses, IPv4 routes, IPv6 addresses, IPv6 routes
# (an IPv6 prefix that comes or goes changes which PublicIPv6 is on the link)
_GROUPS = 0x1 | 0x10 | 0x40 | 0x100 | 0x400
_RTM_NEWROUTE, _RTM_DELROUTE = 24, 25
_SO_ATTACH_FILTER = 26


def _family(net) -> int:
    return socket.AF_INET6 if net.version == 6 else socket.AF_INET


# Raw rtnetlink in bulk (host/netlink_batch.py): an rtmsg and its attributes (linux/rtnetlink.h)
_RTM_GETROUTE = 26
_F_REPLACE, _F_CREATE = 0x100, 0x400
_RTA_DST, _RTA_OIF, _RTA_GATEWAY, _RTA_TABLE = 1, 4, 5, 15
_RT_SCOPE_NOWHERE = 255
_RTMSG = nl.RTMSG
# From this many addresses of a family on, one dump and a lookup in Python beat a route get each
_LOOKUP_FROM = 32


def _route_msg(kind: int, flags: int, subnet, via=None, ifindex: int = 0) -> tuple:
    """(type, flags, body) of one RTM_NEWROUTE/RTM_DELROUTE of our routes: proto PROTO,
    unicast, the main table; a delete matches any scope (the type is named: see delete)."""
    net = subnet.network_address
    body = _RTMSG.pack(_family(subnet), subnet.prefixlen, 0, 0, MAIN_TABLE, PROTO,
                       _RT_SCOPE_NOWHERE if via is None else 0, RTN_UNICAST, 0)
    body += nl.attr(_RTA_DST, net.packed)
    if via is not None:
        body += nl.attr(_RTA_GATEWAY, via.packed) + nl.attr(_RTA_OIF, struct.pack("=i", ifindex))
    return kind, flags, body


def _get_msg(ip) -> tuple:
    ip = ip if isinstance(ip, (IPv4Address, IPv6Address)) else ip_address(ip)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return (_RTM_GETROUTE, 0, _RTMSG.pack(family, ip.max_prefixlen, 0, 0, 0, 0, 0, 0, 0)
            + nl.attr(_RTA_DST, ip.packed))


def _attrs(payload: bytes) -> dict:
    """An rtmsg's attributes by type, and its rtm_type as "type"."""
    return dict(nl.attrs(payload), type=payload[7])


def _no_gateway_on(answer: dict, ifindex: int) -> bool:
    oif = answer.get(_RTA_OIF)
    return _RTA_GATEWAY not in answer and answer["type"] == RTN_UNICAST \
        and oif is not None and struct.unpack("=i", oif)[0] == ifindex


def on_link(ip: "IPv4Address | IPv6Address | str", ifindex: int) -> bool:
    """The kernel's own lookup: ``ip`` (either family) is reached on ``ifindex`` with no
    gateway (its route is the interface's connected network, or a host route on it)."""
    errors, answers = nl.request([_get_msg(ip)])
    if errors[0] or answers[0] is None:             # unreachable, no route
        return False
    return _no_gateway_on(_attrs(answers[0]), ifindex)  # not local, not a blackhole


def replace(subnet: "IPv4Network | IPv6Network", via: "IPv4Address | IPv6Address",
            ifindex: int) -> None:
    """``<subnet> via <via> dev <ifindex> proto 153`` in the main table, replacing any route of
    that subnet there (a PublicIP that changed); both of one family."""
    from pyroute2 import IPRoute    # rare and off the start: its import is ~0.2 s of CPU
    with IPRoute() as ipr:
        ipr.route("replace", family=_family(subnet), dst=str(subnet), gateway=str(via),
                  oif=ifindex, proto=PROTO, table=MAIN_TABLE, type=RTN_UNICAST)


def replace_all(routes, ifindex: int) -> list:
    """:func:`replace` for each ``(subnet, via)`` of ``routes``, the requests sent in bulk on
    one netlink socket (host/netlink_batch.py); returns those the kernel refused, as
    ``(subnet, via, errno)``, in their order."""
    routes = list(routes)
    errors, _ = nl.request([_route_msg(_RTM_NEWROUTE, _F_CREATE | _F_REPLACE, subnet, via, ifindex)
                            for subnet, via in routes])
    return [(subnet, via, code) for (subnet, via), code in zip(routes, errors) if code]


def delete_all(subnets) -> list:
    """:func:`delete` for each of ``subnets``, in bulk on one netlink socket; returns those
    the kernel refused other than for being gone already, as ``(subnet, errno)``."""
    subnets = list(subnets)
    errors, _ = nl.request([_route_msg(_RTM_DELROUTE, 0, subnet) for subnet in subnets])
    return [(subnet, code) for subnet, code in zip(subnets, errors)
            if code and code not in (errno.ESRCH, errno.ENOENT)]


def on_link_all(ips, ifindex: int) -> set:
    """Those of ``ips`` (either family) that :func:`on_link` answers yes for. Many of one
    family: the kernel's lookup done in Python from one dump (host/route_lookup.py), unless the
    host has policy rules of its own; then, and for a few, the kernel asked in bulk."""
    on: set = set()
    ips = [ip if isinstance(ip, (IPv4Address, IPv6Address)) else ip_address(ip) for ip in ips]
    for version in (4, 6):
        group = [ip for ip in ips if ip.version == version]
        answers = route_lookup.lookup(group, PROTO) if len(group) >= _LOOKUP_FROM else None
        if answers is not None:
            on.update(ip for ip, answer in zip(group, answers)
                      if route_lookup.on_link(answer, ifindex))
            continue
        _, got = nl.request([_get_msg(ip) for ip in group])
        on.update(ip for ip, answer in zip(group, got)
                  if answer is not None and _no_gateway_on(_attrs(answer), ifindex))
    return on


def delete(subnet: "IPv4Network | IPv6Network") -> None:
    """Our route of ``subnet``, if it is there. The type is named: --ip-blackhole-route's
    blackhole carries PROTO too (host/blackhole.py), and a delete that leaves the type open takes
    whichever of the two the kernel finds first (a lease moved into a former peer's subnet)."""
    from pyroute2 import IPRoute    # rare and off the start: its import is ~0.2 s of CPU
    with IPRoute() as ipr:
        _delete(ipr, subnet)


def _delete(ipr, subnet) -> None:
    from pyroute2.netlink.exceptions import NetlinkError
    try:
        ipr.route("del", family=_family(subnet), dst=str(subnet), proto=PROTO,
                  table=MAIN_TABLE, type=RTN_UNICAST)
    except NetlinkError as e:
        if e.code not in (errno.ESRCH, errno.ENOENT):
            raise


def installed() -> dict:
    """Our routes in the main table, both families, either form: subnet -> gateway
    (IPv4Network -> IPv4Address, IPv6Network -> IPv6Address)."""
    return listing()[0]


def _ours() -> dict:
    """Our unicast routes in the main table: dst -> (gateway bytes or None, nhid or 0). One raw
    dump per family: only our routes' attributes are read (pyroute2's dump took 2.4 s for
    16,000)."""
    out = {}
    for family, net, addr in ((socket.AF_INET, IPv4Network, IPv4Address),
                              (socket.AF_INET6, IPv6Network, IPv6Address)):
        for body in nl.dump(_RTM_GETROUTE, _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)):
            if len(body) < _RTMSG.size or body[5] != PROTO or body[7] != RTN_UNICAST:
                continue
            found = nl.attrs(body)
            table = found.get(_RTA_TABLE)
            table = struct.unpack("=I", table)[0] if table is not None else body[4]
            dst, nhid = found.get(_RTA_DST), found.get(nexthops.RTA_NH_ID)
            if table != MAIN_TABLE or dst is None:
                continue
            nhid = struct.unpack("=I", nhid)[0] if nhid is not None else 0
            gateway = found.get(_RTA_GATEWAY)
            if gateway is None and not nhid:
                continue
            out[net((addr(dst), body[1]))] = (gateway and addr(gateway), nhid)
    return out


def listing() -> tuple[dict, dict, list]:
    """(our routes: subnet -> gateway, both forms; those whose route is not in the form this
    kernel gets, subnet -> its nhid (0: a plain route where nexthop objects are used); our
    nexthops no route of ours uses, by id: orphans). Refreshes which id each route uses
    (host/nexthops.py Table)."""
    try:
        found = nexthops.dump()     # before the routes: an orphan is one older than them
    except OSError:
        found = []
    routes = _ours()
    gateways = {nhid: gw for nhid, proto, _, gw, _ in found if proto == PROTO and gw}
    have = {}
    for dst, (gateway, nhid) in routes.items():
        if gateway is None:         # net.ipv4.nexthop_compat_mode off: the nexthop says it
            gateway = gateways.get(nhid)
            gateway = gateway and ip_address(gateway)
        if gateway is not None:
            have[dst] = gateway
    by_id = {dst: nhid for dst, (_, nhid) in routes.items()}
    tab = nexthops.table(lambda: by_id)
    with tab.lock:
        tab.load(found, by_id)
        other = {dst: nhid for dst, nhid in by_id.items() if bool(nhid) != _by_nexthop(tab, dst)}
    used = set(by_id.values())
    orphans = sorted(nhid for nhid, proto, *_ in found if proto == PROTO and nhid not in used)
    return have, other, orphans


def _by_nexthop(tab, dst) -> bool:
    return tab.supported and _family(dst) not in tab.plain_families


def _nh_route_msg(subnet, nhid: int) -> tuple:
    """RTM_NEWROUTE ``<subnet> nhid <nhid> proto 153``, replacing a route of that subnet
    (either form: a plain one of an older daemon too)."""
    body = _RTMSG.pack(_family(subnet), subnet.prefixlen, 0, 0, MAIN_TABLE, PROTO, 0,
                       RTN_UNICAST, 0)
    body += nl.attr(_RTA_DST, subnet.network_address.packed)
    body += nl.attr(nexthops.RTA_NH_ID, struct.pack("=I", nhid))
    return _RTM_NEWROUTE, _F_CREATE | _F_REPLACE, body


def put_all(routes, ifindex: int) -> list:
    """Each ``(subnet, via)`` of ``routes`` routed in the form this kernel gets: a nexthop
    object ``via dev ifindex proto 153`` and the route by its id where the kernel has them
    (host/nexthops.py), else :func:`replace_all`'s plain route. Returns those the kernel
    refused, ``(subnet, via, errno)``, in their order."""
    routes = list(routes)
    if not routes:
        return []
    tab = nexthops.table(lambda: {dst: nhid for dst, (_, nhid) in _ours().items()})
    with tab.lock:
        by_nh = [r for r in routes if _by_nexthop(tab, r[0])]
        plain = [r for r in routes if not _by_nexthop(tab, r[0])]
        for subnet, _ in plain:        # a nexthop's route replaced by a plain one: its id
            tab.ids.pop(subnet, None)  # is an orphan (listing) the next reconcile removes
        refused = _put_nexthops(tab, by_nh, ifindex, plain) if by_nh else []
    refused += replace_all(plain, ifindex)
    if not refused:
        return refused
    order = {subnet: i for i, (subnet, _) in enumerate(routes)}
    return sorted(refused, key=lambda r: order[r[0]])


def _put_nexthops(tab, routes, ifindex: int, plain: list, again: bool = True) -> list:
    """The nexthops, then the routes by them; ``plain`` gets the routes of a family the
    kernel refused nexthop objects of (logged once). A route whose nexthop is already ours
    with its gateway keeps it; one whose gateway changed gets a new id, and the old nexthop
    goes once no route uses it (host/nexthops.py new_msg says why not a replace)."""
    old = [tab.ids.get(subnet) for subnet, _ in routes]
    ids = [nhid if nhid and tab.via.get(nhid) == (via, ifindex) else None
           for (_, via), nhid in zip(routes, old)]
    ids = [nhid or tab.fresh() for nhid in ids]
    fresh = [nhid != was for nhid, was in zip(ids, old)]
    asked = [i for i, new in enumerate(fresh) if new]
    errors = [0] * len(routes)
    got, _ = nl.request([nexthops.new_msg(ids[i], routes[i][1], ifindex, PROTO) for i in asked])
    for i, code in zip(asked, got):
        errors[i] = code
    refused, made, retry = [], [], []
    for (subnet, via), nhid, new, code in zip(routes, ids, fresh, errors):
        if not code:
            tab.via[nhid] = (via, ifindex)
            made.append((subnet, via, nhid, new))
        elif code == errno.EEXIST and again:
            retry.append((subnet, via))        # taken meanwhile: another id
        elif code in (errno.EOPNOTSUPP, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):
            family = _family(subnet)
            if family not in tab.plain_families:
                tab.plain_families.add(family)
                log.info("DirectRouting's IPv%d routes: plain routes, the kernel refuses its "
                         "nexthop objects (%s)", 6 if family == socket.AF_INET6 else 4,
                         nl.errno_name(code))
            plain.append((subnet, via))
        else:
            refused.append((subnet, via, code))
    errors, _ = nl.request([_nh_route_msg(subnet, nhid) for subnet, _, nhid, _ in made])
    gone = []
    for (subnet, via, nhid, new), code in zip(made, errors):
        if not code:
            if new and tab.ids.get(subnet) not in (None, nhid):
                gone.append(tab.ids[subnet])        # its old gateway's: no route uses it
            tab.ids[subnet] = nhid
        elif not new and again:       # our nexthop was gone (deleted by hand): a new one
            tab.ids.pop(subnet, None)
            tab.via.pop(nhid, None)
            retry.append((subnet, via))
        else:
            refused.append((subnet, via, code))
            if new:
                gone.append(nhid)             # no orphan of ours left behind
    if gone:
        nl.request([nexthops.del_msg(nhid) for nhid in gone])
        for nhid in gone:
            tab.via.pop(nhid, None)
            tab.used.discard(nhid)
    if retry:
        try:
            found = nexthops.dump()
        except OSError:
            found = []
        tab.used |= {nhid for nhid, *_ in found}
        refused += _put_nexthops(tab, retry, ifindex, plain, again=False)
    return refused


def remove_all(subnets) -> list:
    """Our routes to ``subnets`` gone, either form: the routes, then the nexthops they used.
    That order: a nexthop deleted while a route uses it makes the kernel walk every route of
    the namespace (fib_flush), 16,000 of them for each of a burst's nexthops; once its route is
    gone, no route holds it. Returns those the kernel refused other than for being gone
    already, ``(subnet, errno)``."""
    subnets = list(subnets)
    if not subnets:
        return []
    tab = nexthops.table(lambda: {dst: nhid for dst, (_, nhid) in _ours().items()})
    with tab.lock:
        refused = delete_all(subnets)
        ids = [(subnet, tab.ids.pop(subnet, None)) for subnet in subnets]
        known = [(subnet, nhid) for subnet, nhid in ids if nhid]
        errors, _ = nl.request([nexthops.del_msg(nhid) for _, nhid in known])
        refused += [(subnet, code) for (subnet, _), code in zip(known, errors)
                    if code and code not in (errno.ENOENT, errno.ESRCH)]
        for _, nhid in known:
            tab.used.discard(nhid)
            tab.via.pop(nhid, None)
    return refused


def delete_nexthops(ids) -> list:
    """Our nexthops of ``ids`` (orphans: no route uses them) removed; those refused other than
    for being gone already, ``(id, errno)``."""
    ids = list(ids)
    errors, _ = nl.request([nexthops.del_msg(nhid) for nhid in ids])
    return [(nhid, code) for nhid, code in zip(ids, errors)
            if code and code not in (errno.ENOENT, errno.ESRCH)]


class HostRouteWatch:
    """Calls ``changed()`` (its own thread) once the host's links, addresses or routes have
    changed and then stayed still for ``quiet`` seconds; our own routes' changes do not count.
    Raw rtnetlink: only whether something changed matters, not what."""

    def __init__(self, changed, quiet: float = 0.1, name: str = "direct-routes-watch"):
        self.changed = changed
        self.quiet = quiet
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        _not_ours(self._sock)
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


def _not_ours(sock) -> None:
    """A socket filter that drops the events of our own routes in the kernel: thousands of them
    at once (a start, a burst) overflow the socket, and an overflow (ENOBUFS) hides whose routes
    changed, so every peer was decided again after each large batch of ours. Each event is a
    datagram of one message: its type (a route's) and its rtmsg's protocol (ours) decide.
    A kernel that refuses the filter leaves the check to :func:`_counts` alone."""
    low = 4 if sys.byteorder == "little" else 5        # nlmsg_type's low byte (types < 256)
    prog = [(0x30, 0, 0, low),                          # ldb [nlmsg_type]
            (0x15, 1, 0, _RTM_NEWROUTE),                # jeq NEWROUTE -> protocol
            (0x15, 0, 2, _RTM_DELROUTE),                # jeq DELROUTE -> protocol, else accept
            (0x30, 0, 0, nl.HDR.size + 5),              # ldb [rtm_protocol]
            (0x15, 1, 0, PROTO),                        # jeq PROTO -> drop
            (0x06, 0, 0, 0xFFFFFFFF),                   # ret accept
            (0x06, 0, 0, 0)]                            # ret drop
    code = b"".join(struct.pack("=HBBI", *insn) for insn in prog)
    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HL", len(prog), ctypes.addressof(buf))
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    except OSError as e:
        log.debug("no socket filter on the route watch (%s): our routes' events are read", e)


def _counts(data: bytes) -> bool:
    """Whether a batch of rtnetlink messages holds one that is not about our own routes."""
    off = 0
    while off + nl.HDR.size <= len(data):
        length, kind = nl.HDR.unpack_from(data, off)[:2]
        if length < nl.HDR.size:
            return True
        if kind not in (_RTM_NEWROUTE, _RTM_DELROUTE) or len(data) < off + 22 \
                or data[off + 16 + 5] != PROTO:
            return True
        off += (length + 3) & ~3
    return False
