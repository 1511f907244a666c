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
"""
from __future__ import annotations

import ctypes
import socket
import struct

SOCKET_BUFFER = 4 << 20          # bytes; large buffers absorb bursts (docs/design.md#lessons)
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33      # <asm-generic/socket.h>; beyond [rw]mem_max (root)
SO_ATTACH_REUSEPORT_CBPF = 51

# Classic BPF opcodes (<linux/filter.h>).
_LD, _LDX, _ALU, _RET, _MISC = 0x00, 0x01, 0x04, 0x06, 0x07
_W, _B = 0x00, 0x10
_ABS, _IND, _MSH = 0x20, 0x40, 0xA0
_MUL, _RSH, _MOD, _XOR = 0x20, 0x70, 0x90, 0xA0
_K, _X = 0x00, 0x08
_TAX, _RET_A = 0x00, 0x10
_INSN = struct.Struct("=HBBI")   # struct sock_filter


def steering_program(queues: int) -> list[tuple[int, int]]:
    """(code, k) pairs: socket index = hash(inner src, dst, ports word) % queues.

    The program sees the UDP payload (the inner IPv4 packet) at offset 0. The
    XOR of the fields is folded to 16 bits, then hashed multiplicatively
    (Fibonacci hashing: the high half of x * 2^32/phi mixes every low bit of
    x), because the low bits of the plain XOR are nearly constant: Linux gives
    connect()ed sockets even ports, and parallel connections neighbouring
    ones. A packet too short for a load ends the program with 0 (socket 0); a
    non-first fragment hashes other bytes than its first fragment, which is
    harmless (reassembly happens after the TUN write).
    """
    return [
        (_LDX | _B | _MSH, 0),          # X = 4 * ihl
        (_LD | _W | _IND, 0),           # A = the 4 bytes after the IP header (the ports)
        (_MISC | _TAX, 0),
        (_LD | _W | _ABS, 12),          # A = source address
        (_ALU | _XOR | _X, 0),
        (_MISC | _TAX, 0),
        (_LD | _W | _ABS, 16),          # A = destination address
        (_ALU | _XOR | _X, 0),          # A = ports ^ src ^ dst
        (_MISC | _TAX, 0),
        (_ALU | _RSH | _K, 16),
        (_ALU | _XOR | _X, 0),          # fold: the source port (high half) reaches the low bits
        (_ALU | _MUL | _K, 0x9E3779B1),
        (_ALU | _RSH | _K, 16),
        (_ALU | _MOD | _K, queues),
        (_RET | _RET_A, 0),
    ]


def attach_steering(sock: socket.socket, queues: int) -> None:
    """Attach :func:`steering_program` to the reuseport group of ``sock``."""
    prog = steering_program(queues)
    buf = ctypes.create_string_buffer(b"".join(_INSN.pack(code, 0, 0, k) for code, k in prog))
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; } (padded to 16)
    fprog = struct.pack("HL", len(prog), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)


def _set_buffers(sock: socket.socket, size: int) -> None:
    for force, opt in ((SO_SNDBUFFORCE, socket.SO_SNDBUF), (SO_RCVBUFFORCE, socket.SO_RCVBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)


def _check_free(ip: str, port: int) -> None:
    """EADDRINUSE if anyone holds ip:port, SO_REUSEPORT or not."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((ip, port))


def open_udp_sockets(ip: str, port: int, queues: int = 1, *, bufsize: int = SOCKET_BUFFER,
                     blocking: bool = True) -> list[socket.socket]:
    """``queues`` UDP sockets bound to ``ip:port`` (see the module docstring).

    Port 0 binds the first socket to a free port and the others to the same
    one (for tests). Raises OSError (EADDRINUSE when the port is taken); on
    failure nothing stays open.
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
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socks.append(s)
            _set_buffers(s, bufsize)
            if multi:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind((ip, port))
            port = s.getsockname()[1]
            s.setblocking(blocking)
        if multi:
            attach_steering(socks[0], queues)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks
