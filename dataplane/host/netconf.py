"""Netlink configuration of the TUN device and lookups of interfaces and of this host's
addresses (pyroute2), and the one sysctl flannel0 needs (accept_local).

What flanneld does after opening the TUN (docs/flannel-compat.md#tun-device): address
``<lease network>/32``, MTU = external interface MTU - 28, link up, then one
route ``<Network> dev flannel0`` (EEXIST ignored).

All functions use pyroute2's *synchronous* ``IPRoute`` and act on the network
namespace of the calling thread. pyroute2 0.9's sync API must not be called
from a thread that runs an asyncio loop; from a coroutine use
``await asyncio.to_thread(configure_tun, ...)``. We check and raise a clear
error rather than failing somewhere inside pyroute2.
"""
from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
import threading

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

ENCAP_OVERHEAD = 28  # outer IPv4 header (20) + UDP header (8), flanneld's encapOverhead


def _ipr() -> IPRoute:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return IPRoute()
    raise RuntimeError("dataplane.host.netconf uses pyroute2's sync IPRoute, which must not run inside "
                       "an asyncio loop: call it with asyncio.to_thread(...)")


def _index(ipr: IPRoute, name: str) -> int:
    idx = ipr.link_lookup(ifname=name)
    if not idx:
        raise OSError(errno.ENODEV, f"no such network interface: {name}")
    return idx[0]


def configure_tun(name: str, addr, mtu: int, txqueuelen: int | None = None) -> None:
    """Give ``name`` the address ``addr`` (``"10.5.84.0/32"``, an
    IPv4Interface, or a bare address meaning /32), set its MTU (and ``txqueuelen``, the packets
    each queue holds while nobody reads it) and bring it up.
    An address that is already there is not an error (idempotent). The queue length is set
    before the link goes up only: the kernel drops what is sent to an up device while it
    resizes its queues."""
    iface = ipaddress.IPv4Interface(addr)
    with _ipr() as ipr:
        idx = _index(ipr, name)
        try:
            ipr.addr("add", index=idx, address=str(iface.ip), prefixlen=iface.network.prefixlen)
        except NetlinkError as e:
            if e.code != errno.EEXIST:
                raise
        ipr.link("set", index=idx, mtu=int(mtu))
        if txqueuelen is not None:
            ipr.link("set", index=idx, txqlen=int(txqueuelen))
        ipr.link("set", index=idx, state="up")


def remove_address(name: str, addr) -> None:
    """Remove ``addr`` (an IPv4Interface or ``"10.5.84.0/32"``) from ``name``: flannel0's old
    address when the lease moves to another subnet."""
    iface = ipaddress.IPv4Interface(addr)
    with _ipr() as ipr:
        ipr.addr("del", index=_index(ipr, name), address=str(iface.ip),
                 prefixlen=iface.network.prefixlen)


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


def _ipv4_addresses(ipr: IPRoute) -> list:
    try:
        return [ipaddress.IPv4Address(m.get("IFA_LOCAL") or m.get("IFA_ADDRESS"))
                for m in ipr.get_addr(family=socket.AF_INET)]
    except NetlinkError as e:
        raise OSError(e.code, f"netlink: {e}") from None


def host_addresses() -> list:
    """Every IPv4 address of every interface in this network namespace (IPv4Address each):
    the inner sources no datagram may claim (host/own_sources.py). IFA_LOCAL first: on a
    point-to-point link IFA_ADDRESS is the far end's. OSError when netlink refuses."""
    with _ipr() as ipr:
        return _ipv4_addresses(ipr)


class AddressReader:
    """``host_addresses()`` over one netlink socket kept open, for a caller that asks every
    second: opening an IPRoute costs far more CPU than reading on an open one, and leaves memory
    behind each time (perf/README.md#netlink-socket). A failed read drops the
    socket; the next call opens a new one. Calls are serialised."""

    def __init__(self):
        self._ipr = None
        self._lock = threading.Lock()

    def __call__(self) -> list:
        with self._lock:
            if self._ipr is None:
                self._ipr = _ipr()
            try:
                return _ipv4_addresses(self._ipr)
            except Exception:
                self._close()
                raise

    def _close(self) -> None:
        ipr, self._ipr = self._ipr, None
        if ipr is not None:
            ipr.close()

    def close(self) -> None:
        with self._lock:
            self._close()


def link_exists(name: str) -> bool:
    with _ipr() as ipr:
        return bool(ipr.link_lookup(ifname=name))


def link_facts(name: str) -> tuple[int, list]:
    """``(MTU, IPv4 addresses as IPv4Interface)`` of ``name``: what a daemon handed an open
    flannel0 compares with what it would configure. OSError ENODEV when there is no ``name``."""
    with _ipr() as ipr:
        idx = _index(ipr, name)
        link = ipr.get_links(idx)[0]
        addrs = [ipaddress.IPv4Interface(f"{a.get('IFA_LOCAL') or a.get('IFA_ADDRESS')}/"
                                         f"{a['prefixlen']}")
                 for a in ipr.get_addr(index=idx, family=2)]
        return int(link.get("mtu")), addrs


def add_network_route(network, dev: str) -> bool:
    """Add ``<network> dev <dev>`` (scope universe, no src, as flanneld).
    Returns False if the route already existed (EEXIST is ignored)."""
    net = ipaddress.IPv4Network(network)
    with _ipr() as ipr:
        idx = _index(ipr, dev)
        try:
            # proto boot, as `ip route add` and flanneld (vishvananda/netlink) send it.
            ipr.route("add", dst=str(net), oif=idx, proto=3)
        except NetlinkError as e:
            if e.code != errno.EEXIST:
                raise
            return False
    return True


def iface_mtu(name: str) -> int:
    """MTU of the interface called ``name``."""
    with _ipr() as ipr:
        link = ipr.get_links(_index(ipr, name))[0]
        return int(link.get("mtu"))


def iface_for_addr(ip) -> str:
    """Name of the interface that holds the IPv4 address ``ip``."""
    ip = str(ipaddress.IPv4Address(ip))
    with _ipr() as ipr:
        for msg in ipr.get_addr(family=2):
            if msg.get("IFA_LOCAL") == ip or msg.get("IFA_ADDRESS") == ip:
                return ipr.get_links(msg["index"])[0].get("ifname")
    raise OSError(errno.EADDRNOTAVAIL, f"no interface has the address {ip}")


def mtu_for_addr(ip) -> int:
    """MTU of the interface that holds ``ip`` (the external interface)."""
    return iface_mtu(iface_for_addr(ip))


def tun_mtu_for_addr(ip) -> int:
    """flannel0's MTU for an external interface holding ``ip``: its MTU - 28."""
    return mtu_for_addr(ip) - ENCAP_OVERHEAD
