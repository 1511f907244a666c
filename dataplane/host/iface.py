"""External interface selection, with flanneld's rules.

The external interface carries the encapsulated traffic: the UDP socket is
bound to its address, flannel0's MTU is its MTU - 28, and (unless
``--public-ip``) its address is the PublicIP of this host's lease.

Rules (flanneld ``main.go`` / ``LookupExtIface``), in order:

1. no ``--iface``/``--iface-regex``/``--iface-can-reach``: the interface that
   holds ``--public-ip`` if given, else the interface of the IPv4 default route
   of the main table;
2. otherwise each ``--iface`` in order (an IP selects the interface holding
   it, with that address; anything else is a name), first found wins; then
   each ``--iface-regex`` in order, matched against every interface's usable
   IPv4 addresses (below, in their order) first, then against the interface
   names; then ``--iface-can-reach`` (the interface ``ip route get IP`` would
   use, with the route's source address). Nothing found is an error.

The address, unless a rule chose one, is the first of the interface's usable
IPv4 addresses in flanneld v0.28.9's order (v0.20.2 took the first global one
in kernel order):

* usable: global unicast in Go's sense (not unspecified, loopback,
  link-local, multicast or broadcast; private ranges count) or link-local
  (169.254/16), and not deprecated (``IFA_F_DEPRECATED``, ``preferred_lft 0``);
* order: global before link-local, then permanent (``IFA_F_PERMANENT``: added
  by hand or by a static network config) before dynamic (DHCP, with a
  ``valid_lft``), then non-temporary before temporary (for IPv4 the kernel's
  ``IFA_F_SECONDARY``, the same bit); ties keep kernel order.

So on a host with a DHCP address and a static one, the static one is the
PublicIP whichever came first, and a flannel-udp host and a flanneld host
pick the same address and therefore the same lease. An address given by IP
(``--iface IP``, ``--public-ip`` alone, the source of ``--iface-can-reach``)
is taken as it is, whatever its flags.

With EnableIPv6 the host's PublicIPv6 (the IPv6 underlay, docs/operating.md#dual-stack) is
``--public-ipv6`` if given, else the first of the chosen interface's usable IPv6 addresses in the
same order (flanneld v0.28.9 sorts and filters IPv6 addresses as IPv4 ones), but global only:
flanneld also falls back to a link-local address, which names no peer without a scope and so
cannot carry the overlay between hosts (:func:`preferred_ipv6`).

Netlink access goes through :class:`NetlinkView` so the rules can be tested
without root against a fake (:class:`StaticView`).
"""
from __future__ import annotations

import ipaddress
import logging
import re
import socket
import struct
from dataclasses import dataclass, field

from . import rtnl

log = logging.getLogger(__name__)

ENCAP_OVERHEAD = 28  # 20 bytes outer IPv4 + 8 bytes UDP (flanneld's encapOverhead)
ENCAP_OVERHEAD6 = 48  # 40 bytes outer IPv6 + 8 bytes UDP: a route over the IPv6 underlay


class IfaceError(RuntimeError):
    """No usable external interface; the message says what to change."""


# ifa_flags bits (linux/if_addr.h); IPv4 marks a secondary address with the bit IPv6 uses for a
# temporary one, and flanneld's order tests that bit whatever the family
IFA_F_SECONDARY = 0x01
IFA_F_TEMPORARY = IFA_F_SECONDARY
IFA_F_DEPRECATED = 0x20
IFA_F_PERMANENT = 0x80


