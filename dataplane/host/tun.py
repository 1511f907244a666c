"""Opening the TUN device the way flanneld does (docs/flannel-compat.md#tun-device).

``open("/dev/net/tun")`` + ``ioctl(TUNSETIFF)`` with ``IFF_TUN|IFF_NO_PI``.
The device is *not* persistent: it exists for as long as this fd (or a dup of
it) is open, so closing the fd - or the process exiting - removes it. That is
why we do not use pyroute2's ``tuntap`` (it makes a persistent device that
outlives the daemon).

The kernel path (docs/kernel-path.md, "Restarts") is the exception: its packets
cross flannel0 with no process in the way, so there ``persist`` makes the device
outlive the process (TUNSETPERSIST), with its address, routes and tc filters,
and a new process attaches to it again by its name (the same TUNSETIFF).
:func:`remove_persistent` takes such a device away.

The device is created in the network namespace of the calling thread; to get
it inside a test namespace, run the opener inside it (``ip netns exec``).
Address, MTU, link state and routes are set by :mod:`dataplane.host.netconf`.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct

TUN_PATH = "/dev/net/tun"
# Packets each queue of flannel0 holds while no process reads it: during a restart (the default,
# 500, lasts half a second at 1,000 packets/s) and while an engine waits to batch
# (--coalesce-usecs). Set when the device is made, never on a live one: the kernel drops what is
# sent to it while it resizes the queues.
TXQUEUELEN = 4096

# <linux/if_tun.h>
TUNSETIFF = 0x400454CA          # _IOW('T', 202, int)
TUNSETOFFLOAD = 0x400454D0      # _IOW('T', 208, unsigned int)
TUNGETIFF = 0x800454D2          # _IOR('T', 210, unsigned int)
TUNSETPERSIST = 0x400454CB      # _IOW('T', 203, int)
IFF_PERSIST = 0x0800            # in TUNGETIFF's flags
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IFF_MULTI_QUEUE = 0x0100        # one fd per queue, all attached to one device
IFF_VNET_HDR = 0x4000           # a struct virtio_net_hdr before every packet
IFNAMSIZ = 16
# TUNSETOFFLOAD bits: what the kernel may hand us (and so what we must finish).
TUN_F_CSUM = 0x01               # checksums left partial (VIRTIO_NET_HDR_F_NEEDS_CSUM)
TUN_F_TSO4 = 0x02
TUN_F_TSO6 = 0x04
TUN_F_TSO_ECN = 0x08
TUN_F_USO4 = 0x20               # Linux >= 6.2
TUN_F_USO6 = 0x40

# struct ifreq is 40 bytes on 64-bit Linux: ifr_name[16], then a union whose
# first member we use is `short ifr_flags`.
_IFREQ = struct.Struct("16sH22x")


def open_tun(name_template: str = "flannel%d", *, nonblock: bool = True,
             multi_queue: bool = False, vnet_hdr: bool = False,
             persist: bool = False) -> tuple[int, str]:
    """Create a TUN device and return ``(fd, name)``.

    ``name_template`` may contain ``%d`` for the kernel to pick the first free
    number (``flannel%d`` -> ``flannel0``), or be a fixed name. The fd is
    close-on-exec and, by default, non-blocking (the engines read the TUN until
    EAGAIN). Raises OSError (EPERM without CAP_NET_ADMIN, ENOENT without
    /dev/net/tun, EBUSY/EINVAL for a name in use by another kind of device).

    ``multi_queue`` opens one queue of an ``IFF_MULTI_QUEUE`` device: call it
    again with the returned (exact) name for each further queue; every queue
    must be opened with the same flags. ``vnet_hdr`` puts a 10-byte
    ``struct virtio_net_hdr`` before every packet read and written (needed
    for :func:`set_offload`). ``persist``: the device stays when the last fd
    closes (the kernel path); a persistent device of that name is attached to
    again, as it is (EINVAL when its multi-queue flag differs).
    """
    raw = name_template.encode()
    if not raw or len(raw) >= IFNAMSIZ:
        raise ValueError(f"TUN name template {name_template!r} must be 1..{IFNAMSIZ - 1} bytes")
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_NONBLOCK if nonblock else 0)
    fd = os.open(TUN_PATH, flags)
    try:
        flags = IFF_TUN | IFF_NO_PI | (IFF_MULTI_QUEUE if multi_queue else 0) | \
            (IFF_VNET_HDR if vnet_hdr else 0)
        ifr = fcntl.ioctl(fd, TUNSETIFF, _IFREQ.pack(raw, flags))
        if persist:
            fcntl.ioctl(fd, TUNSETPERSIST, 1)
    except BaseException:
        os.close(fd)
        raise
    name = _IFREQ.unpack(ifr)[0].split(b"\0", 1)[0].decode()
    return fd, name


def set_offload(fd: int, flags: int) -> None:
    """``TUNSETOFFLOAD``: let the kernel hand this TUN (opened with
    ``vnet_hdr``) packets with partial checksums (TUN_F_CSUM) and TSO/USO
    super-packets. OSError EINVAL when the kernel does not know a bit."""
    fcntl.ioctl(fd, TUNSETOFFLOAD, int(flags))


def open_tun_queues(name_template: str = "flannel%d", queues: int = 1, *,
                    vnet_hdr: bool = False, persist: bool = False) -> tuple[list[int], str]:
    """Open ``queues`` fds of one TUN device and return ``(fds, name)``.

    One queue is exactly :func:`open_tun` (no ``IFF_MULTI_QUEUE``: a single
    queue behaves as flanneld's device). With more, the first open names the
    device and every further one attaches to that exact name with the same
    flags (the kernel refuses a queue whose flags differ). On failure every
    fd opened so far is closed, which removes the device again.
    """
    queues = int(queues)
    if queues < 1:
        raise ValueError(f"queues {queues} must be >= 1")
    multi = queues > 1
    fds: list[int] = []
    try:
        fd, name = open_tun(name_template, multi_queue=multi, vnet_hdr=vnet_hdr, persist=persist)
        fds.append(fd)
        for _ in range(queues - 1):
            fds.append(open_tun(name, multi_queue=True, vnet_hdr=vnet_hdr)[0])
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds, name


def tun_info(fd: int) -> tuple[str, int]:
    """``(device name, IFF_* flags)`` of the TUN queue behind ``fd`` (``TUNGETIFF``), for a
    daemon that was handed the fd rather than opening it. OSError EBADFD when the fd has no
    device any more; EINVAL when it is no TUN fd at all."""
    ifr = fcntl.ioctl(fd, TUNGETIFF, bytes(_IFREQ.size))
    name, flags = _IFREQ.unpack(ifr)
    return name.split(b"\0", 1)[0].decode(), flags



def set_persist(fd: int, on: bool) -> None:
    """The device behind ``fd`` outlives its last fd (``on``) or goes with it again: for a
    process that leaves the kernel path for an engine alone, or takes it up."""
    fcntl.ioctl(fd, TUNSETPERSIST, 1 if on else 0)


def remove_persistent(name: str) -> bool:
    """Take a persistent TUN device away: attached to, made non-persistent, let go (the kernel
    removes it with the last fd). False when there is no such device; OSError EBUSY while a
    process holds its only queue."""
    try:
        socket.if_nametoindex(name)     # attaching to a name that is free would make a device
    except OSError:
        return False
    fd = os.open(TUN_PATH, os.O_RDWR | os.O_CLOEXEC)
    try:
        try:
            fcntl.ioctl(fd, TUNSETIFF, _IFREQ.pack(name.encode(), IFF_TUN | IFF_NO_PI))
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            # a multi-queue device takes only a multi-queue attach (EINVAL again: no TUN)
            fcntl.ioctl(fd, TUNSETIFF, _IFREQ.pack(name.encode(),
                                                   IFF_TUN | IFF_NO_PI | IFF_MULTI_QUEUE))
        fcntl.ioctl(fd, TUNSETPERSIST, 0)
        return True
    finally:
        os.close(fd)
