"""Which kernel offloads the dataplane switches on: decided and probed once, at start.

``--offload auto`` with the C engine:

* the TUN is opened with ``IFF_VNET_HDR`` (every read and write carries a
  10-byte ``struct virtio_net_hdr``) and ``TUNSETOFFLOAD`` is tried with
  CSUM|TSO4|TSO6|USO4|USO6, then without USO (Linux < 6.2), then given up:
  the kernel may then hand us TCP/UDP super-packets of up to 64 KB that the
  C engine cuts into MTU-sized datagrams (the wire format never changes);
* ``UDP_GRO`` on every socket (the kernel may hand us a train of datagrams
  from one peer in one receive), and ``UDP_SEGMENT`` probed (a train of
  equal-sized datagrams to one peer goes out in one send);
* TUN GRO (the engine writes consecutive TCP segments of one flow into the
  TUN as one GSO packet) when the TUN has vnet headers and TSO4 was accepted,
  and UDP runs too (consecutive datagrams of one flow as one USO packet) when
  USO was accepted: a kernel that knows TUN_F_USO4 (6.2) also takes
  VIRTIO_NET_HDR_GSO_UDP_L4 in writes.

When TUNSETOFFLOAD refuses everything, the TUN keeps its vnet headers
(``OFF_TUN_VNET`` alone): the kernel then writes plain packets behind an
all-zero header, which the engine handles on the same path as any non-GSO
packet, so this costs 10 bytes per packet and no second code path; reopening
the device without vnet headers would mean closing and re-creating flannel0
for a kernel that no longer exists in practice (TUN_F_CSUM is from 2.6.27).
Only ``IFF_VNET_HDR`` itself being refused (EINVAL) opens the TUN without it.

A dual-stack flannel0 gets the same: the C engine cuts IPv6 super-packets (TCPV6, and UDP_L4
of IPv6) and coalesces IPv6 runs (TCPV6 and UDP_L4 writes) as it does IPv4's.

The Python engine gets no offloads (it has no segmentation or coalescing
code; a super-packet would be dropped as malformed), nor does ``--offload
off``: then nothing is even tried and the fds are flanneld's.
"""
from __future__ import annotations

import errno

from ..engine.api import OFF_TUN_GRO, OFF_TUN_GRO_UDP, OFF_TUN_VNET, OFF_UDP_GRO, OFF_UDP_GSO
from .tun import (TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_USO4, TUN_F_USO6, open_tun_queues,
                  set_offload)

MODES = ("auto", "off")
DEFAULT_MODE = "auto"        # C engine: probe and use what the kernel offers; Python: always off
SOL_UDP = 17
UDP_SEGMENT = 103           # <linux/udp.h>, Linux >= 4.18
UDP_GRO = 104               # Linux >= 5.0
TUN_TSO = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6
TUN_ALL = TUN_TSO | TUN_F_USO4 | TUN_F_USO6
# What /metrics and the log call each offload, in the order they are shown.
NAMES = ("tun_vnet", "tun_csum", "tun_tso", "tun_uso", "tun_gro", "tun_gro_udp", "udp_gso",
         "udp_gro")


