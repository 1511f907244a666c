"""The pure-Python engine's loop thread: loop.c, tx.c and rx.c around pypath.py.

pyengine.PyEngine (the Engine API, any thread) makes a Loop when its thread starts; the Loop
reads what the engine published (table, own sources, flags) at the start of each batch and
moves the packets. Python has no recvmmsg/sendmmsg, so every packet costs one syscall each way;
the rest is kept cheap:

* all buffers are allocated once (one bytearray per batch slot, and memoryviews over them),
  reads go straight into them (FileIO.readinto, socket.recv_into/recvfrom_into), nothing is
  copied on the forwarding path;
* each batch works on locals bound once at its start (bound methods, buffers, the pypath
  functions), and the counters of the syscalls and of what was sent or written are kept in
  locals and added to the shared list once per batch;
* the route table is one dict per prefix length and family (pytable.RouteTable).

Flow, in the order the code appears (Loop: struct dp_loop):
  take_tables       adopt the newest published table (loop.c:
                    dp_loop_take_tables), counted once per table
  tun_write,        write() into the TUN (rx.c: dp_rx_tun_write); an
  icmp_send         ICMP error pypath built, written (tx.c: icmp_send)
  tun_batch         read() until EAGAIN or `batch` packets, then
                    path_tun over them (writing each ICMP error it
                    yields), then one sendto() per packet it forwarded
                    (tx.c: dp_tx_batch)
  udp_batch         recv(MSG_DONTWAIT) until EAGAIN or `batch` datagrams,
                    then path_udp over them, writing each datagram it
                    yields (rx.c: dp_rx_batch)
  one_pass,         epoll, then passes alternating the two directions one
  coalesce, run     batch each while there is work (at most ROUNDS times
                    before polling again, so the stop fd is seen); with
                    coalescing on, waits between passes once work comes
                    densely (loop.c: pass, coalesce, dp_loop_run); it ends
                    on stop() or when the TUN is gone (EBADFD), which
                    ended() reports and on_end() callbacks hear at once

Where it differs from the C engine, by design: the counters of
api.SYSCALL_STATS (one sendto/recv per packet instead of sendmmsg/recvmmsg),
and the `batch` field of trace events udp_send (packets queued in that TUN
batch) and udp_recv (datagrams received in that turn); the route table,
own sources, strict rule and trace switch are taken at the start of each
batch rather than before each packet. numpy is not used: its per-call cost
(~1 us) is above the whole per-packet Python work, and packets are handled
one at a time.
"""
from __future__ import annotations

import errno
import os
import select
import socket
import time

from . import pypath, pysys
from .api import Ended
from .contract import DENSE_WAITS, LIGHT_PACKETS, ROUNDS, TR_TUN_WRITE, TR_UDP_SEND, WAKE_MS
from .pypath import (COALESCE_WAITS, DROP_SEND_ERROR, DROP_TUN_FULL, POLLS, ROUTE_SWAPS,
                     RX_BATCHES, SYSCALLS, TUN_READS, TUN_RX_PACKETS, TUN_TX_BYTES,
                     TUN_TX_PACKETS, TUN_WRITES, TX_BATCHES, UDP_RECVS, UDP_RX_PACKETS, UDP_SENDS,
                     UDP_TX_BYTES, UDP_TX_PACKETS, V6_TUN_TX_BYTES, V6_TUN_TX_PACKETS,
                     V6_UDP_TX_BYTES, V6_UDP_TX_PACKETS)
from .pytable import str_to_int


