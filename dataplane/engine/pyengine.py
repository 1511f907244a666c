"""The pure-Python engine: the oracle of the C engine, and its fallback.

It does what csrc/dataplane.h says, in the order it says it, with the same
counters (all of them but api.SYSCALL_STATS match the C engine exactly for
the same input) and the same trace events. Python has no recvmmsg/sendmmsg,
so every packet costs one syscall each way; the rest is kept cheap:

* all buffers are allocated once (one bytearray per batch slot, and
  memoryviews over them), reads go straight into them (FileIO.readinto,
  socket.recv_into/recvfrom_into), nothing is copied on the forwarding path;
* the loop works on locals bound once per thread (bound methods, buffers,
  constants) and hot counters are kept in locals and added to the shared
  counter list once per batch;
* the route table is one dict per prefix length (pytable.RouteTable), and
  the common case of a single prefix length skips the loop over lengths.

Flow, in the order the code appears in :meth:`PyEngine._run`:
  1. icmp_error   an ICMP error about a TUN packet, written into the TUN,
                  if the rate limit allows (icmp_allowed: dataplane.h's GCRA)
  2. tun_batch    read() until EAGAIN or `batch` packets: checks, route,
                  TTL - 1, queue; then one sendto() per queued packet
  3. udp_batch    recv(MSG_DONTWAIT) until EAGAIN or `batch` datagrams,
                  then per datagram: checks, inner source (local, then
                  strict), TTL - 1, write() to the TUN
  4. the loop     epoll, adopt a new route table, then alternate the two
                  directions one batch each while there is work (at most
                  ROUNDS times before polling again, so the stop fd is seen);
                  it ends on stop() or when the TUN is gone (EBADFD), which
                  ended() reports and on_end() callbacks hear at once

Where it differs from the C engine, by design: the counters of
api.SYSCALL_STATS (one sendto/recv per packet instead of sendmmsg/recvmmsg),
and the `batch` field of trace events udp_send (packets queued in that TUN
batch) and udp_recv (datagrams received in that turn), and
set_strict_sources, which judges from the next batch of receives on, not
from the next datagram. numpy is not used:
its per-call cost (~1 us) is above the whole per-packet Python work
(~0.5 us on top of the syscalls), and packets are handled one at a time.

Threads: the loop thread owns everything above. Other threads only set
``_stopping`` / ``_published`` / ``_tracing`` (plain attribute stores,
atomic under the GIL), write the eventfd, and read the counter list and the
trace deque (copied in one C-level call, so never torn).
"""
from __future__ import annotations

import collections
import ctypes
import errno
import io
import ipaddress
import logging
import os
import select
import socket
import struct
import threading
import time

from . import ipv4
from .api import DEFAULT_BATCH, Ended, Engine, EngineClosed
from .contract import (ICMP_BURST_DEFAULT, ICMP_RATE_DEFAULT, STAT_NAMES, TRACE_HEAD, TRACE_KINDS,
                       TRACE_RING)
from .pytable import RouteTable, str_to_int

log = logging.getLogger(__name__)

ROUNDS = 8                      # batches per direction between two polls (loop.c: DP_ROUNDS)
HEADER_MIN = 20