class Offloads:
    """The decision and the probe results for one run (daemon or forward)."""

    def __init__(self, mode: str, engine: str):
        if mode not in MODES:
            raise ValueError(f"offload mode {mode!r}: use {' or '.join(MODES)}")
        self.mode = mode
        self.engine = engine
        self.vnet = False
        self.tun_features = 0       # TUN_F_* bits TUNSETOFFLOAD accepted and left on
        self.kernel_uso = False     # TUNSETOFFLOAD took USO: the TUN takes USO writes too
        self.udp_gso = False
        self.udp_gro = False
        self.refused: dict[str, str] = {}
        if mode == "off":
            self.why_off = "--offload off"
        elif engine != "c":
            self.why_off = (f"the {engine} engine has no offloads (it cannot segment or "
                            "coalesce; only the C engine can)")
        else:
            self.why_off = ""

    @property
    def wanted(self) -> bool:
        return not self.why_off

    # -- probing ---------------------------------------------------------------
    def open_tun(self, name_template: str, queues: int) -> tuple[list[int], str]:
        """The TUN queues, with vnet headers when offloads are wanted and the kernel allows."""
        if self.wanted:
            try:
                fds, name = open_tun_queues(name_template, queues, vnet_hdr=True)
                self.vnet = True
                return fds, name
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                self.refused["tun_vnet"] = f"IFF_VNET_HDR refused ({e.strerror})"
        return open_tun_queues(name_template, queues)

    def adopt_tun(self) -> None:
        """The TUN was handed over rather than opened: it has vnet headers exactly when
        offloads are wanted (the daemon checked its flags)."""
        self.vnet = self.wanted

    def probe(self, tun_fds, socks) -> int:
        """Switch on what the kernel accepts on these fds; return the OFF_* flags."""
        if not self.wanted:
            return 0
        if self.vnet:
            self._probe_tun(tun_fds)
        self.udp_gro = self._udp_option(socks, UDP_GRO, 1, "udp_gro", "UDP_GRO (Linux >= 5.0)")
        self.udp_gso = self._udp_option(socks, UDP_SEGMENT, 0, "udp_gso",
                                        "UDP_SEGMENT (Linux >= 4.18)")
        return self.flags

    def _probe_tun(self, fds) -> None:
        last = None
        for features in (TUN_ALL, TUN_TSO):
            try:
                # The features belong to the device; set them through every queue anyway so
                # that no queue's view can differ.
                for fd in fds:
                    set_offload(fd, features)
            except OSError as e:
                last = e
                continue
            self.kernel_uso = features == TUN_ALL
            self.tun_features = features
            if features != TUN_ALL:
                self.refused["tun_uso"] = (f"TUNSETOFFLOAD refused USO ({last.strerror}; "
                                           "needs Linux >= 6.2)")
            return
        why = f"TUNSETOFFLOAD refused CSUM|TSO ({last.strerror if last else '?'})"
        self.refused["tun_tso"] = why + "; the TUN keeps plain packets behind zero vnet headers"

    def _udp_option(self, socks, opt: int, value: int, name: str, what: str) -> bool:
        done = []
        try:
            for s in socks:
                s.setsockopt(SOL_UDP, opt, value)
                done.append(s)
        except OSError as e:
            for s in done:          # all sockets alike, or none
                try:
                    s.setsockopt(SOL_UDP, opt, 0)
                except OSError:
                    pass
            self.refused[name] = f"{what} refused ({e.strerror})"
            return False
        return True

    # -- results -----------------------------------------------------------------
    @property
    def flags(self) -> int:
        f = 0
        if self.vnet:
            f |= OFF_TUN_VNET
            if self.tun_features & TUN_F_TSO4:
                f |= OFF_TUN_GRO
                # A kernel that takes USO from TUNSETOFFLOAD (6.2 on) also
                # takes UDP GSO packets written to the TUN.
                if self.kernel_uso:
                    f |= OFF_TUN_GRO_UDP
        if self.udp_gso:
            f |= OFF_UDP_GSO
        if self.udp_gro:
            f |= OFF_UDP_GRO
        return f

    def enabled(self, in_use: int | None = None) -> dict[str, bool]:
        """{name: on} for every name in NAMES (for /metrics and --stats-file): as decided at
        start, or as the engine runs them now (``in_use``, its offloads_in_use(): UDP GSO goes off
        when the kernel cannot segment)."""
        tf = self.tun_features
        f = self.flags if in_use is None else self.flags & in_use
        return {
            "tun_vnet": bool(f & OFF_TUN_VNET),
            "tun_csum": bool(tf & TUN_F_CSUM),
            "tun_tso": bool(tf & TUN_F_TSO4),
            "tun_uso": bool(tf & TUN_F_USO4 and tf & TUN_F_USO6),
            "tun_gro": bool(f & OFF_TUN_GRO),
            "tun_gro_udp": bool(f & OFF_TUN_GRO_UDP),
            "udp_gso": bool(f & OFF_UDP_GSO),
            "udp_gro": bool(f & OFF_UDP_GRO),
        }

    def summary(self) -> str:
        """One log line: what is on, what was refused and why."""
        if not self.wanted:
            return f"Offloads: none ({self.why_off})"
        on = [n for n, v in self.enabled().items() if v]
        text = f"Offloads (--offload auto): on: {', '.join(on) or 'none'}"
        if self.refused:
            text += "; refused: " + "; ".join(f"{n}: {why}" for n, why in self.refused.items())
        return text

    def as_json(self, in_use: int | None = None) -> dict:
        return {"mode": self.mode, "flags": self.flags, "enabled": self.enabled(in_use),
                "refused": dict(self.refused), "why_off": self.why_off}


__all__ = ["Offloads", "MODES", "DEFAULT_MODE", "NAMES"]
