"""The Python engine's calls into the kernel beyond moving packets: a UDP socket's error queue,
IPv4's "don't fragment" for an inner IPv6 datagram, and what a refused send becomes
(csrc/dataplane.h "Path MTU"; pmtu.c's dp_pmtu_errqueue, dp_pmtu_refused and probe4, tx.c's
set_peer), and the loop thread's timer slack and coalescing wait (loop.c). pyloop.py's loop
calls them; only dont_fragment is on the path of a packet that goes through (an inner IPv6 one
to an IPv4 peer), and coalesce_wait between passes under load.
"""
from __future__ import annotations

import ctypes
import errno
import socket
import struct

from . import pypath
from .contract import ERRQ_MAX, MTU6_MIN, UNDERLAY4_HDRS, UNDERLAY6_HDRS
from .pypath import DROP_SEND_ERROR, SYSCALLS, UDP_RECVS, UDP_SENDS, UDP_TX_FRAGMENTED

PR_SET_TIMERSLACK = 29           # <linux/prctl.h>
UDP_SEGMENT = 103                # <linux/udp.h>
IP_MTU_DISCOVER, IP_PMTUDISC_WANT, IP_PMTUDISC_DO = 10, 1, 2       # <linux/in.h>
IP_RECVERR, IPV6_RECVERR = 11, 25                        # <linux/in.h>, <linux/in6.h>
IPV6_MTU_DISCOVER, IPV6_PMTUDISC_WANT, IPV6_PMTUDISC_DO = 23, 1, 2     # <linux/in6.h>
RECVERR = frozenset({(socket.IPPROTO_IP, IP_RECVERR), (socket.IPPROTO_IPV6, IPV6_RECVERR)})
# struct sock_extended_err (<linux/errqueue.h>): errno, origin, type, code, pad, info, data
_EE = struct.Struct("=IBBBBII")
SO_EE_ORIGIN_LOCAL, SO_EE_ORIGIN_ICMP, SO_EE_ORIGIN_ICMP6 = 1, 2, 3
# the control message: the error and the offender's address (a sockaddr_in6 at most)
_CTL = socket.CMSG_SPACE(_EE.size + 28)


def precise_timers() -> None:
    """This thread's timers fire on time, as the C loop's (loop.c): the default slack, 50 us,
    would stretch every coalescing wait by up to 50 us."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class _PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_POLLIN, _POLLERR = 0x1, 0x8
_ppoll = ctypes.CDLL(None, use_errno=True).ppoll
_ppoll.argtypes = (ctypes.POINTER(_PollFd), ctypes.c_ulong, ctypes.POINTER(_Timespec),
                   ctypes.c_void_p)


def coalesce_wait(loop, lights: tuple[bool, bool], usecs: int) -> bool:
    """loop.c's coalescing wait (ppoll: select and Python's poll have no microseconds and
    POLLERR apart): the wake fd, the fd of each light direction (``lights``: TUN, UDP), and the
    UDP sockets, busy ones for POLLERR alone, each such socket's error queue then emptied.
    True when the wake fd is readable. ``loop`` is pyloop's Loop."""
    udp_in = _POLLIN if lights[1] else 0
    fds = [(loop.wake_fd, _POLLIN)] + ([(loop.tun_fd, _POLLIN)] if lights[0] else [])
    fds += [(fd, udp_in) for fd in (loop.udp_fd, loop.udp6_fd) if fd is not None]
    pfd = (_PollFd * len(fds))(*(_PollFd(fd, ev, 0) for fd, ev in fds))
    if _ppoll(pfd, len(fds), _Timespec(0, usecs * 1000), None) <= 0:
        return False
    for p in pfd[len(fds) - (1 if loop.udp6_fd is None else 2):]:
        if p.revents & _POLLERR:
            errqueue(loop.socks[p.fd], loop.c)
    return bool(pfd[0].revents & _POLLIN)


