"""Links, addresses and single routes over rtnetlink, with our own requests
(host/netlink_batch.py sends them): what a start does to flannel0 and reads of the host.

Why not pyroute2 here: importing any part of pyroute2 0.9 runs its package ``__init__``, which
imports every module it has (~0.2 s of CPU, a fifth of a fresh start's, perf/README.md#no-pyroute2),
and a start needs only a handful of requests. Every failure is an OSError carrying the kernel's
errno (what pyroute2's NetlinkError carried as ``code``) and what was asked. The sockets are
made in the calling thread's network namespace; nothing here needs an asyncio loop or minds one.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct

from . import netlink_batch as nl

RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
F_REPLACE, F_EXCL, F_CREATE = 0x100, 0x200, 0x400
IFINFOMSG = struct.Struct("=BxHiII")    # family, type, index, flags, change
IFADDRMSG = struct.Struct("=BBBBI")     # family, prefixlen, flags, scope, index
IFLA_IFNAME, IFLA_MTU, IFLA_TXQLEN = 3, 4, 13
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_MULTIPATH, RTA_TABLE = \
    1, 4, 5, 6, 7, 9, 15
IFF_UP = 0x1
MAIN_TABLE = 254
RTN_UNICAST = 1
RTPROT_BOOT = 3


def _u32(value: bytes) -> int:
    return struct.unpack("=I", value[:4])[0]


def call(kind: int, flags: int, body: bytes, what: str) -> bytes | None:
    """One request, acknowledged; the kernel's answer (a get's) or None. OSError with the
    kernel's errno and ``what`` was asked when it refuses."""
    errors, answers = nl.request([(kind, flags, body)])
    if errors[0]:
        raise OSError(errors[0], f"netlink: {what}: {os.strerror(errors[0])}")
    return answers[0]


def index(name: str) -> int:
    """The index of the interface called ``name``; OSError ENODEV when there is none."""
    try:
        return socket.if_nametoindex(name)
    except OSError:
        raise OSError(errno.ENODEV, f"no such network interface: {name}") from None


# --------------------------------------------------------------------------- links

def links() -> list[tuple[int, str, int]]:
    """(index, name, MTU) of every link in this network namespace, in the kernel's order."""
    out = []
    for msg in nl.dump(RTM_GETLINK, IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        idx = IFINFOMSG.unpack_from(msg)[2]
        a = nl.attrs(msg, IFINFOMSG.size)
        name = a.get(IFLA_IFNAME, b"").split(b"\0", 1)[0].decode()
        out.append((idx, name, _u32(a[IFLA_MTU]) if IFLA_MTU in a else 0))
    return out


def link_mtu(idx: int) -> int:
    """The MTU of the link ``idx``."""
    answer = call(RTM_GETLINK, 0, IFINFOMSG.pack(socket.AF_UNSPEC, 0, idx, 0, 0),
                  f"get link {idx}")
    a = nl.attrs(answer or b"", IFINFOMSG.size)
    if IFLA_MTU not in a:
        raise OSError(errno.EPROTO, f"netlink: link {idx} has no MTU in the kernel's answer")
    return _u32(a[IFLA_MTU])


def link_set(idx: int, name: str, mtu: int | None = None, txqlen: int | None = None,
             up: bool = False) -> None:
    """Set what is given of the link ``idx`` (``name`` for the error message), as `ip link set`."""
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, idx, IFF_UP if up else 0, IFF_UP if up else 0)
    if mtu is not None:
        body += nl.attr(IFLA_MTU, struct.pack("=I", int(mtu)))
    if txqlen is not None:
        body += nl.attr(IFLA_TXQLEN, struct.pack("=I", int(txqlen)))
    what = ", ".join(w for w, v in (("mtu", mtu), ("txqueuelen", txqlen), ("up", up or None))
                     if v is not None)
    call(RTM_NEWLINK, 0, body, f"set {what} of {name}")


# --------------------------------------------------------------------------- addresses

