"""The engine contract shared by the C engine and the pure-Python engine.

Both engines implement :class:`Engine` with the same behaviour, byte for byte
and counter for counter; ``csrc/dataplane.h`` is the normative description of
that behaviour (checks, their order, ICMP, checksums). The Python engine is the
oracle in the differential tests.
"""
from __future__ import annotations

import abc
import errno
import ipaddress
import logging
import os
import threading
from dataclasses import dataclass

# The facts of csrc/dataplane.h, from their one Python copy (contract.py);
# other modules import them from here.
from .contract import (BATCH_MAX, COALESCE_MAX_US, END_KINDS,  # noqa: F401
                       ICMP_BURST_DEFAULT, ICMP_RATE_DEFAULT,
                       LOCAL_MAX, MTU_MAX, MTU_MIN, OFF_TUN_GRO, OFF_TUN_GRO_UDP, OFF_TUN_VNET, OFF_UDP_GRO, OFF_UDP_GSO,
                       STAT_NAMES, TRACE_HEAD, TRACE_KINDS, TRACE_RING, V6_SHARES, WAKE_MS)

# Counters that depend on how an engine batches its syscalls; every other
# counter must be identical between engines for the same input.
SYSCALL_STATS = frozenset(
    {"syscalls", "tun_reads", "tun_writes", "udp_sends", "udp_recvs", "polls",
     "tx_batches", "rx_batches", "coalesce_waits"})
# Counters of the C engine's offloads (the *_gso/_gro fields of dp_stats and
# the UDP_GSO fallbacks): the Python engine has none, so they stay 0 there.
OFFLOAD_STATS = frozenset(n for n in STAT_NAMES
                          if n.endswith(("_gso", "_gro")) or n.startswith("udp_gso_"))
DROP_STATS = tuple(n for n in STAT_NAMES if n.startswith("drop_"))
DEFAULT_BATCH = 64
# The daemon's and forward's --coalesce-usecs: off, as measured in perf/README.md ("Coalescing":
# 20 us moved no rate and cost latency under load on this machine).
COALESCE_DEFAULT_US = 0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ended:
    """Why an engine's loop is no longer running: ``why`` is "stopped" (stop(),
    or never started), "tun_gone" (the TUN fd lost its device: ``ip link del``)
    or "error"; ``err`` is the errno that ended it (0 when stopped)."""
    why: str
    err: int = 0

    @property
    def tun_gone(self) -> bool:
        return self.why == "tun_gone"

    def __str__(self) -> str:
        text = {"tun_gone": "the TUN device is gone"}.get(self.why, self.why)
        if self.err:
            text += f" ({errno.errorcode.get(self.err, self.err)}: {os.strerror(self.err)})"
        return text


@dataclass(frozen=True)
class Route:
    """Packets to ``subnet`` go as UDP payload to ``peer_ip:port``. The subnet is of
    either family (an IPv6 one holds inner IPv6 packets). The peer says the underlay: an
    IPv4Address goes over the IPv4 socket, an IPv6Address over the IPv6 one
    (:meth:`Engine.set_udp`), for an IPv6 subnet only (dataplane.h, "The IPv6 underlay").
    ``mtu``: the largest inner packet the route carries, for an IPv6 subnet (0: the
    engine's mtu); a longer one gets ICMPv6 packet too big."""
    subnet: ipaddress.IPv4Network | ipaddress.IPv6Network
    peer_ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    mtu: int = 0

    @classmethod
    def make(cls, subnet, peer_ip, port: int, mtu: int = 0) -> "Route":
        """A Route from strings or address objects. An IPv4-mapped IPv6 peer
        (::ffff:a.b.c.d) is the IPv4 peer a.b.c.d; ValueError for an IPv6 peer of an IPv4
        subnet, or an mtu on an IPv4 subnet (the IPv4 table has none). The rest
        (port, mtu range, which IPv6 peers) is checked where the table is built
        (route_array.route_arrays), as the C engine checks it."""
        subnet = ipaddress.ip_network(subnet)
        peer = ipaddress.ip_address(peer_ip)
        if peer.version == 6 and peer.ipv4_mapped is not None:
            peer = peer.ipv4_mapped
        if subnet.version == 4 and (peer.version == 6 or mtu):
            raise ValueError(f"route {subnet} via {peer} mtu {mtu}: an IPv4 subnet takes an "
                             "IPv4 peer and no mtu")
        return cls(subnet, peer, int(port), int(mtu))