# Counter indices, dp_stats field order.
_STAT_INDEX = {name: i for i, name in enumerate(STAT_NAMES)}
TUN_RX_PACKETS, TUN_RX_BYTES = _STAT_INDEX["tun_rx_packets"], _STAT_INDEX["tun_rx_bytes"]
UDP_TX_PACKETS, UDP_TX_BYTES = _STAT_INDEX["udp_tx_packets"], _STAT_INDEX["udp_tx_bytes"]
UDP_RX_PACKETS, UDP_RX_BYTES = _STAT_INDEX["udp_rx_packets"], _STAT_INDEX["udp_rx_bytes"]
TUN_TX_PACKETS, TUN_TX_BYTES = _STAT_INDEX["tun_tx_packets"], _STAT_INDEX["tun_tx_bytes"]
ICMP_UNREACH_SENT, ICMP_TTL_SENT = _STAT_INDEX["icmp_unreach_sent"], _STAT_INDEX["icmp_ttl_sent"]
DROP_NO_ROUTE, DROP_TTL = _STAT_INDEX["drop_no_route"], _STAT_INDEX["drop_ttl"]
DROP_MALFORMED, DROP_NOT_IPV4 = _STAT_INDEX["drop_malformed"], _STAT_INDEX["drop_not_ipv4"]
DROP_TRUNCATED, DROP_BAD_SOURCE = _STAT_INDEX["drop_truncated"], _STAT_INDEX["drop_bad_source"]
DROP_SEND_ERROR = _STAT_INDEX["drop_send_error"]
DROP_TUN_FULL, DROP_TUN_ERROR = _STAT_INDEX["drop_tun_full"], _STAT_INDEX["drop_tun_error"]
SYSCALLS, TUN_READS, TUN_WRITES = _STAT_INDEX["syscalls"], _STAT_INDEX["tun_reads"], _STAT_INDEX["tun_writes"]
UDP_SENDS, UDP_RECVS, POLLS = _STAT_INDEX["udp_sends"], _STAT_INDEX["udp_recvs"], _STAT_INDEX["polls"]
TX_BATCHES, RX_BATCHES, ROUTE_SWAPS = _STAT_INDEX["tx_batches"], _STAT_INDEX["rx_batches"], _STAT_INDEX["route_swaps"]
ICMP_RATELIMITED = _STAT_INDEX["icmp_ratelimited"]
DROP_INNER_LOCAL, DROP_INNER_FOREIGN = (_STAT_INDEX["drop_inner_local"],
                                        _STAT_INDEX["drop_inner_foreign"])
COALESCE_WAITS = _STAT_INDEX["coalesce_waits"]
NS_PER_S = 1_000_000_000

# Trace kinds (enum dp_trace_kind).
TR_TUN_READ, TR_ROUTE_HIT, TR_ROUTE_MISS, TR_UDP_SEND = 1, 2, 3, 4
TR_UDP_RECV, TR_TUN_WRITE, TR_ICMP, TR_DROP = 5, 6, 7, 8

# Fields the TUN side needs after the length checks, in one unpack:
# tot_len, flags+fragment offset, ttl, protocol, checksum, dst.
_TUN_FIELDS = struct.Struct("!2xH2xHBBH4xI").unpack_from
# The source address, as an int.
_SRC = struct.Struct("!12xI").unpack_from
# TTL, protocol, checksum written back after the decrement.
_PUT_TTL = struct.Struct("!BBH").pack_into
PR_SET_TIMERSLACK = 29           # <linux/prctl.h>
DENSE_WAITS = 4                  # coalescing starts when work comes within 4 waits of the last
_ICMP_ERROR_TYPES = ipv4.ICMP_ERROR_TYPES
_EMPTY = RouteTable()


