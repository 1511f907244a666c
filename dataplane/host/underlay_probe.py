"""The IPv6 underlay's probe on the wire, and the socket its answers arrive on.

A probe is what a peer's engine takes for any other datagram of ours: flanneld's wire format,
the UDP payload a whole inner packet, here an ICMPv6 echo request from this host's flannel0
IPv6 address to the peer's. The daemon sends it itself on one of the sockets of the IPv6
underlay (the engines' address and port, so the peer's source check accepts it); the peer's
engine writes it into the peer's flannel0, the peer's kernel answers, and the answer crosses the
overlay back like any packet to this host, into our flannel0 and our kernel, where the raw
ICMPv6 socket of :class:`AnswerSocket` sees it (or on the external interface, from a peer that
routes our IPv6 part directly). The engines do nothing more per packet for this.

The echo's identifier and a token drawn at the daemon's start tell our answers from those of
anything else that pings over flannel0 (host to host pings of flannel0's address, another
daemon during a handover); the probe's number follows the token.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct

from ..engine import ipv6

ECHO_REQUEST, ECHO_REPLY = ipv6.ICMPV6_ECHO_REQUEST, ipv6.ICMPV6_ECHO_REPLY
ICMP6_FILTER = 1                        # linux/icmpv6.h: a socket option of IPPROTO_ICMPV6
HOP_LIMIT = 64
_NUMBER = struct.Struct("!Q")


class Prober:
    """Probes of one daemon: its identifier and token."""

    def __init__(self):
        self.ident = int.from_bytes(os.urandom(2), "big")
        self.token = os.urandom(8)

    def request(self, src, dst, number: int) -> bytes:
        """The inner IPv6 packet of probe ``number`` from ``src`` (our flannel0 address) to
        ``dst`` (the peer's)."""
        data = self.token + _NUMBER.pack(number)
        msg = ipv6.icmp_message(src, dst, ECHO_REQUEST, 0,
                                rest=self.ident << 16 | number & 0xFFFF, data=data)
        return ipv6.build(src, dst, msg, next_header=ipv6.NH_ICMPV6, hop_limit=HOP_LIMIT)

    def number(self, message: bytes):
        """The probe number an ICMPv6 message answers (as a raw ICMPv6 socket reads it: no
        IPv6 header), or None when it answers no probe of ours."""
        end = 8 + len(self.token) + _NUMBER.size
        if len(message) < end or message[0] != ECHO_REPLY or message[1] != 0 \
                or int.from_bytes(message[4:6], "big") != self.ident \
                or message[8:8 + len(self.token)] != self.token:
            return None
        return _NUMBER.unpack_from(message, 8 + len(self.token))[0]


class AnswerSocket:
    """A raw ICMPv6 socket that takes the echo replies this host receives: the kernel's filter
    passes no other type, so other ICMPv6 costs it nothing, and the replies of host-to-host
    pings are few."""

    def __init__(self):
        sock = socket.socket(socket.AF_INET6, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                             socket.IPPROTO_ICMPV6)
        try:
            words = [0xFFFFFFFF] * 8            # a set bit blocks its type
            words[ECHO_REPLY >> 5] &= ~(1 << (ECHO_REPLY & 31))
            sock.setsockopt(socket.IPPROTO_ICMPV6, ICMP6_FILTER, struct.pack("=8I", *words))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self, limit: int = 1024) -> list:
        """The messages waiting (up to ``limit``), without waiting."""
        out = []
        while len(out) < limit:
            try:
                out.append(self.sock.recv(2048))
            except (BlockingIOError, InterruptedError):
                break
        return out

    def close(self) -> None:
        self.sock.close()


# What an ICMPv6 error leaves pending on a socket with IPV6_RECVERR (the engines' sockets have
# it): the next call on the socket fails with it, whatever that call's destination
PENDING_ERRNOS = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH,
                            errno.EHOSTDOWN, errno.EACCES, errno.EPROTO, errno.EMSGSIZE})


def send(sock, datagram: bytes, peer, port: int) -> bool:
    """One probe on ``sock`` (a socket of the IPv6 underlay) to [peer]:port; False when the
    kernel refused it (it then counts as unanswered). A refusal that may be another peer's
    error left pending on the shared socket (a dead peer's port unreachable) consumed that
    error: the probe is tried once more, so a healthy peer does not miss for a dead one."""
    address = (str(ipaddress.IPv6Address(peer)), port)
    for attempt in (1, 2):
        try:
            sock.sendto(datagram, address)
            return True
        except OSError as e:
            if attempt == 2 or e.errno not in PENDING_ERRNOS:
                return False
    return False
