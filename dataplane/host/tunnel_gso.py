"""The external interface's UDP tunnel segmentation and checksums, for the kernel path.

The kernel path's egress program encapsulates a pod's TCP super-packet (up to 64 KB) whole and
marks it as a UDP tunnel packet. A NIC cuts such a packet into datagrams of the MTU, in hardware
or, when it lacks the feature, in the kernel's software; a virtual device (a veth, as in every
test here) that announces ``tx-udp_tnl-segmentation`` passes it on uncut, and a peer (flanneld,
either engine, a kernel path that cannot decapsulate one whole) reads a 64 KB datagram
truncated. The same device leaves the inner TCP or UDP checksum of a packet the host's stack
handed over unfinished (CHECKSUM_PARTIAL: to be completed by the device) as it is, which a peer
program's decapsulation keeps as "to be completed" but a peer that reads the datagram (flanneld,
either engine) gets with a wrong checksum: its kernel drops every TCP segment. So the kernel path
turns those features off (``tx-udp_tnl-csum-segmentation`` and the device's transmit checksums
too) on an external interface with no bus behind it (ETHTOOL_GDRVINFO's bus_info empty: a
virtual device), which makes the kernel cut the super-packets and finish the checksums before
they leave, as it does for a NIC that lacks the features; docs/kernel-path.md says when they are
put back. Through the ethtool ioctl (SIOCETHTOOL), in the caller's network namespace: no
ethtool binary.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import socket
import struct

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO, ETHTOOL_GSTRINGS, ETHTOOL_GSSET_INFO = 0x03, 0x1B, 0x37
ETHTOOL_GFEATURES, ETHTOOL_SFEATURES = 0x3A, 0x3B
ETH_SS_FEATURES = 4
ETH_GSTRING_LEN = 32
FEATURES = ("tx-udp_tnl-segmentation", "tx-udp_tnl-csum-segmentation", "tx-checksum-ip-generic",
            "tx-checksum-ipv4", "tx-checksum-ipv6")
_DRVINFO_SIZE = 196      # struct ethtool_drvinfo


def _ioctl(name: str, buf) -> None:
    ifr = struct.pack("16sP", name.encode(), ctypes.addressof(buf))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCETHTOOL, ifr)


def is_virtual(name: str) -> bool:
    """A device with no bus behind it (veth, bridge, bond, vlan...)."""
    buf = ctypes.create_string_buffer(struct.pack("I", ETHTOOL_GDRVINFO), _DRVINFO_SIZE)
    try:
        _ioctl(name, buf)
    except OSError as e:
        if e.errno == errno.EOPNOTSUPP:   # no driver to ask: virtual
            return True
        raise
    bus_info = buf.raw[4 + 3 * 32:4 + 4 * 32].split(b"\0", 1)[0]
    return not bus_info


def _feature_names(name: str) -> list[str]:
    info = ctypes.create_string_buffer(struct.pack("IIQ", ETHTOOL_GSSET_INFO, 0,
                                                   1 << ETH_SS_FEATURES), 24)
    _ioctl(name, info)
    count = struct.unpack_from("I", info.raw, 16)[0]
    buf = ctypes.create_string_buffer(struct.pack("III", ETHTOOL_GSTRINGS, ETH_SS_FEATURES, count),
                                      12 + count * ETH_GSTRING_LEN)
    _ioctl(name, buf)
    raw = buf.raw[12:]
    return [raw[i * ETH_GSTRING_LEN:(i + 1) * ETH_GSTRING_LEN].split(b"\0", 1)[0].decode()
            for i in range(count)]


def _bits(name: str) -> tuple[dict[str, int], int]:
    """FEATURES' bits on this device, and the feature words the kernel has (it wants them all)."""
    names = _feature_names(name)
    return {f: names.index(f) for f in FEATURES if f in names}, (len(names) + 31) // 32


def active(name: str) -> dict[str, bool]:
    """FEATURES this device has, on (True) or off."""
    bits, blocks = _bits(name)
    if not bits:
        return {}
    buf = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_GFEATURES, blocks),
                                      8 + blocks * 16)
    _ioctl(name, buf)
    out = {}
    for f, bit in bits.items():
        act = struct.unpack_from("I", buf.raw, 8 + (bit // 32) * 16 + 8)[0]
        out[f] = bool(act >> (bit % 32) & 1)
    return out


def set_features(name: str, on: bool, features=FEATURES) -> None:
    """Ask for ``features`` on or off (OSError when the device refuses)."""
    bits, blocks = _bits(name)
    bits = {f: b for f, b in bits.items() if f in features}
    if not bits:
        return
    words = [[0, 0] for _ in range(blocks)]       # valid, requested
    for bit in bits.values():
        words[bit // 32][0] |= 1 << (bit % 32)
        if on:
            words[bit // 32][1] |= 1 << (bit % 32)
    buf = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_SFEATURES, blocks) + b"".join(
        struct.pack("II", *w) for w in words))
    _ioctl(name, buf)


def put_back(name: str, features) -> None:
    """``features`` on again on device ``name`` (OSError when the device refuses or is gone)."""
    if features:
        set_features(name, True, list(features))


class TunnelSegmentation:
    """The external interface ``name``'s tunnel segmentation, turned off where it would pass the
    kernel path's super-packets on uncut (:meth:`cut`) and put back (:meth:`restore`).

    ``record`` (engine/bpf_pins.py OffloadRecord, beside the path's pins, or None) keeps what was
    turned off for as long as the path outlives the process: what a daemon before this one
    recorded for this device is taken as turned off by this one (a successor finds the
    features off and must not take that for the device's own state), and the path's removal
    puts it back from the record alone."""

    def __init__(self, name: str, record=None):
        self.name = name
        self.record = record
        self.turned_off: list[str] = []       # what cut() turned off, to put back
        self.note = ""                        # what was done, for status
        self._recorded: list[str] = []
        kept = record.read() if record is not None else None
        if kept and kept[0] == name:
            self.turned_off = list(kept[1])
            self._recorded = list(kept[1])

    def cut(self) -> str:
        """Turn the features off on a virtual device where they are on; says what it did."""
        if not is_virtual(self.name):
            self.note = f"{self.name} is a NIC: it cuts tunnel super-packets itself"
            return self.note
        on = [f for f, v in active(self.name).items() if v]
        if on:
            set_features(self.name, False, on)
            still = [f for f, v in active(self.name).items() if v and f in on]
            if still:
                raise OSError(f"{self.name} kept {', '.join(still)} on")
            self.turned_off += [f for f in on if f not in self.turned_off]
        self.note = (f"{', '.join(self.turned_off)} turned off on {self.name} so that the kernel "
                     "cuts super-packets into datagrams of the MTU and finishes their checksums"
                     if self.turned_off else
                     f"{self.name} has no tunnel segmentation or transmit checksums on: the kernel "
                     "cuts super-packets and finishes their checksums")
        if self.record is not None and self.turned_off != self._recorded:
            try:
                self.record.write(self.name, self.turned_off)
                self._recorded = list(self.turned_off)
            except OSError as e:
                self.note += (f" (not recorded beside the pins: {e}; `flannel-udp cleanup` "
                              f"cannot put them back: ethtool -K {self.name} ... on)")
        return self.note

    def restore(self) -> None:
        """What cut() turned off, on again (a device gone took its settings with it)."""
        off, self.turned_off = self.turned_off, []
        if off:
            try:
                put_back(self.name, off)
            except OSError:
                pass
        if self.record is not None:
            self.record.clear()
            self._recorded = []
