"""Nexthop objects (Linux 5.3 on) for DirectRouting's routes: one per direct route, ``id I via
<PublicIP> dev <external interface> proto 153``, and the route ``<subnet> nhid I proto 153``.

Why: each plain route's gateway is a ``fib_info`` of its own, and the kernel finds a shared one by
walking a chain that holds all of them (the hash leaves the gateway out), so adding 16,000 routes
each through its own gateway took ~4.5 s of the kernel's time, quadratic in their number; routes
by nexthop id are hashed by the id: 16,000 nexthops and their routes in ~0.2 s
(perf/README.md#direct-batch, #direct-nexthops).

Ids: our block is ``ID_FIRST``..``ID_LAST`` (153 in the top byte, as in the protocol number):
FRR's zebra and its daemons keep their ids under 250,000,000 and its EVPN ones under 0x30000000
(a type of 1 or 2 in the top bits), and ``ip nexthop add`` without an id takes the lowest free
one. A daemon finds its own by the protocol (153) after a restart or a
handover, and the route dump tells which of our routes uses which (``Table.load``); ids are not
stable per peer. A new id is made with NLM_F_EXCL, so one taken meanwhile (another daemon of a
handover) is refused (EEXIST) rather than overwritten.

``FORCE_PLAIN_ENV`` set to 1 (or ``FORCE_PLAIN``) keeps the plain routes of kernels without
nexthop objects, which is also what the daemon falls back to when the kernel refuses the
probe (EOPNOTSUPP before 5.3).
"""
from __future__ import annotations

import errno
import logging
import os
import random
import socket
import struct
import threading
from ipaddress import ip_address

from . import netlink_batch as nl

log = logging.getLogger(__name__)

RTM_NEWNEXTHOP, RTM_DELNEXTHOP, RTM_GETNEXTHOP = 104, 105, 106
NHMSG = struct.Struct("=BBBBI")          # family, scope, protocol, reserved, flags
NHA_ID, NHA_GROUP, NHA_BLACKHOLE, NHA_OIF, NHA_GATEWAY = 1, 2, 4, 5, 6
RTA_NH_ID = 30
ID_FIRST, ID_LAST = 153 << 24, (154 << 24) - 1
F_EXCL, F_CREATE = 0x200, 0x400
FORCE_PLAIN_ENV = "FLANNEL_UDP_DIRECT_PLAIN"
FORCE_PLAIN = False


def forced_plain() -> bool:
    return FORCE_PLAIN or os.environ.get(FORCE_PLAIN_ENV, "") not in ("", "0")


def new_msg(nhid: int, gateway, ifindex: int, proto: int) -> tuple:
    """RTM_NEWNEXTHOP of ``id nhid via gateway dev ifindex proto``, an id that must not exist
    (EXCL). Never a replace of one in use: the kernel then walks every route of the namespace
    for each (fib_info_notify_update), 3.8 s for 16,000; a new gateway gets a new id."""
    family = socket.AF_INET6 if gateway.version == 6 else socket.AF_INET
    flags = F_CREATE | F_EXCL
    body = (NHMSG.pack(family, 0, proto, 0, 0) + nl.attr(NHA_ID, struct.pack("=I", nhid))
            + nl.attr(NHA_GATEWAY, gateway.packed) + nl.attr(NHA_OIF, struct.pack("=I", ifindex)))
    return RTM_NEWNEXTHOP, flags, body


def del_msg(nhid: int) -> tuple:
    """RTM_DELNEXTHOP of ``id nhid``: the routes by it go too."""
    return RTM_DELNEXTHOP, 0, NHMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + \
        nl.attr(NHA_ID, struct.pack("=I", nhid))


def dump() -> list:
    """Every nexthop object of this namespace as (id, protocol, family, gateway bytes or None,
    oif); OSError (EOPNOTSUPP: a kernel before 5.3) when it has none."""
    out = []
    for body in nl.dump(RTM_GETNEXTHOP, NHMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        if len(body) < NHMSG.size:
            continue
        found = nl.attrs(body, NHMSG.size)
        if NHA_ID not in found:
            continue
        oif = found.get(NHA_OIF)
        out.append((struct.unpack("=I", found[NHA_ID])[0], body[2], body[0],
                    found.get(NHA_GATEWAY), struct.unpack("=I", oif)[0] if oif else 0))
    return out


def ours(proto: int) -> list:
    """The ids of the nexthops of ``proto`` (cleanup's); none on a kernel without them."""
    try:
        return sorted(nhid for nhid, p, *_ in dump() if p == proto)
    except OSError:
        return []


class Table:
    """Which of our routes uses which of our nexthop ids, in one network namespace: kept as we
    make and delete them, loaded again from the kernel on a surprise (an id taken)."""

    def __init__(self, supported: bool):
        self.supported = supported
        self.lock = threading.RLock()
        self.ids: dict = {}           # our route's dst (IPv4Network/IPv6Network) -> its id
        self.via: dict = {}           # our id -> (gateway, oif) it was made with
        self.used: set = set()        # every id in the namespace (anyone's)
        self.plain_families: set = set()   # families the kernel refused nexthops of
        self._next = ID_FIRST + random.randrange(ID_LAST - ID_FIRST)

    def load(self, nexthops: list, routes: dict) -> None:
        """``nexthops``: :func:`dump`; ``routes``: our routes' dst -> nhid (0: plain)."""
        self.used = {nhid for nhid, *_ in nexthops}
        self.ids = {dst: nhid for dst, nhid in routes.items() if nhid}
        self.via = {nhid: (ip_address(gw), oif) for nhid, _, _, gw, oif in nexthops
                    if gw is not None}

    def fresh(self) -> int:
        """An id of our block no one uses."""
        span = ID_LAST - ID_FIRST + 1
        for _ in range(span):
            nhid = self._next
            self._next = ID_FIRST + (nhid - ID_FIRST + 1) % span
            if nhid not in self.used:
                self.used.add(nhid)
                return nhid
        raise OSError(errno.ENOSPC, "no nexthop id left in flannel-udp's block")


_tables: dict = {}
_tables_lock = threading.Lock()


def _netns() -> int:
    """This thread's network namespace (setns is per thread): a table each."""
    try:
        return os.stat("/proc/thread-self/ns/net").st_ino
    except OSError:
        return 0


def table(load_routes) -> Table:
    """The namespace's table, made on first use: whether the kernel has nexthop objects is
    asked once (a dump of them), said once in the log, and ``load_routes()`` (our routes' dst
    -> nhid) read so that a restarted daemon takes its predecessor's ids."""
    key = _netns()
    with _tables_lock:
        tab = _tables.get(key)
        if tab is not None:
            return tab
        if forced_plain():
            tab = Table(False)
            log.info("DirectRouting's routes: plain routes (%s is set)", FORCE_PLAIN_ENV)
        else:
            try:
                found = dump()
            except OSError as e:
                tab = Table(False)
                log.info("DirectRouting's routes: plain routes, the kernel has no nexthop "
                         "objects (%s: %s)", nl.errno_name(e.errno), e.strerror)
            else:
                tab = Table(True)
                tab.load(found, load_routes())
                log.info("DirectRouting's routes: by nexthop objects (ids %#x-%#x, proto 153)",
                         ID_FIRST, ID_LAST)
        _tables[key] = tab
        return tab


def forget() -> None:
    """Drop every namespace's table (tests that force a form)."""
    with _tables_lock:
        _tables.clear()
