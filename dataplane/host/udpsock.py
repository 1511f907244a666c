"""The UDP socket(s) of the dataplane, for the daemon and `forward` alike.

One queue is flanneld's socket: bound to ``<interface IP>:<port>``, large
buffers. With N queues there are N sockets with ``SO_REUSEPORT``, all bound
to that same address and port, so the wire is unchanged: every datagram still
leaves from and arrives at ``IP:port``.

Two things SO_REUSEPORT alone gets wrong here:

* **Spreading.** The kernel picks a socket of the group by a hash of the
  outer 4-tuple, and between two hosts that is always ``peerIP:port ->
  ourIP:port``: all traffic of one peer would land on one socket. A classic
  BPF program (``SO_ATTACH_REUSEPORT_CBPF``) picks the socket from the
  *inner* packet instead (addresses and ports, at the start of the UDP
  payload), so each inner flow keeps one queue (no reordering) and the flows
  of one peer spread over all queues.
* **Exclusivity.** Any later socket of the same user with SO_REUSEPORT could
  join the group and take a share of the traffic (a second daemon started by
  mistake would do so silently). So the port is first bound once without
  SO_REUSEPORT: if that fails with EADDRINUSE, someone holds it.

The IPv6 underlay (docs/operating.md#dual-stack) is a second group of the same shape on
``[PublicIPv6]:port``, one socket per queue beside each IPv4 one, ``IPV6_V6ONLY`` (an IPv4
datagram belongs to the IPv4 group) and with the same steering: the program reads the inner
packet, whichever family carried it. The address's family picks the group's. It carries inner
IPv6 alone, so the whole socket can refuse to fragment (:func:`path_mtu_options`); the IPv4
group's stay as they are, the kernel fragmenting inner IPv4 as under flanneld (the engines ask
for "don't fragment" per datagram of inner IPv6 there: csrc/dataplane.h "Path MTU").

Some hosts refuse the steering program: kernels before 4.5, QEMU's user-mode
emulation (which does not emulate the option), seccomp or LSM sandboxes.
Without it the group would spread by the outer 4-tuple, one socket per peer,
and two hosts would talk over one queue anyway; so :func:`open_queue_sockets`
falls back to flanneld's layout, ONE socket without SO_REUSEPORT, and
reports the refusal for the caller to log (and to drop its extra TUN
queues). Every error names the call that failed (:class:`SocketCallError`),
so that a message says what the kernel refused instead of guessing a cause.
"""
from __future__ import annotations

import ctypes
import errno
import socket
import struct

SOCKET_BUFFER = 4 << 20          # bytes; large buffers absorb bursts (docs/design.md#lessons)
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33      # <asm-generic/socket.h>; beyond [rw]mem_max (root)
SO_ATTACH_REUSEPORT_CBPF = 51
STEERING_CALL = "setsockopt(SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF)"
# The errnos by which a host says it does not do the steering at all, as opposed to rejecting
# this program: ENOPROTOOPT (the option is unknown: Linux < 4.5, QEMU user mode), EPERM and
# EACCES (seccomp, an LSM), EOPNOTSUPP and ENOSYS (other sandboxes). EINVAL, ENOMEM and the
# rest stay errors: the kernel knows the option and rejected this program or this socket, a
# bug or a limit that one queue would only hide.
STEERING_REFUSED = frozenset({errno.ENOPROTOOPT, errno.EPERM, errno.EACCES, errno.EOPNOTSUPP,
                              errno.ENOSYS})

# Classic BPF opcodes (<linux/filter.h>).
_LD, _LDX, _ALU, _JMP, _RET, _MISC = 0x00, 0x01, 0x04, 0x05, 0x06, 0x07
_W, _B = 0x00, 0x10
_ABS, _IND, _MSH = 0x20, 0x40, 0xA0
_MUL, _RSH, _MOD, _XOR = 0x20, 0x70, 0x90, 0xA0
_JEQ = 0x10
_K, _X = 0x00, 0x08
_TAX, _RET_A = 0x00, 0x10
_INSN = struct.Struct("=HBBI")   # struct sock_filter


