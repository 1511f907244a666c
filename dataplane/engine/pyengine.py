"""The pure-Python engine: the oracle of the C engine, and its fallback.

It does what csrc/dataplane.h says, in the order it says it, with the same counters (all of
them but api.SYSCALL_STATS match the C engine exactly for the same input) and the same trace
events. What happens to a packet is decided in pypath.py, which is csrc/path.c function for
function; the loop thread around it, laid out as the C loop is (loop.c, tx.c, rx.c), is
pyloop.py's, with pysys.py's rarer calls (a refused send, the error queue). This module is the
Engine API (api.py) over them, for any thread: it only stores what the loop reads (the
published table, own sources, flags) and wakes the loop, as dataplane.h's dp_loop_set_* do.

Inner IPv6 packets take the same I/O; only pypath tells them apart. The IPv6 underlay (set_udp)
is a second socket beside the IPv4 one: a route's hop in AF_INET6's form (four items) is sent on
it, and its datagrams are read in batches of their own, as rx.c reads each socket.

Threads: the loop thread owns the pyloop.Loop and the pypath.Path. Other threads
only set the engine's ``_stopping`` / ``_published`` / ``_local`` / ``_tun_addr`` /
``_strict`` / ``_tracing`` / ``_coalesce_us`` and the Path's ICMP limit
(plain attribute stores, atomic under the GIL), write the eventfd, and read
the counter list and the trace deque (copied in one C-level call, so never
torn).
"""
from __future__ import annotations

import errno
import io
import ipaddress
import logging
import os
import select
import socket
import threading

from . import pypath, pysys
from .api import DEFAULT_BATCH, Ended, Engine, EngineClosed
from .contract import ICMP_BURST_DEFAULT, STAT_NAMES, TRACE_KINDS
from .pyloop import Loop
from .pytable import RouteTable

log = logging.getLogger(__name__)