@dataclass(frozen=True)
class Addr:
    """One address of a link (IPv4 or IPv6) and its IFA_F_* flags."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    flags: int = IFA_F_PERMANENT

    def __post_init__(self):
        object.__setattr__(self, "ip", ipaddress.ip_address(self.ip))

    def __str__(self):
        return str(self.ip)


@dataclass(frozen=True)
class Link:
    name: str
    index: int
    mtu: int
    # IPv4 addresses in kernel order, as Addr; a plain string is a permanent address (a static
    # config's, the common case), so fakes can list addresses as strings
    addrs: tuple = ()
    addrs6: tuple = ()      # its IPv6 addresses, the same way

    def __post_init__(self):
        for name in ("addrs", "addrs6"):
            object.__setattr__(self, name, tuple(a if isinstance(a, Addr) else Addr(a)
                                                 for a in getattr(self, name)))


@dataclass(frozen=True)
class ExternalInterface:
    name: str
    index: int
    mtu: int
    iface_addr: ipaddress.IPv4Address   # the UDP socket binds here
    ext_addr: ipaddress.IPv4Address     # PublicIP written into the lease
    # the interface's first usable global IPv6 address (:func:`preferred_ipv6`), or None: the
    # IPv6 sockets bind here unless --public-ipv6 is an address of the interface
    iface_addr6: ipaddress.IPv6Address | None = None
    # what the interface holds of IPv6, for :func:`underlay6`
    addrs6: tuple = ()

    @property
    def tun_mtu(self) -> int:
        return self.mtu - ENCAP_OVERHEAD


def is_global_unicast(addr) -> bool:
    """Go's net.IP.IsGlobalUnicast (private ranges and IPv6 ULAs included)."""
    a = ipaddress.ip_address(addr)
    return not (a.is_unspecified or a.is_loopback or a.is_link_local or a.is_multicast
                or a == ipaddress.IPv4Address("255.255.255.255"))


def ipv6_underlay_problem(addr) -> str | None:
    """Why ``addr`` cannot be a host's PublicIPv6 (the IPv6 underlay), or None: it must be a
    global unicast IPv6 address; an IPv4-mapped one is the IPv4 underlay's."""
    a = ipaddress.IPv6Address(addr)
    if a.ipv4_mapped is not None:
        return "an IPv4-mapped address (the IPv4 underlay is --public-ip's)"
    if not is_global_unicast(a):
        return ("not a global unicast address (::, ::1, link-local fe80::/10 and multicast "
                "ff00::/8 name no other host)")
    return None


def _preference(a: Addr, b: Addr) -> int:
    """flanneld's comparison of two addresses: < 0 when ``a`` is preferred."""
    a_global, b_global = is_global_unicast(a.ip), is_global_unicast(b.ip)
    if a_global and b.ip.is_link_local:
        return -1
    if a.ip.is_link_local and b_global:
        return 1
    for bit, wanted in ((IFA_F_PERMANENT, True), (IFA_F_TEMPORARY, False)):
        a_has, b_has = bool(a.flags & bit), bool(b.flags & bit)
        if a_has != b_has:
            return -1 if a_has == wanted else 1
    return 0


def usable_ipv4s(link: Link) -> list:
    """The link's addresses flanneld would use, most preferred first (see the module doc)."""
    # Sorted before filtering and by insertion, the steps flanneld's sort takes: its comparison is
    # not transitive once an address that is neither global nor link-local (127.x on a veth) sits
    # between two others, and only the same steps give the same order then. Go sorts up to 12
    # elements by insertion, which keeps ties in kernel order; beyond 12, ties may come out of
    # flanneld in another order.
    order = list(link.addrs)
    for i in range(1, len(order)):
        j = i
        while j > 0 and _preference(order[j], order[j - 1]) < 0:
            order[j - 1], order[j] = order[j], order[j - 1]
            j -= 1
    return [a.ip for a in order
            if (is_global_unicast(a.ip) or a.ip.is_link_local) and not a.flags & IFA_F_DEPRECATED]


def preferred_ipv4(link: Link):
    """The address flanneld takes from this link when no rule chose one; None if it has none."""
    usable = usable_ipv4s(link)
    return usable[0] if usable else None