def steering_program(queues: int) -> list[tuple[int, int, int, int]]:
    """struct sock_filter's (code, jt, jf, k): socket index = hash(inner src, dst, ports word)
    % queues.

    The program sees the UDP payload (the inner packet) at offset 0. The
    XOR of the fields is folded to 16 bits, then hashed multiplicatively
    (Fibonacci hashing: the high half of x * 2^32/phi mixes every low bit of
    x), because the low bits of the plain XOR are nearly constant: Linux gives
    connect()ed sockets even ports, and parallel connections neighbouring
    ones. An IPv6 packet hashes the low words of its addresses (where hosts of
    one subnet differ) and the 4 bytes after the fixed header: the ports when
    no extension header comes first, else bytes as constant per flow. A
    packet too short for a load ends the program with 0 (socket 0); a
    non-first fragment hashes other bytes than its first fragment, which is
    harmless (reassembly happens after the TUN write).
    """
    tail = [
        (_MISC | _TAX, 0),
        (_ALU | _RSH | _K, 16),
        (_ALU | _XOR | _X, 0),          # fold: the source port (high half) reaches the low bits
        (_ALU | _MUL | _K, 0x9E3779B1),
        (_ALU | _RSH | _K, 16),
        (_ALU | _MOD | _K, queues),
        (_RET | _RET_A, 0),
    ]
    v4 = [
        (_LDX | _B | _MSH, 0),          # X = 4 * ihl
        (_LD | _W | _IND, 0),           # A = the 4 bytes after the IP header (the ports)
        (_MISC | _TAX, 0),
        (_LD | _W | _ABS, 12),          # A = source address
        (_ALU | _XOR | _X, 0),
        (_MISC | _TAX, 0),
        (_LD | _W | _ABS, 16),          # A = destination address
        (_ALU | _XOR | _X, 0),          # A = ports ^ src ^ dst
    ] + tail
    v6 = [
        (_LD | _W | _ABS, 40),          # A = the 4 bytes after the fixed header
        (_MISC | _TAX, 0),
        (_LD | _W | _ABS, 20),          # A = the source address's low word
        (_ALU | _XOR | _X, 0),
        (_MISC | _TAX, 0),
        (_LD | _W | _ABS, 36),          # A = the destination address's low word
        (_ALU | _XOR | _X, 0),
    ] + tail
    head = [
        (_LD | _B | _ABS, 0),
        (_ALU | _RSH | _K, 4),          # A = the version
    ]
    return ([(code, 0, 0, k) for code, k in head]
            + [(_JMP | _JEQ | _K, len(v4), 0, 6)]          # version 6: jump over the IPv4 part
            + [(code, 0, 0, k) for code, k in v4 + v6])


class SocketCallError(OSError):
    """An OSError of one call made while opening the sockets; ``call`` names it
    ("bind(10.0.0.1:8285)", :data:`STEERING_CALL`, ...). ``errno`` and ``strerror`` are the
    kernel's."""

    def __init__(self, call: str, err: OSError):
        super().__init__(err.errno, err.strerror)
        self.call = call

    @property
    def errno_name(self) -> str:
        return errno.errorcode.get(self.errno, str(self.errno))

    def __str__(self) -> str:
        return f"{self.call} failed: {self.errno_name} ({self.strerror})"


def steering_refused(e: BaseException) -> bool:
    """Whether ``e``, raised by :func:`open_udp_sockets`, is the host refusing the steering
    program itself (then one queue is the way to run), rather than an error."""
    return (isinstance(e, SocketCallError) and e.call == STEERING_CALL
            and e.errno in STEERING_REFUSED)


def one_queue_warning(refused: SocketCallError, queues: int) -> str:
    """The one log line of a run that falls back to one queue."""
    return (f"{refused.call} refused: {refused.errno_name} ({refused.strerror}); running 1 "
            f"queue instead of {queues} (--queues): this kernel, emulator or sandbox does not "
            "steer a SO_REUSEPORT group, and without that one peer's datagrams all reach one "
            "socket")


def _call(what: str, fn, *args):
    try:
        return fn(*args)
    except SocketCallError:
        raise
    except OSError as e:
        raise SocketCallError(what, e) from None


def attach_steering(sock: socket.socket, queues: int) -> None:
    """Attach :func:`steering_program` to the reuseport group of ``sock``."""
    prog = steering_program(queues)
    buf = ctypes.create_string_buffer(b"".join(_INSN.pack(*insn) for insn in prog))
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; } (padded to 16)
    fprog = struct.pack("HL", len(prog), ctypes.addressof(buf))
    _call(STEERING_CALL, sock.setsockopt, socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)