@dataclass(frozen=True)
class Local:
    """One family's share of Engine.set_local's arguments as checked: the lease subnet
    (network and prefix length, 0 and 0 for none) and the addresses, as host-order ints."""
    net: int
    prefixlen: int
    addrs: tuple


class EngineClosed(OSError):
    """Raised by calls on an engine after close()."""


class Engine(abc.ABC):
    """One forwarding loop between a TUN fd and a UDP socket fd.

    The engine is handed open fds and never opens or closes devices; the
    caller owns the fds. ``start()`` runs the loop in its own thread;
    ``stop()`` is prompt, thread-safe and idempotent; ``close()`` stops,
    joins and frees (idempotent too).
    """
    name: str = "?"

    def __init__(self, tun_fd: int, udp_fd: int, tun_addr, mtu: int,
                 batch: int = DEFAULT_BATCH, accept_any: bool = True):
        if not MTU_MIN <= int(mtu) <= MTU_MAX:
            raise ValueError(f"mtu {mtu} out of range {MTU_MIN}..{MTU_MAX}")
        if not 1 <= int(batch) <= BATCH_MAX:
            raise ValueError(f"batch {batch} out of range 1..{BATCH_MAX}")
        self.tun_fd = tun_fd
        # The underlay's socket per version: IPv4's from here, IPv6's once set_udp() has it.
        self.udp_fds = {4: udp_fd}
        self.tun_addr = ipaddress.IPv4Address(tun_addr)
        self.mtu = int(mtu)
        self.batch = int(batch)
        self.accept_any = bool(accept_any)
        # Run first in the loop thread, before the loop (host/sched.py: real-time scheduling);
        # set before start().
        self.thread_init = None
        self._end: Ended | None = None
        self._end_lock = threading.Lock()
        self._end_callbacks: list | None = []     # None once the loop has ended

    def ended(self) -> Ended | None:
        """None while the loop runs; else why it is not running. Set before the
        on_end() callbacks run, so that they and whoever they wake see it."""
        if self._end is not None:
            return self._end
        return Ended("stopped") if self.join(0) else None     # never started

    def on_end(self, callback) -> None:
        """Call ``callback(engine)`` once the loop has ended, whatever the reason:
        from the loop thread as it ends, or now if it already has. For callers
        that must react at once (the TUN gone) without polling ended()."""
        with self._end_lock:
            if self._end_callbacks is not None:
                self._end_callbacks.append(callback)
                return
        callback(self)

    def _thread_started(self) -> None:
        """The loop thread's first act: thread_init. Its failure costs what it asked for only
        (the caller checked it at startup: host/sched.py probe), never the loop."""
        if self.thread_init is None:
            return
        try:
            self.thread_init()
        except OSError as e:
            log.warning("%s engine loop: %s; it runs with the default scheduling", self.name, e)

    def _loop_ended(self, end: Ended) -> None:
        """The loop thread's last act: record why, then the callbacks of on_end()."""
        self._end = end
        with self._end_lock:
            callbacks, self._end_callbacks = self._end_callbacks or [], None
        for cb in callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("an engine's on_end callback failed")

    def offloads_in_use(self) -> int:
        """The OFF_* bits in use now: those of set_offloads(), less the ones the
        engine turned off on the way (UDP_GSO when the kernel cannot segment)."""
        return 0

    def heartbeat(self) -> int:
        """The loop's heartbeat (dataplane.h, dp_state.beats): a counter the loop thread moves on
        every pass, at least every WAKE_MS while it runs, idle or not; one that stays put while
        the loop should run means the thread hangs (daemon/liveness.py). Only its changes mean
        anything (it wraps). Cheap: no syscall, safe from any thread."""
        raise NotImplementedError

    # True when the forwarding loop runs Python bytecode: it then shares the interpreter lock
    # with the daemon's other Python work, which the daemon keeps out of its process where it can
    # (control/peer_process.py) and bounds where it cannot (the switch interval).
    forwards_in_python: bool = False

    # The route table this engine takes whole (engine/route_array.py's RouteArray for the C
    # engine, engine/pytable.py's RouteTable for the Python one): ``table_type.of(routes)``
    # builds one, ``table.updated(removed, added)`` the next one from a change.
    table_type: type = None

    def set_routes(self, routes) -> None:
        """Replace the whole route table atomically (iterable of Route)."""
        self.set_table(self.table_type.of(routes))

    @abc.abstractmethod
    def set_table(self, table) -> None:
        """Replace the whole route table atomically by ``table`` (a ``table_type``)."""

    @classmethod
    def publish_all(cls, engines, table) -> None:
        """``set_table(table)`` on several engines of this class (the queues of one host),
        each one switching right after the other."""
        for engine in engines:
            engine.set_table(table)

    @abc.abstractmethod
    def start(self) -> None:
        """Start the loop in a new thread."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Ask the loop to stop; returns at once."""

    # The loop thread, once start() made it.
    _thread: threading.Thread | None = None

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the loop thread; True if it has ended (or never started)."""
        t = self._thread
        if t is None:
            return True
        t.join(timeout)
        return not t.is_alive()

    @abc.abstractmethod
    def close(self) -> None:
        """stop() + join() + free; idempotent."""

    @abc.abstractmethod
    def stats(self) -> dict:
        """Counters as {name: int} for every name in STAT_NAMES."""

    @abc.abstractmethod
    def set_icmp_limit(self, rate: int, burst: int = ICMP_BURST_DEFAULT) -> None:
        """Rate-limit the ICMP errors the engine generates: at most ``burst``
        + ``rate`` * t in any t seconds (rate 0 = unlimited); thread-safe."""

    @staticmethod
    def _check_icmp_limit(rate: int, burst: int) -> tuple[int, int]:
        rate, burst = int(rate), int(burst)
        if not 0 <= rate < 2 ** 32 or not 0 <= burst < 2 ** 32:
            raise ValueError(f"icmp rate {rate}/burst {burst} out of range 0..2**32-1")
        if rate and not burst:
            raise ValueError("icmp burst must be >= 1 when the rate is limited")
        return rate, burst

    @abc.abstractmethod
    def set_coalesce(self, usecs: int) -> None:
        """Bounded-delay batching (dataplane.h, dp_loop_set_coalesce): after a pass that
        forwarded anything, wait ``usecs`` microseconds without being woken by the fds, then
        look again; 0 (the default) turns it off. Thread-safe."""

    @staticmethod
    def _check_coalesce(usecs: int) -> int:
        usecs = int(usecs)
        if not 0 <= usecs <= COALESCE_MAX_US:
            raise ValueError(f"coalesce {usecs} us out of range 0..{COALESCE_MAX_US}")
        return usecs

    @abc.abstractmethod
    def set_local(self, own_subnets, addrs) -> None:
        """This host's own sources (dataplane.h, UDP -> TUN step 4): a datagram
        whose inner source is one of ``addrs`` (of either family) or inside one of
        ``own_subnets`` (the lease's parts: networks, at most one per family, in any
        order) is dropped as drop_inner_local. Replaces the previous set; thread-safe.
        Empty (the default) checks nothing."""

    @abc.abstractmethod
    def set_tun_addr(self, addr) -> None:
        """flannel0's address of ``addr``'s family: the source of the ICMP errors the engine
        generates about that family's packets. IPv4's is the constructor's ``tun_addr``
        (dp_loop_new takes it, and dataplane.h has no setter for it): any other IPv4
        address is ValueError. IPv6's (dp_loop_set_addr6): until it is set, or once it is
        set to ``::``, the engine generates no ICMPv6 error. Thread-safe."""

    def _check_tun_addr(self, addr) -> bytes | None:
        """``addr`` checked for set_tun_addr: IPv6's packed, None for IPv4's (kept as is)."""
        addr = ipaddress.ip_address(addr)
        if addr.version == 6:
            return addr.packed
        if addr != self.tun_addr:
            raise ValueError(f"tun address {addr}: the IPv4 one is the constructor's "
                             f"({self.tun_addr})")
        return None

    @abc.abstractmethod
    def set_udp(self, version: int, fd) -> None:
        """The underlay's socket of IP ``version`` (4 or 6). IPv4's is the constructor's
        ``udp_fd``: version 4 is OSError EBUSY (already set). IPv6's (dataplane.h,
        dp_loop_set_udp6): ``fd`` (an int or anything with fileno()) is an AF_INET6 UDP
        socket with IPV6_V6ONLY, bound by the caller to the host's [address]:port, that the
        engine reads and sends from beside its IPv4 socket; the caller keeps owning it.
        Before start() and once: OSError EBUSY after start() or a second time, EBADF for a
        bad fd or one the engine has already. Routes with an IPv6 peer (Route.peer_ip an
        IPv6Address) are refused (OSError EINVAL) by an engine without it, so call it
        before the first such table."""

    def _check_udp_version(self, version: int) -> None:
        if version == 4:
            raise OSError(errno.EBUSY, "the IPv4 socket is the constructor's udp_fd")
        if version != 6:
            raise ValueError(f"IP version {version}: 4 or 6")

    @abc.abstractmethod
    def set_strict_sources(self, enable: bool) -> None:
        """Step 5 on or off: the inner source must be routed to the peer that
        sent the datagram, else drop_inner_foreign. Thread-safe."""

    @staticmethod
    def _check_local(own_subnets, addrs) -> tuple["Local", "Local"]:
        """The own sources as host-order ints, IPv4's then IPv6's, checked as
        dp_loop_set_local checks them, so both engines refuse alike."""
        nets: dict = {}
        for net in map(ipaddress.ip_network, own_subnets):
            if net.version in nets:
                raise ValueError(f"own subnets {nets[net.version]} and {net}: one per family")
            if net.prefixlen == 0:
                raise ValueError(f"own subnet {net} would make every source local")
            nets[net.version] = net
        by_family: dict[int, list[int]] = {4: [], 6: []}
        for a in addrs:
            a = ipaddress.ip_address(a)
            by_family[a.version].append(int(a))
        out = []
        for version, ints in by_family.items():
            if len(ints) > LOCAL_MAX:
                raise ValueError(f"{len(ints)} local IPv{version} addresses: at most {LOCAL_MAX}")
            net = nets.get(version)
            out.append(Local(int(net.network_address), net.prefixlen, tuple(ints)) if net
                       else Local(0, 0, tuple(ints)))
        return out[0], out[1]

    def set_offloads(self, flags: int) -> None:
        """Tell the engine which offloads (OFF_* bits) the caller switched on
        for its fds; before start(). An engine without offloads accepts 0 only."""
        if int(flags):
            raise OSError(errno.EOPNOTSUPP, f"the {self.name} engine has no offloads")

    @abc.abstractmethod
    def trace(self, enable: bool) -> None:
        """Switch the trace ring on or off."""

    @abc.abstractmethod
    def trace_events(self, after: int = 0) -> list:
        """Events with seq > after, oldest first, as dicts with keys
        seq, ts_ns, kind (name from TRACE_KINDS), len, addr (str), port,
        batch, head (bytes)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