def _precise_timers() -> None:
    """This thread's timers fire on time, as the C loop's (loop.c): the default slack, 50 us,
    would stretch every coalescing wait by up to 50 us."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _tun_write_drop(err: int) -> int:
    return DROP_TUN_FULL if err in (errno.EAGAIN, errno.EWOULDBLOCK) else DROP_TUN_ERROR


class PyEngine(Engine):
    """The Engine contract in pure Python (see the module docstring)."""
    name = "python"

    def __init__(self, tun_fd: int, udp_fd: int, tun_addr, mtu: int,
                 batch: int = DEFAULT_BATCH, accept_any: bool = True):
        super().__init__(tun_fd, udp_fd, tun_addr, mtu, batch, accept_any)
        # Like the C binding, accept anything with a fileno() as well as ints.
        tun_fd = self.tun_fd = tun_fd if isinstance(tun_fd, int) else tun_fd.fileno()
        udp_fd = self.udp_fd = udp_fd if isinstance(udp_fd, int) else udp_fd.fileno()
        if tun_fd < 0 or udp_fd < 0 or tun_fd == udp_fd:
            raise OSError(errno.EBADF, "tun_fd and udp_fd must be two distinct open fds")
        self._counters = [0] * len(STAT_NAMES)
        self._published = _EMPTY          # the newest table; the loop adopts it
        self._stopping = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._tracing = False
        self._icmp_limit = (ICMP_RATE_DEFAULT, ICMP_BURST_DEFAULT)   # one tuple: atomic
        self._local = (0, 0, frozenset())  # own subnet net, mask; own addresses (ints)
        self._strict = False
        self._coalesce_s = 0.0            # the coalescing wait, seconds (0: off)
        self._trace_seq = 0
        self._ring: collections.deque = collections.deque(maxlen=TRACE_RING)
        self._lock = threading.Lock()     # start/close only; never taken by the loop
        self._wake_fd = None

        # Everything the loop needs is made here, once (like dp_loop_new).
        # TUN reads get exactly mtu bytes; UDP receives get mtu + 1, so a
        # datagram that fills the extra byte is known to be longer than mtu.
        mtu, batch = self.mtu, self.batch
        self._tx_bufs = [bytearray(mtu) for _ in range(batch)]
        self._rx_bufs = [bytearray(mtu + 1) for _ in range(batch)]
        self._tun_addr_packed = self.tun_addr.packed
        dup = os.dup(udp_fd)              # our own fd: closing it leaves the caller's
        try:
            self._sock = socket.socket(fileno=dup)
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

    # ---- control API (any thread) ------------------------------------------

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

    def join(self, timeout: float | None = None) -> bool:
        t = self._thread
        if t is None:
            return True
        t.join(timeout)
        return not t.is_alive()

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
        self._sock.close()            # closes our dup only

    def stats(self) -> dict:
        self._check_open()
        return dict(zip(STAT_NAMES, list(self._counters)))

    def set_icmp_limit(self, rate: int, burst: int = ICMP_BURST_DEFAULT) -> None:
        self._check_open()
        self._icmp_limit = self._check_icmp_limit(rate, burst)

    def set_local(self, own_subnet, addrs) -> None:
        self._check_open()
        net, plen, ints = self._check_local(own_subnet, addrs)
        mask = (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF if plen else 0
        self._local = (net, mask, frozenset(ints))

    def set_coalesce(self, usecs: int) -> None:
        self._check_open()
        self._coalesce_s = self._check_coalesce(usecs) / 1e6

    def set_strict_sources(self, enable: bool) -> None:
        self._check_open()
        self._strict = bool(enable)

    def trace(self, enable: bool) -> None:
        self._check_open()
        self._tracing = bool(enable)

    def trace_events(self, after: int = 0) -> list:
        self._check_open()
        out = []
        for seq, ts, kind, length, addr, port, batch, head in self._ring.copy():
            if seq > after:
                out.append({"seq": seq, "ts_ns": ts, "kind": TRACE_KINDS[kind], "len": length,
                            "addr": str(ipaddress.IPv4Address(addr)), "port": port,
                            "batch": batch, "head": head})
        return out

    @property
    def error(self) -> BaseException | None:
        """The exception that ended the loop thread, if any."""
        return self._error

    # ---- the loop thread ----------------------------------------------------

    def _record(self, kind, length, addr, port, batch, head):
        """One trace event; addr is an int (host order), head bytes-like."""
        self._trace_seq += 1
        self._ring.append((self._trace_seq, time.monotonic_ns(), kind, length, addr, port,
                           batch, bytes(head[:TRACE_HEAD]) if head is not None else b""))

    def _run_guarded(self):
        end = Ended("error")
        try:
            end = self._run()
        except BaseException as e:  # the thread must not die silently
            self._error = e
            end = Ended("error", getattr(e, "errno", None) or 0)
            log.exception("pyengine loop failed")
        finally:
            self._loop_ended(end)

    def _run(self):
        self._thread_started()
        _precise_timers()
        count = self._counters
        record = self._record
        # a datagram read into MTU + 1 bytes that fills them is longer than the MTU
        mtu, rx_size, nbatch = self.mtu, self.mtu + 1, self.batch
        accept_any = self.accept_any
        tun_fd, udp_fd, wake_fd = self.tun_fd, self.udp_fd, self._wake_fd
        tun_addr = self._tun_addr_packed
        readinto, tun_write = self._tun.readinto, self._tun.write
        sock = self._sock
        sendto, recv_into, recvfrom_into = sock.sendto, sock.recv_into, sock.recvfrom_into
        DONTWAIT = socket.MSG_DONTWAIT
        poll = self._ep.poll
        tun_fields, put_ttl = _TUN_FIELDS, _PUT_TTL
        monotonic_ns = time.monotonic_ns
        tx_bufs = self._tx_bufs
        tx_views = [memoryview(b) for b in tx_bufs]
        tx_len = [0] * nbatch
        tx_hop = [None] * nbatch
        rx_bufs = self._rx_bufs
        rx_views = [memoryview(b) for b in rx_bufs]
        rx_len = [0] * nbatch
        rx_src = [None] * nbatch
        routes = _EMPTY
        gone = 0                      # errno that says the TUN has no device (dataplane.h)
        tat = 0                       # ICMP rate limit state (dataplane.h), ns
        now = 0                       # monotonic ns, read once per TUN batch

        def take_routes():
            """Adopt the newest published table; counted once per table."""
            nonlocal routes
            t = self._published
            if t is not routes:
                routes = t
                count[ROUTE_SWAPS] += 1

        def drop(reason, length):
            count[reason] += 1
            if self._tracing:
                record(TR_DROP, length, 0, 0, reason, None)

        # -- 1. ICMP errors back into the TUN --------------------------------
        def icmp_allowed():
            """The GCRA token bucket of dataplane.h, integer for integer."""
            nonlocal tat
            rate, burst = self._icmp_limit
            if not rate:
                return True
            interval = (NS_PER_S + rate - 1) // rate
            if tat < now:
                tat = now
            if tat - now > (burst - 1) * interval:
                count[ICMP_RATELIMITED] += 1
                return False
            tat += interval
            return True

        def tun_write_failed(err, length):
            nonlocal gone
            if err == errno.EBADFD:   # the tun driver's answer once the device is gone
                gone = err
            drop(_tun_write_drop(err), length)

        def icmp_error(buf, length, type_):
            if not icmp_allowed():
                return
            pkt = ipv4.icmp_error(buf[:length], type_, 0, tun_addr)
            count[SYSCALLS] += 1
            count[TUN_WRITES] += 1
            try:
                w = tun_write(pkt)
            except OSError as e:
                tun_write_failed(e.errno, len(pkt))
                return
            if w is None:             # EAGAIN: FileIO reports it as None
                drop(DROP_TUN_FULL, len(pkt))
                return
            count[ICMP_UNREACH_SENT if type_ == ipv4.ICMP_DEST_UNREACH else ICMP_TTL_SENT] += 1
            if self._tracing:
                record(TR_ICMP, len(pkt), 0, 0, 0, pkt)

        # -- 2. TUN -> UDP ---------------------------------------------------
        def tun_batch():
            """Returns (more, err): more if the TUN may have more right now, err
            the errno of a failed read (else 0)."""
            nonlocal now
            take_routes()
            now = monotonic_ns()
            tracing = self._tracing
            lens = routes.lens
            single = len(lens) == 1
            if single:
                mask0, plen0, nets0 = lens[0]
            n = m = 0
            reads = 0
            rx_pk = rx_by = 0
            more, err = True, 0
            while n < nbatch:
                buf = tx_bufs[m]
                reads += 1
                try:
                    r = readinto(buf)
                except OSError as e:
                    more, err = False, e.errno or errno.EIO
                    break
                if r is None:          # EAGAIN
                    more = False
                    break
                n += 1
                rx_pk += 1
                rx_by += r
                if tracing:
                    record(TR_TUN_READ, r, 0, 0, 0, buf[:min(r, TRACE_HEAD)])
                # 1. validate
                if r < HEADER_MIN:
                    drop(DROP_MALFORMED, r)
                    continue
                version_ihl = buf[0]
                if version_ihl >> 4 != 4:
                    drop(DROP_NOT_IPV4, r)
                    continue
                header_len = (version_ihl & 15) << 2
                if header_len < HEADER_MIN or header_len > r:
                    drop(DROP_MALFORMED, r)
                    continue
                tot, flags_frag, ttl, proto, check, dst = tun_fields(buf)
                if tot != r:
                    drop(DROP_MALFORMED, r)
                    continue
                # 2. route
                if single:
                    hop = nets0.get(dst & mask0)
                    plen = plen0
                else:
                    hop = None
                    for mask, plen, nets in lens:
                        hop = nets.get(dst & mask)
                        if hop is not None:
                            break
                if hop is None:
                    if tracing:
                        record(TR_ROUTE_MISS, 0, dst, 0, 0, None)
                    drop(DROP_NO_ROUTE, r)
                    if proto != 1 and not flags_frag & 0x1FFF:
                        icmp_error(buf, r, 3)
                    continue
                if tracing:
                    record(TR_ROUTE_HIT, plen, str_to_int(hop[0]), hop[1], 0, None)
                # 3. TTL
                if ttl <= 1:
                    drop(DROP_TTL, r)
                    if not flags_frag & 0x1FFF and not (
                            proto == 1 and r > header_len and buf[header_len] in _ICMP_ERROR_TYPES):
                        icmp_error(buf, r, 11)
                    continue
                # 4. TTL - 1 with the checksum formula of dataplane.h. With
                # old = ttl << 8 | proto and new = old - 0x100 (ttl >= 2),
                # (~old & 0xffff) + new is always 0xfeff, so
                # s = (~check & 0xffff) + 0xfeff, folded twice.
                s = (check ^ 0xFFFF) + 0xFEFF
                s = (s & 0xFFFF) + (s >> 16)
                s = (s & 0xFFFF) + (s >> 16)
                put_ttl(buf, 8, ttl - 1, proto, ~s & 0xFFFF)
                # 5. queue
                tx_len[m] = r
                tx_hop[m] = hop
                m += 1
            sends = tx_pk = tx_by = 0
            for i in range(m):
                length = tx_len[i]
                sends += 1
                try:
                    sendto(tx_views[i][:length], tx_hop[i])
                except OSError:
                    drop(DROP_SEND_ERROR, length)
                    continue
                tx_pk += 1
                tx_by += length
                if tracing:
                    hop = tx_hop[i]
                    record(TR_UDP_SEND, length, str_to_int(hop[0]), hop[1], m, None)
            count[SYSCALLS] += reads + sends
            count[TUN_READS] += reads
            count[UDP_SENDS] += sends
            count[TUN_RX_PACKETS] += rx_pk
            count[TUN_RX_BYTES] += rx_by
            count[UDP_TX_PACKETS] += tx_pk
            count[UDP_TX_BYTES] += tx_by
            if n:
                count[TX_BATCHES] += 1
            return more, err

        # -- 3. UDP -> TUN ---------------------------------------------------
        def udp_batch():
            """Returns True if the socket may have more right now."""
            take_routes()
            tracing = self._tracing
            peers = routes.peers
            need_src = tracing or not accept_any or self._strict
            k = recvs = 0
            more = True
            while k < nbatch:
                recvs += 1
                try:
                    if need_src:
                        rx_len[k], rx_src[k] = recvfrom_into(rx_bufs[k], rx_size, DONTWAIT)
                    else:
                        rx_len[k] = recv_into(rx_bufs[k], rx_size, DONTWAIT)
                except OSError:        # EAGAIN, or e.g. a pending ICMP error on the socket
                    more = False
                    break
                k += 1
            count[UDP_RECVS] += recvs
            count[SYSCALLS] += recvs
            if not k:
                return False
            count[RX_BATCHES] += 1
            # Read after the receives, so that a set published before a
            # datagram was sent is the one that judges it (as in C, which
            # looks before each packet). Strict needs the sources, so it
            # starts with a batch that asked for them.
            own_net, own_mask, own_addrs = self._local
            strict = self._strict and need_src
            lookup = routes.lookup
            rx_pk = rx_by = tx_pk = tx_by = writes = 0
            for i in range(k):
                received = rx_len[i]
                length = received if received <= mtu else mtu
                rx_pk += 1
                rx_by += length
                buf = rx_bufs[i]
                if tracing:
                    src = rx_src[i]
                    record(TR_UDP_RECV, length, str_to_int(src[0]), src[1], k,
                           buf[:min(length, TRACE_HEAD)])
                # 1.-4. the checks, in the header's order
                if received > mtu:
                    drop(DROP_TRUNCATED, length)
                    continue
                if not accept_any and rx_src[i][0] not in peers:
                    drop(DROP_BAD_SOURCE, length)
                    continue
                if length and buf[0] >> 4 != 4:
                    drop(DROP_NOT_IPV4, length)
                    continue
                if length < HEADER_MIN:
                    drop(DROP_MALFORMED, length)
                    continue
                header_len = (buf[0] & 15) << 2
                if header_len < HEADER_MIN or header_len > length or (buf[2] << 8 | buf[3]) != length:
                    drop(DROP_MALFORMED, length)
                    continue
                inner = _SRC(buf)[0]
                if inner in own_addrs or (own_mask and inner & own_mask == own_net):
                    drop(DROP_INNER_LOCAL, length)
                    continue
                if strict:
                    hit = lookup(inner)
                    if hit is None or hit[0][0] != rx_src[i][0]:
                        drop(DROP_INNER_FOREIGN, length)
                        continue
                ttl = buf[8]
                if ttl <= 1:
                    drop(DROP_TTL, length)
                    continue
                # 5. TTL - 1 (see tun_batch for the checksum arithmetic), write
                s = ((buf[10] << 8 | buf[11]) ^ 0xFFFF) + 0xFEFF
                s = (s & 0xFFFF) + (s >> 16)
                s = (s & 0xFFFF) + (s >> 16)
                put_ttl(buf, 8, ttl - 1, buf[9], ~s & 0xFFFF)
                writes += 1
                try:
                    w = tun_write(rx_views[i][:length])
                except OSError as e:
                    tun_write_failed(e.errno, length)
                    continue
                if w is None:
                    drop(DROP_TUN_FULL, length)
                    continue
                tx_pk += 1
                tx_by += length
                if tracing:
                    record(TR_TUN_WRITE, length, 0, 0, 0, buf[:min(length, TRACE_HEAD)])
            count[SYSCALLS] += writes
            count[TUN_WRITES] += writes
            count[UDP_RX_PACKETS] += rx_pk
            count[UDP_RX_BYTES] += rx_by
            count[TUN_TX_PACKETS] += tx_pk
            count[TUN_TX_BYTES] += tx_by
            return more

        # -- 4. the loop -----------------------------------------------------
        tun_broken = select.EPOLLERR | select.EPOLLHUP
        monotonic = time.monotonic
        last_work = 0.0                   # when the last pass that forwarded anything ended

        def one_pass(tun_more, udp_more, tun_events):
            """Both directions, one batch each, at most ROUNDS times; the packets handled."""
            nonlocal gone
            before = count[TUN_RX_PACKETS] + count[UDP_RX_PACKETS]
            take_routes()
            for _ in range(ROUNDS):
                if not (tun_more or udp_more):
                    break
                if tun_more:
                    tun_more, tun_err = tun_batch()
                    # A TUN whose device is gone fails every read with
                    # EBADFD (and epoll says ERR): the loop ends (dataplane.h).
                    if tun_err and (tun_err == errno.EBADFD or tun_events & tun_broken):
                        gone = tun_err
                if self._stopping or gone:
                    break
                if udp_more:
                    udp_more = udp_batch()
                if self._stopping or gone:
                    break
            return count[TUN_RX_PACKETS] + count[UDP_RX_PACKETS] - before

        while not self._stopping and not gone:
            count[SYSCALLS] += 1
            count[POLLS] += 1
            events = poll()
            tun_more = udp_more = False
            tun_events = 0
            for fd, ev in events:
                if fd == tun_fd:
                    tun_more = True
                    tun_events = ev
                elif fd == udp_fd:
                    udp_more = True
                elif fd == wake_fd:   # stop, or a new route table
                    count[SYSCALLS] += 1
                    try:
                        os.eventfd_read(wake_fd)
                    except BlockingIOError:
                        pass
            work = one_pass(tun_more, udp_more, tun_events)
            wait_s = self._coalesce_s
            if not work or not wait_s:
                continue
            # Coalescing (dataplane.h, dp_loop_set_coalesce), once work comes densely: while
            # passes find work, wait (only the wake fd can end the wait early), look again.
            now = monotonic()
            if now - last_work < wait_s * DENSE_WAITS:
                while work and not self._stopping and not gone:
                    count[SYSCALLS] += 1
                    count[COALESCE_WAITS] += 1
                    if select.select([wake_fd], [], [], wait_s)[0]:
                        count[SYSCALLS] += 1
                        try:
                            os.eventfd_read(wake_fd)
                        except BlockingIOError:
                            pass
                    if self._stopping:
                        break
                    work = one_pass(True, True, 0)
                    if work:
                        now = monotonic()
            last_work = now
        return Ended("tun_gone", gone) if gone else Ended("stopped")