def errqueue(sock: socket.socket, c: list) -> tuple[int, bool]:
    """Empty ``sock``'s error queue (at most ERRQ_MAX reads, counted in ``c``): ``(path MTU of
    the last local EMSGSIZE or 0, whether an error came from the network)``. An ICMP error
    pending on the socket fails its next call until the queue is read (io.c says more)."""
    mtu, network = 0, False
    for _ in range(ERRQ_MAX):
        c[SYSCALLS] += 1
        c[UDP_RECVS] += 1
        try:
            _, anc, _, _ = sock.recvmsg(1, _CTL, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except OSError:             # EAGAIN: empty
            break
        for level, type_, data in anc:
            if (level, type_) not in RECVERR or len(data) < _EE.size:
                continue
            ee_errno, origin, _, _, _, info, _ = _EE.unpack_from(data)
            if origin == SO_EE_ORIGIN_LOCAL and ee_errno == errno.EMSGSIZE:
                mtu = info
            elif origin in (SO_EE_ORIGIN_ICMP, SO_EE_ORIGIN_ICMP6):
                network = True
    return mtu, network


def dont_fragment(length: int) -> list:
    """The ancillary data of an inner IPv6 datagram to an IPv4 peer: UDP_SEGMENT at its own
    length, which the kernel never fragments and refuses over the path MTU."""
    return [(socket.IPPROTO_UDP, UDP_SEGMENT, struct.pack("=H", length))]


def refused(loop, buf, data, hop, err: int) -> bool:
    """A datagram (``data``, the packet in ``buf``, to ``hop``) the kernel refused with
    ``err``, of the IPv6 underlay or an inner IPv6 one to an IPv4 peer: True when it went on a
    second try, else it is counted where dataplane.h's "Path MTU" puts it (a packet too big
    written into the TUN, or drop_send_error). ``loop`` is pyloop's Loop."""
    if len(hop) != 4:
        return probe4(loop, buf, data, hop, err)
    pa, c, length = loop.path, loop.c, len(data)
    again = True
    while True:
        mtu, network = errqueue(loop.sock6, c)
        if err == errno.EMSGSIZE and mtu:
            return too_big(loop, buf, data, hop, mtu, UNDERLAY6_HDRS)
        if not network or not again:
            break
        again = False
        c[SYSCALLS] += 1
        c[UDP_SENDS] += 1
        try:
            loop.sendto6(data, hop)
            return True
        except OSError as e:
            err = e.errno or 0
    pypath.path_drop_of(pa, DROP_SEND_ERROR, buf, length)
    return False


def probe4(loop, buf, data, hop, err: int) -> bool:
    """An inner IPv6 datagram to an IPv4 peer, refused with ``err`` while it carried
    dont_fragment: when ``err`` may be about its size or the cmsg, sent again plain, the
    socket in IP_PMTUDISC_DO with IP_RECVERR for this send alone (pmtu.c's probe4)."""
    pa, c, sock, length = loop.path, loop.c, loop.sock, len(data)
    if err not in (errno.EMSGSIZE, errno.EINVAL, errno.EIO):     # not about the size
        pypath.path_drop_of(pa, DROP_SEND_ERROR, buf, length)
        return False
    c[SYSCALLS] += 5
    old, e, mtu = IP_PMTUDISC_WANT, 0, 0
    try:
        old = sock.getsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER)
    except OSError:                 # as C, which ignores it: the default put back
        pass
    try:
        sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
        sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        c[SYSCALLS] += 1
        c[UDP_SENDS] += 1
        try:
            loop.sendto(data, hop)
        except OSError as x:
            e = x.errno or errno.EIO
        if e == errno.EMSGSIZE:
            mtu, _ = errqueue(sock, c)
    except OSError as x:
        e = x.errno or errno.EIO
    finally:
        for opt, val in ((IP_MTU_DISCOVER, old), (IP_RECVERR, 0)):
            try:
                sock.setsockopt(socket.IPPROTO_IP, opt, val)
            except OSError:
                pass
    if not e:
        if err != errno.EMSGSIZE:
            loop.df4 = False        # the kernel refused the cmsg itself
        return True
    if e == errno.EMSGSIZE and mtu:
        return too_big(loop, buf, data, hop, mtu, UNDERLAY4_HDRS)
    pypath.path_drop_of(pa, DROP_SEND_ERROR, buf, length)
    return False


def too_big(loop, buf, data, hop, path_mtu: int, hdrs: int) -> bool:
    """A datagram refused over ``path_mtu`` (``hdrs``: the outer headers), pmtu.c's too_big:
    an inner IPv6 packet of at most MTU6_MIN, which its sender may always send, goes once more
    fragmented, as a tunnel entry sends it (True when it went); any other is path_too_big's."""
    pa, length = loop.path, len(data)
    if pypath.HEADER6 <= length <= MTU6_MIN and buf[0] >> 4 == 6:
        if fragmented(loop, data, hop):
            return True
        pypath.path_drop_of(pa, DROP_SEND_ERROR, buf, length)
        return False
    if pypath.path_too_big(pa, buf, length, path_mtu, hdrs):
        loop.icmp_send()
    return False


def fragmented(loop, data, hop) -> bool:
    """``data`` once more, the kernel allowed to fragment it: the IPv4 socket as it is, the
    IPv6 one in IPV6_PMTUDISC_WANT for this send alone (pmtu.c's fragmented)."""
    c, v6 = loop.c, len(hop) == 4
    sock = loop.sock6 if v6 else loop.sock
    old, sent = IPV6_PMTUDISC_DO, False
    if v6:
        c[SYSCALLS] += 3
        try:
            old = sock.getsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER)
        except OSError:
            pass
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_WANT)
        except OSError:
            pass
    c[SYSCALLS] += 1
    c[UDP_SENDS] += 1
    try:
        (loop.sendto6 if v6 else loop.sendto)(data, hop)
        sent = True
    except OSError:
        pass
    if v6:
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, old)
        except OSError:
            pass
    if sent:
        c[UDP_TX_FRAGMENTED] += 1
    return sent