def _set_buffers(sock: socket.socket, size: int) -> None:
    for force, opt in ((SO_SNDBUFFORCE, socket.SO_SNDBUF), (SO_RCVBUFFORCE, socket.SO_RCVBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:
            name = "SO_SNDBUF" if opt == socket.SO_SNDBUF else "SO_RCVBUF"
            _call(f"setsockopt(SOL_SOCKET, {name}, {size})", sock.setsockopt,
                  socket.SOL_SOCKET, opt, size)


def _family(ip: str) -> int:
    return socket.AF_INET6 if ":" in str(ip) else socket.AF_INET


def endpoint(ip: str, port: int) -> str:
    """``ip:port`` as messages write it (``[ip]:port`` for IPv6)."""
    return f"[{ip}]:{port}" if _family(ip) == socket.AF_INET6 else f"{ip}:{port}"


def _socket(ip: str) -> socket.socket:
    """An unbound UDP socket of ``ip``'s family; an IPv6 one takes IPv6 only."""
    family = _family(ip)
    name = "AF_INET6" if family == socket.AF_INET6 else "AF_INET"
    s = _call(f"socket({name}, SOCK_DGRAM)", socket.socket, family, socket.SOCK_DGRAM)
    if family == socket.AF_INET6:
        try:
            _call("setsockopt(IPPROTO_IPV6, IPV6_V6ONLY)", s.setsockopt, socket.IPPROTO_IPV6,
                  socket.IPV6_V6ONLY, 1)
        except BaseException:
            s.close()
            raise
    return s


def _bind(s: socket.socket, ip: str, port: int) -> None:
    _call(f"bind({endpoint(ip, port)})", s.bind, (str(ip), port))


def _check_free(ip: str, port: int) -> None:
    """EADDRINUSE if anyone holds ip:port, SO_REUSEPORT or not."""
    with _socket(ip) as probe:
        _bind(probe, ip, port)


def open_udp_sockets(ip: str, port: int, queues: int = 1, *, bufsize: int = SOCKET_BUFFER,
                     blocking: bool = True) -> list[socket.socket]:
    """``queues`` UDP sockets bound to ``ip:port`` (see the module docstring), of ``ip``'s
    family.

    Port 0 binds the first socket to a free port and the others to the same
    one (for tests). Raises :class:`SocketCallError` (EADDRINUSE when the port
    is taken); on failure nothing stays open.
    """
    queues = int(queues)
    if queues < 1:
        raise ValueError(f"queues {queues} must be >= 1")
    multi = queues > 1
    if multi and port:
        _check_free(ip, port)
    socks: list[socket.socket] = []
    try:
        for _ in range(queues):
            s = _socket(ip)
            socks.append(s)
            _set_buffers(s, bufsize)
            if multi:
                _call("setsockopt(SOL_SOCKET, SO_REUSEPORT)", s.setsockopt, socket.SOL_SOCKET,
                      socket.SO_REUSEPORT, 1)
            _bind(s, ip, port)
            port = s.getsockname()[1]
            s.setblocking(blocking)
        if multi:
            attach_steering(socks[0], queues)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


def open_queue_sockets(ip: str, port: int, queues: int, **kw) -> tuple[list[socket.socket],
                                                                       SocketCallError | None]:
    """:func:`open_udp_sockets`, or ONE socket when the host refuses the steering program
    (:func:`steering_refused`): ``(sockets, the refusal or None)``. The group is closed before
    the single socket binds, so the port is the one asked for (with port 0, another free one)."""
    try:
        return open_udp_sockets(ip, port, queues, **kw), None
    except SocketCallError as e:
        if not steering_refused(e):
            raise
        refused = e
    return open_udp_sockets(ip, port, 1, **kw), refused


IPV6_MTU_DISCOVER, IPV6_RECVERR, IPV6_PMTUDISC_DO = 23, 25, 2      # <linux/in6.h>
IP_MTU_DISCOVER, IP_RECVERR = 10, 11                               # <linux/in.h>
PMTUDISC_WANT = 1                # IP_ and IPV6_: the default, fragmenting where it must


def path_mtu_options(sock: socket.socket) -> None:
    """An IPv6 underlay socket as the engines want it (csrc/dataplane.h "Path MTU"): the kernel
    cuts no outer packet into fragments and refuses one over the path MTU it knows with
    EMSGSIZE (IPV6_PMTUDISC_DO), that MTU on the error queue (IPV6_RECVERR), for the engine to
    answer the inner packet with packet too big. Set on sockets handed over from another
    daemon too, so it is idempotent. SocketCallError where the host refuses either."""
    for name, opt, val in (("IPV6_RECVERR", IPV6_RECVERR, 1),
                           ("IPV6_MTU_DISCOVER", IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO)):
        _call(f"setsockopt(IPPROTO_IPV6, {name}, {val})", sock.setsockopt,
              socket.IPPROTO_IPV6, opt, val)


def path_mtu_defaults(sock: socket.socket) -> None:
    """A UDP socket back to the kernel's defaults on the path MTU (PMTUDISC_WANT, no RECVERR):
    the IPv4 underlay's, which the engines switch for a probe's send alone (csrc/pmtu.c) and a
    daemon killed inside that window hands over switched; or IPv6 ones path_mtu_options could
    not finish. SocketCallError where the host refuses either."""
    level, recverr, discover = ((socket.IPPROTO_IPV6, IPV6_RECVERR, IPV6_MTU_DISCOVER)
                                if sock.family == socket.AF_INET6 else
                                (socket.IPPROTO_IP, IP_RECVERR, IP_MTU_DISCOVER))
    for name, opt, val in (("RECVERR", recverr, 0), ("MTU_DISCOVER", discover, PMTUDISC_WANT)):
        _call(f"setsockopt({name}, {val})", sock.setsockopt, level, opt, val)


def steering_refusal() -> SocketCallError | None:
    """The refusal :func:`open_queue_sockets` would meet on this host, or None; asked of a
    socket that is bound nowhere (the kernel makes a group of one for it), for a daemon that
    is handed one queue and must tell a fallback from a changed setting."""
    with _call("socket(AF_INET, SOCK_DGRAM)", socket.socket, socket.AF_INET,
               socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            attach_steering(s, 2)
        except SocketCallError as e:
            if steering_refused(e):
                return e
            raise
    return None
