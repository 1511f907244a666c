"""What this kernel and its devices offer the kernel path's programs, asked of the kernel itself:
whether a device has an Ethernet header, and whether bpf_skb_adjust_room can decapsulate a TCP
super-packet whole (docs/kernel-path.md, "Helpers and the oldest kernel")."""
from __future__ import annotations

import fcntl
import socket
import struct

ARPHRD_ETHER = 1
_SIOCGIFHWADDR = 0x8927


def link_is_ethernet(ifindex: int) -> bool:
    """Whether the device (in the caller's network namespace) has an Ethernet header: asked of
    the kernel, not sysfs, which shows the namespace it was mounted in."""
    name = socket.if_indextoname(ifindex)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s, _SIOCGIFHWADDR, struct.pack("16s16x", name.encode()))
    return struct.unpack_from("H", ifr, 16)[0] == ARPHRD_ETHER


def kernel_decaps_gso(btf: str = "/sys/kernel/btf/vmlinux") -> bool:
    """Whether this kernel's bpf_skb_adjust_room clears the UDP tunnel GSO bits when it
    decapsulates (BPF_F_ADJ_ROOM_DECAP_L4_UDP, after Linux 6.18): its name is in the kernel's
    BTF. Without it a super-packet decapsulated whole would still say it is encapsulated, so
    the ingress program hands those on to the engine (FU_F_DECAP_GSO off)."""
    try:
        with open(btf, "rb") as f:
            return b"BPF_F_ADJ_ROOM_DECAP_L4_UDP\0" in f.read()
    except OSError:
        return False