class Loop:
    """The loop thread's state and its batches (struct dp_loop and loop.c, tx.c, rx.c)."""

    def __init__(self, engine):
        self.engine = engine
        self.path = engine._path
        self.c = engine._path.c
        self.mtu, self.nbatch = engine.mtu, engine.batch
        self.tun_fd, self.wake_fd = engine.tun_fd, engine._wake_fd
        # The loop keeps its sockets apart, as loop.c does: IPv4's and the IPv6 underlay's.
        self.udp_fd, self.udp6_fd = engine.udp_fds[4], engine.udp_fds.get(6)  # None: no IPv6
        self.readinto, self.write = engine._tun.readinto, engine._tun.write
        sock, sock6 = engine._socks[4], engine._socks.get(6)
        self.sendto = sock.sendto
        # Per socket: what udp_batch reads it with.
        self.receive = (sock.recv_into, sock.recvfrom_into)
        # A route to an IPv6 peer exists only with the socket (publish_all checks it).
        self.sendto6 = sock6.sendto if sock6 is not None else None
        self.sock, self.sock6, self.socks = sock, sock6, {self.udp_fd: sock, self.udp6_fd: sock6}
        self.df4 = True               # inner IPv6 to IPv4 peers: "don't fragment" (pysys)
        self.receive6 = (sock6.recv_into, sock6.recvfrom_into) if sock6 is not None else None
        self.poll = engine._ep.poll
        nbatch = self.nbatch
        self.tx_bufs = engine._tx_bufs
        self.tx_views = [memoryview(b) for b in self.tx_bufs]
        self.tx_len = [0] * nbatch
        self.tx_hop = [None] * nbatch
        self.rx_bufs = engine._rx_bufs
        self.rx_views = [memoryview(b) for b in self.rx_bufs]
        self.rx_len = [0] * nbatch
        self.rx_src = [None] * nbatch
        self.gone = 0                 # errno that says the TUN has no device (dataplane.h)

    def take_tables(self) -> None:
        table = self.engine._published
        if table is not self.path.routes:
            self.path.routes = table
            self.c[ROUTE_SWAPS] += 1

    def tun_write(self, data) -> int:
        """One write() into the TUN: 0, or the errno. EBADFD is the tun driver's answer
        once the device is gone: the loop ends."""
        c = self.c
        c[SYSCALLS] += 1
        c[TUN_WRITES] += 1
        try:
            if self.write(data) is None:      # FileIO's EAGAIN
                return errno.EAGAIN
        except OSError as e:
            if e.errno == errno.EBADFD:
                self.gone = e.errno
            return e.errno or errno.EIO
        return 0

    def icmp_send(self) -> None:
        pypath.path_icmp_written(self.path, self.tun_write(self.path.icmp))

    def tun_batch(self) -> tuple[bool, int]:
        """TUN -> UDP. Returns (more, err): more if the TUN may have more right now, err
        the errno of a failed read (else 0)."""
        pa, c = self.path, self.c
        self.take_tables()
        tracing = pa.tracing = self.engine._tracing
        pa.tun_addr = self.engine._tun_addr
        # For the ICMP rate limit: one clock read per batch, not per packet.
        pa.now_ns = time.monotonic_ns()
        readinto, nbatch, tx_bufs, tx_len, tx_hop = (self.readinto, self.nbatch, self.tx_bufs,
                                                     self.tx_len, self.tx_hop)
        n = 0
        more, err = True, 0
        while n < nbatch:
            try:
                r = readinto(tx_bufs[n])
            except OSError as e:
                more, err = False, e.errno or errno.EIO
                break
            if r is None:                     # EAGAIN
                more = False
                break
            tx_len[n] = r
            n += 1
        reads = n if more else n + 1          # with the one that found nothing
        for _ in pypath.path_tun(pa, tx_bufs, tx_len, n, tx_hop):
            self.icmp_send()
        m = n - tx_hop[:n].count(None)        # queued: one sendto() each
        sendto, sendto6, tx_views = self.sendto, self.sendto6, self.tx_views
        sendmsg, df4 = self.sock.sendmsg, self.df4
        tx_pk = tx_by = 0
        tx6, tx6_by = pa.fwd6                 # IPv6's queued, less those refused below
        for i in range(n):
            hop = tx_hop[i]
            if hop is None:
                continue
            length, batch = tx_len[i], m        # batch 1: a second try, alone (tx.c's refused)
            # An IPv6 peer's hop is an AF_INET6 sockaddr: four items. Inner IPv6 to an IPv4
            # peer goes with "don't fragment" (pysys).
            df = len(hop) == 2 and df4 and tx_bufs[i][0] >= 0x60
            try:
                if df:
                    sendmsg([tx_views[i][:length]], pysys.dont_fragment(length), 0, hop)
                else:
                    (sendto6 if len(hop) == 4 else sendto)(tx_views[i][:length], hop)
            except OSError as e:
                if len(hop) != 4 and not df:    # by the inner family: IPv4 peers carry either
                    if pypath.path_drop_of(pa, DROP_SEND_ERROR, tx_bufs[i], length):
                        tx6 -= 1
                        tx6_by -= length
                    continue
                # IPv6 alone: the error queue, or a probe, says why (pysys)
                if not pysys.refused(self, tx_bufs[i], tx_views[i][:length], hop, e.errno or 0):
                    tx6 -= 1
                    tx6_by -= length
                    continue
                batch = 1
            tx_pk, tx_by = tx_pk + 1, tx_by + length
            if tracing:
                pypath.trace_record(pa, TR_UDP_SEND, length, str_to_int(hop[0]), hop[1],
                                    batch, None)
        c[SYSCALLS] += reads + m
        c[TUN_READS] += reads
        c[UDP_SENDS] += m
        c[V6_UDP_TX_PACKETS] += tx6
        c[V6_UDP_TX_BYTES] += tx6_by
        c[UDP_TX_PACKETS] += tx_pk
        c[UDP_TX_BYTES] += tx_by
        if n:
            c[TX_BATCHES] += 1
        return more, err

    def udp_batch(self, receive) -> bool:
        """UDP -> TUN from one socket, ``receive`` being its (recv_into, recvfrom_into).
        Returns True if the socket may have more right now."""
        pa, c, engine = self.path, self.c, self.engine
        self.take_tables()
        tracing = pa.tracing = engine._tracing
        need_src = tracing or not pa.accept_any or engine._strict
        nbatch, rx_bufs, rx_len, rx_src = self.nbatch, self.rx_bufs, self.rx_len, self.rx_src
        recv_into, recvfrom_into = receive
        size, dontwait = self.mtu + 1, socket.MSG_DONTWAIT
        k = recvs = 0
        more = True
        while k < nbatch:
            recvs += 1
            try:
                if need_src:
                    rx_len[k], rx_src[k] = recvfrom_into(rx_bufs[k], size, dontwait)
                else:
                    rx_len[k] = recv_into(rx_bufs[k], size, dontwait)
            except OSError:        # EAGAIN, or e.g. a pending ICMP error on the socket
                more = False
                break
            k += 1
        c[UDP_RECVS] += recvs
        c[SYSCALLS] += recvs
        if not k:
            return False
        c[RX_BATCHES] += 1
        # Taken after the receives, so that a set published before a datagram
        # was sent is the one that judges it (as in C, which looks before each
        # packet). Strict needs the sources, so it starts with a batch that
        # asked for them.
        pa.local = engine._local
        pa.strict_sources = engine._strict and need_src
        drop_of, trace_record = pypath.path_drop_of, pypath.trace_record
        write, rx_views = self.write, self.rx_views
        writes = tx_pk = tx_by = lost6 = lost6_by = 0
        for i in pypath.path_udp(pa, rx_bufs, rx_len, rx_src, k, self.mtu):
            # The write's outcome is counted here, as tun_batch counts a send
            # (path.c's dp_path_tun_written: pypath.py says why).
            length = rx_len[i]
            writes += 1
            try:
                if write(rx_views[i][:length]) is None:     # FileIO's EAGAIN
                    if drop_of(pa, DROP_TUN_FULL, rx_bufs[i], length):
                        lost6 += 1                # IPv6's, which path_udp counted through
                        lost6_by += length
                    continue
            except OSError as e:
                if e.errno == errno.EBADFD:   # the device is gone: the loop ends
                    self.gone = e.errno
                if drop_of(pa, pypath.tun_write_drop(e.errno or errno.EIO), rx_bufs[i], length):
                    lost6 += 1
                    lost6_by += length
                continue
            tx_pk, tx_by = tx_pk + 1, tx_by + length
            if tracing:
                trace_record(pa, TR_TUN_WRITE, length, 0, 0, 0, rx_bufs[i])
        c[SYSCALLS] += writes
        c[TUN_WRITES] += writes
        fwd6, fwd6_by = pa.fwd6
        c[V6_TUN_TX_PACKETS] += fwd6 - lost6
        c[V6_TUN_TX_BYTES] += fwd6_by - lost6_by
        c[TUN_TX_PACKETS] += tx_pk
        c[TUN_TX_BYTES] += tx_by
        return more

    def handled(self) -> int:
        """Packets handled so far in both directions."""
        return self.c[TUN_RX_PACKETS] + self.c[UDP_RX_PACKETS]

    def one_pass(self, tun_more: bool, udp_more: bool, udp6_more: bool, tun_events: int) -> int:
        """Both directions, one batch each (UDP -> TUN: one per socket), at most ROUNDS
        times; the packets handled."""
        engine = self.engine
        before = self.handled()
        engine._beats += 1            # the heartbeat, on every pass as loop.c's
        self.take_tables()
        udp6_more = udp6_more and self.receive6 is not None
        for _ in range(ROUNDS):
            if not (tun_more or udp_more or udp6_more):
                break
            if tun_more:
                tun_more, tun_err = self.tun_batch()
                # A TUN whose device is gone fails every read with EBADFD (and
                # epoll says ERR): the loop ends (dataplane.h).
                if tun_err and (tun_err == errno.EBADFD or
                                tun_events & (select.EPOLLERR | select.EPOLLHUP)):
                    self.gone = tun_err
            if engine._stopping or self.gone:
                break
            if udp_more:
                udp_more = self.udp_batch(self.receive)
            if engine._stopping or self.gone:
                break
            if udp6_more:
                udp6_more = self.udp_batch(self.receive6)
            if engine._stopping or self.gone:
                break
        return self.handled() - before

    def wake_drain(self) -> None:
        self.c[SYSCALLS] += 1
        try:
            os.eventfd_read(self.wake_fd)
        except BlockingIOError:       # someone else's wake-up was already consumed
            pass

    def coalesce(self, usecs: int, lights: tuple[bool, bool],
                 last_work_ns: int) -> tuple[int, tuple[bool, bool], int]:
        """The coalescing wait: the wake fd, and the fd of each direction light in the last
        wait and pass (``lights``: TUN, UDP), can end it early; a busy direction's packets
        queue up in the TUN or the socket meanwhile instead of waking us one by one. Then a
        pass over both, without epoll. ``last_work_ns``: when the last pass that forwarded
        anything ended, this wait's start. Returns the pass's packets, the lights for the
        next wait (a direction is light at LIGHT_PACKETS per whole wait or fewer, at the rate
        it had over this wait and pass; loop.c: light) and ``last_work_ns`` again, moved to
        the end of this pass if it forwarded anything."""
        c = self.c
        c[SYSCALLS] += 1
        c[COALESCE_WAITS] += 1
        if pysys.coalesce_wait(self, lights, usecs):    # the UDP sockets' errors emptied
            self.wake_drain()
        if self.engine._stopping:
            return 0, lights, last_work_ns
        tun0, udp0 = c[TUN_RX_PACKETS], c[UDP_RX_PACKETS]
        self.one_pass(True, True, True, 0)
        tun, udp = c[TUN_RX_PACKETS] - tun0, c[UDP_RX_PACKETS] - udp0
        end = time.monotonic_ns()
        ns = max(end - last_work_ns, 1)
        lights = tuple(n * usecs * 1000 <= LIGHT_PACKETS * ns for n in (tun, udp))
        return tun + udp, lights, end if tun + udp else last_work_ns

    def run(self) -> Ended:
        engine, c = self.engine, self.c
        tun_fd, udp_fd, wake_fd, poll = self.tun_fd, self.udp_fd, self.wake_fd, self.poll
        udp6_fd = self.udp6_fd
        monotonic_ns = time.monotonic_ns
        wait_s = WAKE_MS / 1000       # bounded, as loop.c's: an idle loop beats too
        last_work_ns = 0              # when the last pass that forwarded anything ended
        while not engine._stopping and not self.gone:
            c[SYSCALLS] += 1
            c[POLLS] += 1
            tun_more = udp_more = udp6_more = False
            tun_events = 0
            for fd, ev in poll(wait_s):
                if fd == tun_fd:
                    tun_more = True
                    tun_events = ev
                elif fd == udp_fd:
                    udp_more = True
                elif fd == udp6_fd:
                    udp6_more = True
                elif fd == wake_fd:   # stop, or a new route table
                    self.wake_drain()
                if ev & select.EPOLLERR and fd in self.socks:   # dataplane.h "Path MTU"
                    pysys.errqueue(self.socks[fd], c)
            work = self.one_pass(tun_more, udp_more, udp6_more, tun_events)
            usecs = engine._coalesce_us
            if not work or not usecs:
                continue
            # Coalescing, once packets come densely (this work within DENSE_WAITS
            # waits of the last): while passes find work, wait and look again; a
            # pass that finds nothing hands the wake-ups back to epoll. A lone
            # packet (a ping, a request) finds no wait in its way.
            now_ns = monotonic_ns()
            if now_ns - last_work_ns < usecs * 1000 * DENSE_WAITS:
                lights = (False, False)       # unknown yet: the first wait holds both
                while work and not engine._stopping and not self.gone:
                    work, lights, now_ns = self.coalesce(usecs, lights, now_ns)
            last_work_ns = now_ns
        return Ended("tun_gone", self.gone) if self.gone else Ended("stopped")