def preferred_ipv6(link: Link):
    """The link's PublicIPv6 when no --public-ipv6 is given: the first of its IPv6 addresses in
    flanneld's order (:func:`usable_ipv4s` on them) that can carry the overlay; None if none."""
    usable = usable_ipv4s(Link(link.name, link.index, link.mtu, link.addrs6))
    return next((a for a in usable if ipv6_underlay_problem(a) is None), None)


def underlay6(ext: ExternalInterface, public_ipv6: str = ""):
    """``(PublicIPv6, the address its sockets bind)`` of the IPv6 underlay, or ``(None, None)``
    when there is none: ``public_ipv6`` (--public-ipv6, checked) is bound when the interface
    holds it, else (a NATed address, as --public-ip) the interface's own; with neither given nor
    held, the interface's first usable global IPv6 address is both."""
    if public_ipv6:
        pub = ipaddress.IPv6Address(public_ipv6)
        why = ipv6_underlay_problem(pub)
        if why is not None:
            raise IfaceError(f"--public-ipv6 {public_ipv6} is {why}")
        held = pub in ext.addrs6
        return pub, pub if held else ext.iface_addr6
    return ext.iface_addr6, ext.iface_addr6


# --------------------------------------------------------------------------
# netlink views

class NetlinkView:
    """What the rules need from the kernel, read over rtnetlink (host/rtnl.py; no root needed)."""

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def links(self) -> list[Link]:
        addrs = {socket.AF_INET: {}, socket.AF_INET6: {}}
        for family, of_family in addrs.items():
            for a in rtnl.addresses(family):
                ip = a["local"] or a["address"]
                if ip:
                    # the header holds only the low 8 bits; IFA_FLAGS, when the kernel sends
                    # it, holds them all and wins (as in flanneld's netlink library)
                    of_family.setdefault(a["index"], []).append(Addr(ip, a["flags"]))
        out = [Link(name, idx, mtu, tuple(addrs[socket.AF_INET].get(idx, ())),
                    tuple(addrs[socket.AF_INET6].get(idx, ())))
               for idx, name, mtu in rtnl.links()]
        out.sort(key=lambda l: l.index)
        return out

    def default_route_ifindex(self):
        for oif in rtnl.default_route_oifs(socket.AF_INET, 254):
            if oif:
                return oif
        return None

    def route_get(self, dst: str):
        """(ifindex, preferred source or None) of `ip route get dst`."""
        answer = rtnl.route_get(dst)
        if rtnl.RTA_OIF not in answer:
            return None, None
        src = answer.get(rtnl.RTA_PREFSRC)
        return (struct.unpack("=i", answer[rtnl.RTA_OIF][:4])[0],
                socket.inet_ntoa(src) if src and len(src) == 4 else None)


@dataclass
class StaticView:
    """A fixed view for tests: links, default route interface, route_get map."""
    links_: list = field(default_factory=list)
    default_ifindex: int | None = None
    routes: dict = field(default_factory=dict)   # dst ip -> (ifindex, src)

    def links(self):
        return list(self.links_)

    def default_route_ifindex(self):
        return self.default_ifindex

    def route_get(self, dst):
        if dst not in self.routes:
            raise OSError(101, "Network is unreachable")
        return self.routes[dst]

    def close(self):
        pass


# --------------------------------------------------------------------------
# the rules

def _describe(links) -> str:
    return ", ".join(f"{l.name}:{preferred_ipv4(l) or '-'}" for l in links)


def _by_ip(links, ip: str):
    want = ipaddress.IPv4Address(ip)
    for l in links:
        if any(a.ip == want for a in l.addrs):     # any address, as flanneld: flags do not matter
            return l, want
    return None, None


