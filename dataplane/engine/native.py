"""The C engine: a thin binding of csrc/dataplane.h (built by cffi).

Everything about packets happens in C; this module checks sizes before each
call, turns ``-errno`` returns into ``OSError`` in one place (:func:`_check`),
and runs ``dp_loop_run`` in its own thread (cffi releases the GIL for the
duration of the call, so the loop never contends with Python code).

Importing this module raises ImportError when the extension was not built;
``dataplane.engine`` catches that and falls back to the Python engine.
"""
from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import socket
import struct
import threading

from dataplane._dataplane_c import ffi, lib

from . import contract
from .api import DEFAULT_BATCH, Ended, Engine, EngineClosed
from .route_array import ROUTE6_LAYOUT, ROUTE_LAYOUT, RouteArray

__all__ = ["CEngine"]
log = logging.getLogger(__name__)

# route_array's layouts are dp_route's and dp_route6's: the C loop reads the packed
# rows' memory as it is, so sizes, names and every offset must agree.
def _same_layout(layout, struct_name: str) -> bool:
    return layout.itemsize == ffi.sizeof(struct_name) and \
        [(name, off) for name, off, _ in layout.fields] == \
        [(name, ffi.offsetof(struct_name, name)) for name, _ in ffi.typeof(struct_name).fields]


assert _same_layout(ROUTE_LAYOUT, "dp_route")
assert _same_layout(ROUTE6_LAYOUT, "dp_route6")

# The contract's facts from the library itself. One built from another
# header than the one contract.py read (a stale build) is refused as not
# built, so the two engines can never disagree on them. A constant the
# library lacks counts as a disagreement, not as an AttributeError that the
# fallback to the Python engine would not catch.
STAT_NAMES = tuple(name for name, _ in ffi.typeof("dp_stats").fields if name != "reserved")
TRACE_KINDS = {v: k[len("DP_TR_"):].lower()
               for k, v in ffi.typeof("enum dp_trace_kind").relements.items()}
END_KINDS = {v: k[len("DP_END_"):].lower()
             for k, v in ffi.typeof("enum dp_loop_end").relements.items()}
if (STAT_NAMES, TRACE_KINDS, END_KINDS) != (
        contract.STAT_NAMES, contract.TRACE_KINDS, contract.END_KINDS) or any(
        getattr(lib, name, None) != value for name, value in contract.HEADER_CONSTANTS.items()):
    raise ImportError(f"the built C engine does not match {contract.HEADER}: "
                      "rebuild it (make deps)")
TRACE_RING = lib.DP_TRACE_RING
ICMP_BURST_DEFAULT = lib.DP_ICMP_BURST_DEFAULT


def _check(rc: int) -> int:
    """Raise OSError for a -errno return; pass counts through."""
    if rc < 0:
        raise OSError(-rc, os.strerror(-rc))
    return rc


def _fd(obj) -> int:
    return obj if isinstance(obj, int) else obj.fileno()


def _addr_u32(addr: ipaddress.IPv4Address) -> int:
    """An address as the uint32 whose memory holds it in network order."""
    return struct.unpack("=I", addr.packed)[0]