class PyEngine(Engine):
    """The Engine contract in pure Python (see the module docstring)."""
    name = "python"

    def __init__(self, tun_fd: int, udp_fd: int, tun_addr, mtu: int,
                 batch: int = DEFAULT_BATCH, accept_any: bool = True):
        super().__init__(tun_fd, udp_fd, tun_addr, mtu, batch, accept_any)
        # Like the C binding, accept anything with a fileno() as well as ints.
        tun_fd = self.tun_fd = tun_fd if isinstance(tun_fd, int) else tun_fd.fileno()
        udp_fd = udp_fd if isinstance(udp_fd, int) else udp_fd.fileno()
        self.udp_fds[4] = udp_fd
        if tun_fd < 0 or udp_fd < 0 or tun_fd == udp_fd:
            raise OSError(errno.EBADF, "tun_fd and udp_fd must be two distinct open fds")
        # Everything the loop needs is made here, once (like dp_loop_new).
        self._path = pypath.Path(self.tun_addr.packed, self.accept_any)
        self._published = self._path.routes   # the newest table; the loop adopts it
        self._local = self._path.local        # own sources: pypath.own_sources
        self._strict = False
        self._tun_addr = self._path.tun_addr  # pypath.Path.tun_addr, taken per TUN batch
        self._tracing = False
        self._coalesce_us = 0                 # the coalescing wait (0: off)
        self._stopping = False
        self._beats = 0                       # dp_state.beats: the loop's heartbeat
        self._closed = False
        self._error: BaseException | None = None
        self._lock = threading.Lock()         # start/close only; never taken by the loop
        self._wake_fd = None

        # TUN reads get exactly mtu bytes; UDP receives get mtu + 1, so a
        # datagram that fills the extra byte is known to be longer than mtu.
        mtu, batch = self.mtu, self.batch
        self._tx_bufs = [bytearray(mtu) for _ in range(batch)]
        self._rx_bufs = [bytearray(mtu + 1) for _ in range(batch)]
        dup = os.dup(udp_fd)              # our own fd: closing it leaves the caller's
        try:
            self._socks = {4: socket.socket(fileno=dup)}   # per version, as udp_fds (set_udp)
        except BaseException:
            os.close(dup)
            raise
        try:
            self._tun = io.FileIO(tun_fd, "r+b", closefd=False)
            self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._ep = select.epoll()
            self._ep.register(tun_fd, select.EPOLLIN)
            self._ep.register(udp_fd, select.EPOLLIN)
            self._ep.register(self._wake_fd, select.EPOLLIN)
            # Last, so that a failure above leaves the caller's fd untouched.
            os.set_blocking(tun_fd, False)
        except BaseException:
            self._free()
            raise

    def _check_open(self):
        if self._closed:
            raise EngineClosed(errno.EBADF, "engine is closed")

    def _wake(self):
        fd = self._wake_fd
        if fd is None:                # closed meanwhile (stop() racing close())
            return
        try:
            os.eventfd_write(fd, 1)
        except BlockingIOError:       # counter already non-zero: the loop will wake
            pass

    table_type = RouteTable
    forwards_in_python = True

    def set_table(self, table) -> None:
        self.publish_all((self,), table)

    @classmethod
    def publish_all(cls, engines, table) -> None:
        """The same immutable table for every queue: one reference store each (atomic under
        the GIL), all stores before any wake-up."""
        if not isinstance(table, RouteTable):
            raise TypeError(f"expected a RouteTable, got {type(table).__name__}")
        engines = list(engines)
        for e in engines:
            e._check_open()
            if table.peers6 and 6 not in e._socks:
                raise OSError(errno.EINVAL, "a route with an IPv6 peer needs set_udp(6, fd) first")
        for e in engines:
            e._published = table
        for e in engines:
            e._wake()                 # adopt it now, not at the next packet

    def start(self) -> None:
        with self._lock:
            self._check_open()
            if self._thread is not None:
                raise RuntimeError("engine already started")
            self._thread = threading.Thread(target=self._run_guarded, name="pyengine-loop",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._closed:              # a closed engine is stopped: nothing to do
            return
        self._stopping = True
        self._wake()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._stopping = True
            self._wake()
            if self._thread is not None:
                self._thread.join()
            self._closed = True
            self._free()

    def _free(self):
        for name in ("_ep", "_tun"):
            obj = self.__dict__.pop(name, None)
            if obj is not None:
                obj.close()
        if getattr(self, "_wake_fd", None) is not None:
            os.close(self._wake_fd)
            self._wake_fd = None
        for sock in self._socks.values():
            sock.close()              # closes our dup only

    def stats(self) -> dict:
        self._check_open()
        return dict(zip(STAT_NAMES, list(self._path.c)))

    def set_icmp_limit(self, rate: int, burst: int = ICMP_BURST_DEFAULT) -> None:
        self._check_open()
        pypath.path_set_icmp_limit(self._path, *self._check_icmp_limit(rate, burst))

    @property
    def _icmp_limit(self) -> tuple[int, int]:
        """(rate, burst) in use: tests/unit/test_engine_multi.py reads each queue's share."""
        return self._path.icmp_limit

    def heartbeat(self) -> int:
        return self._beats

    def set_local(self, own_subnets, addrs) -> None:
        self._check_open()
        self._local = pypath.own_sources(self._check_local(own_subnets, addrs))

    def set_coalesce(self, usecs: int) -> None:
        self._check_open()
        self._coalesce_us = self._check_coalesce(usecs)

    def set_tun_addr(self, addr) -> None:
        self._check_open()
        packed = self._check_tun_addr(addr)
        if packed is not None:        # :: is none, as in C; one store, read per TUN batch
            self._tun_addr = {**self._tun_addr, 6: packed if any(packed) else None}

    def set_udp(self, version: int, fd) -> None:
        with self._lock:
            self._check_open()
            self._check_udp_version(version)
            if self._thread is not None or 6 in self._socks:
                raise OSError(errno.EBUSY, "set_udp() after start() or a second time")
            fd = fd if isinstance(fd, int) else fd.fileno()
            if fd < 0 or fd in (self.tun_fd, self.udp_fds[4]):
                raise OSError(errno.EBADF, "the IPv6 socket must be an fd of its own")
            dup = os.dup(fd)          # ours, as the IPv4 socket's
            try:
                sock = socket.socket(fileno=dup)
            except BaseException:
                os.close(dup)
                raise
            try:
                self._ep.register(fd, select.EPOLLIN)
            except BaseException:
                sock.close()
                raise
            self.udp_fds[6], self._socks[6] = fd, sock

    def set_strict_sources(self, enable: bool) -> None:
        self._check_open()
        self._strict = bool(enable)

    def trace(self, enable: bool) -> None:
        self._check_open()
        self._tracing = bool(enable)

    def trace_events(self, after: int = 0) -> list:
        self._check_open()
        out = []
        for seq, ts, kind, length, addr, port, batch, head in self._path.ring.copy():
            if seq > after:
                out.append({"seq": seq, "ts_ns": ts, "kind": TRACE_KINDS[kind], "len": length,
                            "addr": str(ipaddress.IPv4Address(addr)), "port": port,
                            "batch": batch, "head": head})
        return out

    @property
    def error(self) -> BaseException | None:
        """The exception that ended the loop thread, if any."""
        return self._error

    def _run_guarded(self):
        end = Ended("error")
        try:
            self._thread_started()
            pysys.precise_timers()
            end = Loop(self).run()
        except BaseException as e:  # the thread must not die silently
            self._error = e
            end = Ended("error", getattr(e, "errno", None) or 0)
            log.exception("pyengine loop failed")
        finally:
            self._loop_ended(end)