def _lookup_one(links, view, iface: str = "", regex: str = "", can_reach: str = ""):
    """One LookupExtIface call: returns (link, addr or None) or raises IfaceError."""
    if iface:
        try:
            ipaddress.IPv4Address(iface)
            is_ip = True
        except ValueError:
            is_ip = False
        if is_ip:
            link, addr = _by_ip(links, iface)
            if link is None:
                raise IfaceError(f"no interface has the address {iface}")
            return link, addr
        for l in links:
            if l.name == iface:
                return l, None
        raise IfaceError(f"no interface named {iface}")
    if regex:
        rx = re.compile(regex)
        for l in links:                 # IPs first, the usable ones in preference order ...
            for a in usable_ipv4s(l):
                if rx.search(str(a)):
                    return l, a
        for l in links:                 # ... then names
            if rx.search(l.name):
                return l, None
        raise IfaceError(f"could not match pattern {regex} to any of the available network "
                         f"interfaces ({_describe(links)})")
    if can_reach:
        try:
            idx, src = view.route_get(can_reach)
        except OSError as e:
            raise IfaceError(f"failed to get the interface that can reach {can_reach}: {e}") from None
        for l in links:
            if l.index == idx:
                return l, ipaddress.IPv4Address(src) if src else None
        raise IfaceError(f"no interface found to reach {can_reach}")
    idx = view.default_route_ifindex()
    if idx is None:
        raise IfaceError("unable to find the default route: give --iface NAME (or IP), "
                         "--iface-regex or --iface-can-reach")
    for l in links:
        if l.index == idx:
            return l, None
    raise IfaceError(f"the default route's interface (index {idx}) was not found")


def _finish(link: Link, addr, public_ip: str) -> ExternalInterface:
    if not link.mtu:
        raise IfaceError(f"failed to determine the MTU of {link.name}")
    if addr is None:
        addr = preferred_ipv4(link)
        if addr is None:
            raise IfaceError(f"failed to find an IPv4 address for interface {link.name}: "
                             "give it an address or choose another with --iface")
    ext = ipaddress.IPv4Address(public_ip) if public_ip else addr
    return ExternalInterface(link.name, link.index, link.mtu, addr, ext, preferred_ipv6(link),
                             tuple(a.ip for a in link.addrs6))


_FLAG_OF = {"iface": "--iface", "regex": "--iface-regex", "can_reach": "--iface-can-reach"}


def select_interface(ifaces=(), regexes=(), can_reach: str = "", public_ip: str = "",
                     view=None) -> ExternalInterface:
    """Pick the external interface with flanneld's rules (see the module doc)."""
    own_view = view is None
    view = view if view is not None else NetlinkView()
    try:
        links = view.links()
        if not ifaces and not regexes and not can_reach:
            if public_ip:
                log.info("Searching for the interface that holds --public-ip %s", public_ip)
                link, addr = _lookup_one(links, view, iface=public_ip)
            else:
                log.info("Determining IP address of default interface")
                link, addr = _lookup_one(links, view)
            ext = _finish(link, addr, public_ip)
        else:
            ext = None
            errors = []
            # flanneld's order: every --iface, then every --iface-regex, then --iface-can-reach
            tries = ([("iface", name) for name in ifaces] + [("regex", rx) for rx in regexes]
                     + ([("can_reach", can_reach)] if can_reach else []))
            for kind, value in tries:
                try:
                    ext = _finish(*_lookup_one(links, view, **{kind: value}), public_ip)
                    break
                except IfaceError as e:
                    if kind != "can_reach":
                        log.info("Could not find a valid interface matching %s: %s", value, e)
                    errors.append(f"{_FLAG_OF[kind]} {value}: {e}")
            if ext is None:
                raise IfaceError("failed to find an interface that matches the interfaces and/or "
                                 "regexes provided (" + "; ".join(errors) + "); available: "
                                 + _describe(links))
    finally:
        if own_view:
            view.close()
    log.info("Using interface with name %s and address %s", ext.name, ext.iface_addr)
    if ext.ext_addr != ext.iface_addr:
        log.info("Using %s as external address (--public-ip)", ext.ext_addr)
    return ext