class CEngine(Engine):
    """The C loop of csrc/loop.c behind the Engine interface."""
    name = "c"

    def __init__(self, tun_fd, udp_fd, tun_addr, mtu: int,
                 batch: int = DEFAULT_BATCH, accept_any: bool = True):
        super().__init__(tun_fd, udp_fd, tun_addr, mtu, batch, accept_any)
        # Guards _loop against free while another thread is in a C call.
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._loop = None
        self._events = ffi.new("dp_trace_event[]", TRACE_RING)
        pp = ffi.new("dp_loop **")
        _check(lib.dp_loop_new(pp, _fd(tun_fd), _fd(udp_fd), _addr_u32(self.tun_addr),
                               self.mtu, self.batch, 1 if self.accept_any else 0))
        self._loop = pp[0]

    def _live(self):
        if self._loop is None:
            raise EngineClosed(errno.EBADF, f"{self.name} engine is closed")
        return self._loop

    table_type = RouteArray

    def set_table(self, table) -> None:
        self.publish_all((self,), table)

    @classmethod
    def publish_all(cls, engines, table) -> None:
        """One C call for every queue: all tables are built before any is published."""
        if not isinstance(table, RouteArray):
            raise TypeError(f"expected a RouteArray, got {type(table).__name__}")
        arr, arr6 = table.array, table.array6
        n, n6 = len(arr), len(arr6)
        if max(n, n6) >= 2 ** 32:
            raise ValueError("too many routes")
        engines = list(engines)
        with contextlib.ExitStack() as held:
            for e in engines:                   # always in the queues' order: no deadlock
                held.enter_context(e._lock)
            loops = ffi.new("dp_loop *[]", [e._live() for e in engines])
            # The arrays stay referenced until the call returns; C copies them.
            routes = ffi.from_buffer("dp_route[]", arr.words) if n else ffi.NULL
            routes6 = ffi.from_buffer("dp_route6[]", arr6.words) if n6 else ffi.NULL
            _check(lib.dp_loops_set_routes(loops, len(engines), routes, n, routes6, n6))

    def start(self) -> None:
        with self._lock:
            loop = self._live()
            if self._thread is not None:
                raise RuntimeError("engine already started")
            self._thread = threading.Thread(target=self._run, args=(loop,),
                                            name="dataplane-c", daemon=True)
            self._thread.start()

    def _run(self, loop) -> None:
        # The loop is freed only after this thread is joined (close()).
        # Its return value says no more than dp_loop_state does.
        self._thread_started()
        lib.dp_loop_run(loop)
        state = ffi.new("dp_state *")
        lib.dp_loop_state(loop, state)
        self._loop_ended(Ended(END_KINDS.get(state.end, str(state.end)), state.err))

    def stop(self) -> None:
        with self._lock:
            if self._loop is not None:
                _check(lib.dp_loop_stop(self._loop))

    def close(self) -> None:
        with self._lock:
            if self._loop is None:
                return
            _check(lib.dp_loop_stop(self._loop))
            self.join()
            lib.dp_loop_free(self._loop)
            self._loop = None
        if self._end is not None and self._end.why == "error":
            log.error("C loop ended with %s", os.strerror(self._end.err))

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def stats(self) -> dict:
        s = ffi.new("dp_stats *")
        with self._lock:
            _check(lib.dp_loop_stats(self._live(), s))
        return {name: getattr(s, name) for name in STAT_NAMES}

    def set_icmp_limit(self, rate: int, burst: int = ICMP_BURST_DEFAULT) -> None:
        rate, burst = self._check_icmp_limit(rate, burst)
        with self._lock:
            _check(lib.dp_loop_set_icmp_limit(self._live(), rate, burst))

    def offloads_in_use(self) -> int:
        state = ffi.new("dp_state *")
        with self._lock:
            _check(lib.dp_loop_state(self._live(), state))
        return state.offloads

    def heartbeat(self) -> int:
        state = ffi.new("dp_state *")
        with self._lock:
            _check(lib.dp_loop_state(self._live(), state))
        return state.beats

    def set_local(self, own_subnets, addrs) -> None:
        v4, v6 = self._check_local(own_subnets, addrs)
        arr = ffi.new("uint32_t[]", [_addr_u32(ipaddress.IPv4Address(a)) for a in v4.addrs]) \
            if v4.addrs else ffi.NULL
        # dp_loop_set_local's IPv6 arguments are 16 network-order bytes per address.
        net6 = ffi.from_buffer("uint8_t[]", v6.net.to_bytes(16, "big")) if v6.prefixlen \
            else ffi.NULL
        arr6 = ffi.from_buffer("uint8_t[]", b"".join(a.to_bytes(16, "big") for a in v6.addrs)) \
            if v6.addrs else ffi.NULL
        with self._lock:
            _check(lib.dp_loop_set_local(self._live(),
                                         _addr_u32(ipaddress.IPv4Address(v4.net)),
                                         v4.prefixlen, arr, len(v4.addrs), net6,
                                         v6.prefixlen, arr6, len(v6.addrs)))

    def set_coalesce(self, usecs: int) -> None:
        usecs = self._check_coalesce(usecs)
        with self._lock:
            _check(lib.dp_loop_set_coalesce(self._live(), usecs))

    def set_tun_addr(self, addr) -> None:
        packed = self._check_tun_addr(addr)
        with self._lock:
            loop = self._live()
            if packed is not None:
                _check(lib.dp_loop_set_addr6(loop, ffi.from_buffer("uint8_t[]", packed)))

    def set_udp(self, version: int, fd) -> None:
        with self._lock:
            loop = self._live()
            if self._thread is not None:
                raise OSError(errno.EBUSY, "set_udp() after start()")
            self._check_udp_version(version)
            _check(lib.dp_loop_set_udp6(loop, _fd(fd)))
            self.udp_fds[6] = _fd(fd)

    def set_strict_sources(self, enable: bool) -> None:
        with self._lock:
            _check(lib.dp_loop_set_strict_sources(self._live(), 1 if enable else 0))

    def set_offloads(self, flags: int) -> None:
        with self._lock:
            loop = self._live()
            # The loop thread marks itself running only once it is inside
            # dp_loop_run(); between start() and then, C alone could not tell
            # and would reallocate buffers the loop is about to use.
            if self._thread is not None:
                raise OSError(errno.EBUSY, "set_offloads() after start()")
            _check(lib.dp_loop_set_offloads(loop, int(flags)))

    def trace(self, enable: bool) -> None:
        with self._lock:
            _check(lib.dp_loop_trace(self._live(), 1 if enable else 0))

    def trace_events(self, after: int = 0) -> list:
        after = int(after)
        if not 0 <= after < 2 ** 64:
            raise ValueError(f"after {after} out of range")
        out = []
        with self._lock:
            loop = self._live()
            while True:
                n = _check(lib.dp_loop_trace_read(loop, after, self._events, TRACE_RING))
                out.extend(_event(self._events[i]) for i in range(n))
                if n < TRACE_RING:
                    break
                after = out[-1]["seq"]
        return out

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def _event(ev) -> dict:
    return {
        "seq": ev.seq,
        "ts_ns": ev.ts_ns,
        "kind": TRACE_KINDS.get(ev.kind, str(ev.kind)),
        "len": ev.len,
        "addr": socket.inet_ntoa(struct.pack("=I", ev.addr)),
        "port": ev.port,
        "batch": ev.batch,
        "head": bytes(ffi.buffer(ev.head, ev.head_len)),
    }
