"""Netlink configuration of the TUN device and lookups of interfaces and of this host's
addresses (rtnetlink, host/rtnl.py), and the sysctls flannel0 needs (accept_local; with a dual-stack lease
the per-device IPv6 ones).

What flanneld does after opening the TUN (docs/flannel-compat.md#tun-device): address
``<lease network>/32``, MTU = external interface MTU - 28, link up, then one
route ``<Network> dev flannel0`` (EEXIST ignored). A lease with an IPv6 part adds, before the
link is up, ``<IPv6 lease network>/128`` and, after, ``<IPv6Network> dev flannel0``
(:func:`prepare_ipv6` says why each sysctl).

All functions act on the network namespace of the calling thread, and fail with an OSError
carrying the kernel's errno.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
import threading

from . import netlink_batch as nl, rtnl

ENCAP_OVERHEAD = 28  # outer IPv4 header (20) + UDP header (8), flanneld's encapOverhead
IPV6_MTU_MIN = 1280  # RFC 8200 section 5: a link that carries IPv6 carries 1280 bytes at least
PROC_IPV6 = "/proc/sys/net/ipv6"

# Written on flannel0 before the link is up, in this order (disable_ipv6 last: the others are
# in place when IPv6 starts on the device):
#  addr_gen_mode=1   no link-local address: the kernel would make one (a TUN has no MAC, so a
#                    random one) and then speak ND, MLD and router solicitations from it into
#                    the engines, which drop them (drop_scope) but count every one;
#  accept_dad=0      no duplicate address detection: no neighbour answers on a TUN, and the
#                    address would stay "tentative", unusable as a source, for a second or more;
#  accept_ra=0, router_solicitations=0: no router lives behind flannel0, routes come from leases;
#  disable_ipv6=0    the device's own switch: a host may disable IPv6 by default
#                    (net.ipv6.conf.default.disable_ipv6=1) and enable it per device, as the CNI
#                    plugins do for the pods' interfaces.
IPV6_SYSCTLS = (("addr_gen_mode", "1"), ("accept_dad", "0"), ("accept_ra", "0"),
                ("router_solicitations", "0"), ("disable_ipv6", "0"))


def configure_tun(name: str, addrs, mtu: int, txqueuelen: int | None = None) -> None:
    """Give ``name`` the addresses ``addrs`` (one per family: ``"10.5.84.0/32"``,
    ``"fc00:5:0:54::/128"``, interfaces, or bare addresses meaning a host prefix; one alone
    needs no list), set its MTU (and ``txqueuelen``, the packets each queue holds while nobody
    reads it) and bring it up; an IPv6 address is set up before the link is up
    (:func:`prepare_ipv6`). An address that is already there is not an error (idempotent). The
    queue length is set before the link goes up only: the kernel drops what is sent to an up
    device while it resizes its queues."""
    ifaces = [ipaddress.ip_interface(a) for a in ([addrs] if isinstance(addrs, str) else addrs)]
    if any(i.version == 6 for i in ifaces):
        prepare_ipv6(name)
    idx = rtnl.index(name)
    for iface in ifaces:
        rtnl.addr_add(idx, name, iface)
    rtnl.link_set(idx, name, mtu=int(mtu))
    if txqueuelen is not None:
        rtnl.link_set(idx, name, txqlen=int(txqueuelen))
    rtnl.link_set(idx, name, up=True)


def _del_address(idx: int, name: str, iface) -> None:
    """Remove ``iface``; one gone already is no error."""
    try:
        rtnl.addr_del(idx, name, iface)
    except OSError as e:
        if e.errno != errno.EADDRNOTAVAIL:
            raise


def _interface(a: dict):
    """An address of :func:`rtnl.addresses` as an interface; for IPv4 IFA_LOCAL first (on a
    point-to-point link IFA_ADDRESS is the far end's)."""
    return ipaddress.ip_interface(f"{a['local'] or a['address']}/{a['prefixlen']}")


def remove_address(name: str, addr) -> None:
    """Remove ``addr`` (an interface of either family, ``"10.5.84.0/32"``) from ``name``:
    flannel0's old address when the lease moves to another subnet."""
    iface = ipaddress.ip_interface(addr)
    rtnl.addr_del(rtnl.index(name), name, iface)


def remove_other_leases(name: str, parts) -> list:
    """Take from ``name`` (flannel0) the addresses another lease gave it, and return them
    (interfaces): a persistent flannel0 (the kernel path's) taken up again under another lease
    keeps the old one's beside the new. Only what this scheme puts there goes: in each family
    of ``parts`` (host/family.py Part) that has a lease subnet, a host prefix (/32, /128) that
    starts a subnet of the lease's size and is not the lease's own address; whatever else an
    operator put on flannel0 stays. The new address is there already (configure_tun), so the
    kernel keeps flannel0's routes."""
    removed = []
    idx = rtnl.index(name)
    for part in parts:
        if part.subnet is None:
            continue
        want = ipaddress.ip_interface(part.tun_addr)
        fam = socket.AF_INET6 if want.version == 6 else socket.AF_INET
        for a in rtnl.addresses(fam, idx):
            got = _interface(a)
            start = ipaddress.ip_network(f"{got.ip}/{part.subnet.prefixlen}", strict=False)
            if got == want or got.network.prefixlen != got.max_prefixlen or \
                    start.network_address != got.ip or got.ip.is_link_local:
                continue
            _del_address(idx, name, got)
            removed.append(got)
    return removed


def ipv6_unavailable() -> str | None:
    """Why this host cannot give flannel0 an IPv6 address, or None. Only a kernel without IPv6
    (booted with ipv6.disable=1, or built without it) is a hard no: a host that disables it by
    sysctl keeps it per device (:data:`IPV6_SYSCTLS`)."""
    if not os.path.isdir(os.path.join(PROC_IPV6, "conf")):
        return (f"this kernel has no IPv6 ({PROC_IPV6} is missing: booted with ipv6.disable=1, "
                "or built without IPv6)")
    return None


def prepare_ipv6(name: str) -> None:
    """The per-device IPv6 sysctls of :data:`IPV6_SYSCTLS` on ``name``, meant for a link that is
    still down (on an up link they hold from now on; a link-local address made already stays)."""
    for key, value in IPV6_SYSCTLS:
        path = os.path.join(PROC_IPV6, "conf", name, key)
        try:
            with open(path, "w") as f:
                f.write(value)
        except OSError as e:
            raise OSError(e.errno, f"cannot write {path} = {value}: {e.strerror}") from None


def set_ipv6_address(name: str, addr6) -> list:
    """``name``'s one global IPv6 address is ``addr6`` from now on: added (EEXIST is no error),
    then every other IPv6 address on it but link-local ones removed (a moved lease's, or a
    previous daemon's). Returns the removed ones (IPv6Interface). flannel0 is ours alone, so
    any other address there is stale."""
    want = ipaddress.IPv6Interface(addr6)
    removed = []
    idx = rtnl.index(name)
    rtnl.addr_add(idx, name, want)
    for got in _ipv6_interfaces(idx):
        if got != want and not got.ip.is_link_local:
            _del_address(idx, name, got)
            removed.append(got)
    return removed


def _ipv6_interfaces(idx: int) -> list:
    return [ipaddress.IPv6Interface(f"{a['address']}/{a['prefixlen']}")
            for a in rtnl.addresses(socket.AF_INET6, idx)]


def ipv6_addresses(name: str) -> list:
    """The IPv6 addresses of ``name`` (IPv6Interface each), link-local ones included."""
    return _ipv6_interfaces(rtnl.index(name))


def set_accept_local(name: str) -> None:
    """Accept packets whose source is a local address on ``name`` (a sysctl, not netlink).

    The engine's ICMP net-unreachable comes back through flannel0 with the source <lease net>
    (flannel0's own address). The kernel drops a packet whose source is a local address as a
    martian unless accept_local is set on the receiving device, so without this the ICMP
    (flanneld's included) never reaches the sender. Only this device is touched. It is safe
    because the engine writes nothing else with a local source into flannel0: a datagram whose
    inner source is this host's own is dropped first (host/own_sources.py,
    docs/threat-model.md)."""
    with open(f"/proc/sys/net/ipv4/conf/{name}/accept_local", "w") as f:
        f.write("1")


def _host_addresses(sock=None) -> list:
    v4 = [ipaddress.IPv4Address(m["local"] or m["address"])
          for m in rtnl.addresses(socket.AF_INET, sock=sock)]
    v6 = [ipaddress.IPv6Address(m["address"])
          for m in rtnl.addresses(socket.AF_INET6, sock=sock)]
    # Link-local IPv6 sources never pass the engines (drop_scope), and a host has one per
    # interface (each pod's veth): listing them would only grow the engine's set.
    return v4 + [a for a in v6 if not a.is_link_local]


def host_addresses() -> list:
    """Every IPv4 and IPv6 address (link-local ones left out) of every interface in this
    network namespace (IPv4Address or IPv6Address each): the inner sources no datagram may
    claim (host/own_sources.py). For IPv4 IFA_LOCAL first: on a point-to-point link
    IFA_ADDRESS is the far end's. OSError when netlink refuses."""
    return _host_addresses()


class AddressReader:
    """``host_addresses()`` over one netlink socket kept open, for a caller that asks every
    second (no socket made and bound per read, perf/README.md#netlink-socket). A failed read
    drops the socket; the next call opens a new one. Calls are serialised."""

    def __init__(self):
        self._sock = None
        self._lock = threading.Lock()

    def __call__(self) -> list:
        with self._lock:
            if self._sock is None:
                self._sock = nl.open_socket()
            try:
                return _host_addresses(self._sock)
            except Exception:
                self._close()
                raise

    def _close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def close(self) -> None:
        with self._lock:
            self._close()


def link_exists(name: str) -> bool:
    try:
        rtnl.index(name)
    except OSError:
        return False
    return True


def link_facts(name: str) -> tuple[int, list]:
    """``(MTU, IPv4 addresses as IPv4Interface)`` of ``name``: what a daemon handed an open
    flannel0 compares with what it would configure. OSError ENODEV when there is no ``name``."""
    idx = rtnl.index(name)
    return rtnl.link_mtu(idx), [_interface(a) for a in rtnl.addresses(socket.AF_INET, idx)]


def add_network_route(network, dev: str) -> bool:
    """Add ``<network> dev <dev>`` (scope universe, no src, as flanneld), of either family.
    Returns False if the route already existed (EEXIST is ignored)."""
    # proto boot, as `ip route add` and flanneld (vishvananda/netlink) send it.
    return rtnl.route_add(network, rtnl.index(dev), dev)


def iface_mtu(name: str) -> int:
    """MTU of the interface called ``name``."""
    return rtnl.link_mtu(rtnl.index(name))


def iface_for_addr(ip) -> str:
    """Name of the interface that holds the IPv4 address ``ip``."""
    ip = str(ipaddress.IPv4Address(ip))
    for msg in rtnl.addresses(socket.AF_INET):
        if msg["local"] == ip or msg["address"] == ip:
            return socket.if_indextoname(msg["index"])
    raise OSError(errno.EADDRNOTAVAIL, f"no interface has the address {ip}")


def mtu_for_addr(ip) -> int:
    """MTU of the interface that holds ``ip`` (the external interface)."""
    return iface_mtu(iface_for_addr(ip))


def tun_mtu_for_addr(ip) -> int:
    """flannel0's MTU for an external interface holding ``ip``: its MTU - 28."""
    return mtu_for_addr(ip) - ENCAP_OVERHEAD