def addresses(family: int, idx: int = 0, sock=None) -> list[dict]:
    """The addresses of ``family`` (of the link ``idx`` only, when given), each a dict: index,
    prefixlen, flags (IFA_FLAGS when the kernel sends it: the header holds the low 8 bits),
    scope, address (IFA_ADDRESS) and local (IFA_LOCAL, None without), as strings. On ``sock``
    (netlink_batch.open_socket's) when given."""
    out = []
    for msg in nl.dump(RTM_GETADDR, IFADDRMSG.pack(family, 0, 0, 0, 0), sock):
        fam, plen, flags, scope, at = IFADDRMSG.unpack_from(msg)
        if fam != family or (idx and at != idx):
            continue
        a = nl.attrs(msg, IFADDRMSG.size)
        addr, local = a.get(IFA_ADDRESS), a.get(IFA_LOCAL)
        out.append({"index": at, "prefixlen": plen, "scope": scope,
                    "flags": _u32(a[IFA_FLAGS]) if IFA_FLAGS in a else flags,
                    "address": socket.inet_ntop(fam, addr) if addr else None,
                    "local": socket.inet_ntop(fam, local) if local else None})
    return out


def _addr_body(idx: int, iface) -> bytes:
    fam = socket.AF_INET6 if iface.version == 6 else socket.AF_INET
    packed = iface.ip.packed
    return (IFADDRMSG.pack(fam, iface.network.prefixlen, 0, 0, idx)
            + nl.attr(IFA_LOCAL, packed) + nl.attr(IFA_ADDRESS, packed))


def addr_add(idx: int, name: str, iface) -> bool:
    """Add ``iface`` (an ip_interface) to the link ``idx``; False when it was there already."""
    try:
        call(RTM_NEWADDR, F_CREATE | F_EXCL, _addr_body(idx, iface), f"add address {iface} to {name}")
    except OSError as e:
        if e.errno != errno.EEXIST:
            raise
        return False
    return True


def addr_del(idx: int, name: str, iface) -> None:
    call(RTM_DELADDR, 0, _addr_body(idx, iface), f"remove address {iface} from {name}")


# --------------------------------------------------------------------------- routes

def route_add(network, idx: int, dev: str) -> bool:
    """``<network> dev <dev>`` in the main table, proto boot and scope universe as `ip route add`
    sends it; False when it was there already."""
    net = ipaddress.ip_network(network)
    fam = socket.AF_INET6 if net.version == 6 else socket.AF_INET
    body = (nl.RTMSG.pack(fam, net.prefixlen, 0, 0, MAIN_TABLE, RTPROT_BOOT, 0, RTN_UNICAST, 0)
            + nl.attr(RTA_DST, net.network_address.packed)
            + nl.attr(RTA_OIF, struct.pack("=i", idx)))
    try:
        call(RTM_NEWROUTE, F_CREATE | F_EXCL, body, f"add route {net} dev {dev}")
    except OSError as e:
        if e.errno != errno.EEXIST:
            raise
        return False
    return True


def route_get(dst) -> dict:
    """The kernel's answer to `ip route get <dst>`: its attributes by type (RTA_*), and "type"."""
    ip = ipaddress.ip_address(dst)
    fam = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    body = (nl.RTMSG.pack(fam, ip.max_prefixlen, 0, 0, 0, 0, 0, 0, 0)
            + nl.attr(RTA_DST, ip.packed))
    answer = call(RTM_GETROUTE, 0, body, f"route get {ip}") or b""
    found = nl.attrs(answer)
    found["type"] = nl.RTMSG.unpack_from(answer)[7] if len(answer) >= nl.RTMSG.size else 0
    return found


def default_route_oifs(family: int = socket.AF_INET, table: int = MAIN_TABLE) -> list[int]:
    """The outgoing interface of each default route of ``table`` (a multipath one's first
    hop's), in the kernel's order; 0 for one with neither."""
    out = []
    for msg in nl.dump(RTM_GETROUTE, nl.RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)):
        if len(msg) < nl.RTMSG.size or msg[1] != 0:      # rtm_dst_len: defaults only
            continue
        a = nl.attrs(msg)
        if (_u32(a[RTA_TABLE]) if RTA_TABLE in a else msg[4]) != table:
            continue
        if RTA_OIF in a:
            out.append(struct.unpack("=i", a[RTA_OIF][:4])[0])
        elif len(a.get(RTA_MULTIPATH, b"")) >= 8:       # struct rtnexthop: len, flags, hops, ifindex
            out.append(struct.unpack_from("=HBBi", a[RTA_MULTIPATH])[3])
        else:
            out.append(0)
    return out
