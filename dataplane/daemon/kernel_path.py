"""The daemon's kernel path: the tc programs (engine/bpf_path.py) in front of its engines.

engine/choice.py decides at start whether they run (``--engine kernel|auto``: built and loaded,
else why not); this holds them for the daemon's whole run, since its engines come and go (a
lease move, a failed handover make new ones on the same fds) while the programs and their maps
stay: each engine the daemon makes is wrapped (engine/kernel_engine.py KernelEngine, through
host/assembly.py kernel_engine) around the one KernelPath, which the engines do not own. The
first engine's start attaches them; where that fails, ``--engine kernel`` fails the start and
auto goes on with the engine alone, saying why.

The path outlives the daemon (docs/kernel-path.md#restarts): its programs and maps are pinned
under ``--bpf-pins``/<flannel0's name> and flannel0 is persistent (:meth:`hold`), so a stop, a
restart, an upgrade, a handover and a crash alike leave it forwarding with no process, and the
next daemon adopts it (the pinned maps taken over, only the difference written). :meth:`close`
therefore leaves it as it is. A daemon that runs without it (``--engine c|python``, or auto
that goes without it) takes it away first: the pinned filters and pins removed, flannel0 made
to go with the process again, so that no stale programs run beside the engine.
"""
from __future__ import annotations

import logging
import os
import re
import socket

log = logging.getLogger(__name__)

LEFT_MESSAGE = ("the kernel path keeps forwarding without a daemon; `flannel-udp cleanup "
                "--kernel-path` removes it")


def device_name(root: str, inherited: str | None = None) -> str:
    """flannel0's name for this start: the one handed over; else the device a kernel path left
    here (named by a pin directory under ``root``, and present in this network namespace), to
    be used again; else the first free flannel<N> (what the kernel makes of "flannel%d")."""
    if inherited:
        return inherited
    present = {name for _, name in socket.if_nameindex()}
    from ..engine import bpf_pins
    for d in bpf_pins.directories(root):
        name = os.path.basename(d)
        if name in present and re.fullmatch(r"flannel\d+", name):
            return name
    n = 0
    while f"flannel{n}" in present:
        n += 1
    return f"flannel{n}"


def remove_other_leases(tun_name: str, parts) -> None:
    """A persistent flannel0 taken up again under another lease: the old lease's addresses
    removed (host/netconf.py), said once."""
    from ..host.netconf import remove_other_leases as remove
    try:
        gone = remove(tun_name, parts)
    except Exception as e:              # never fatal: only said
        log.warning("cannot remove another lease's addresses from %s: %s (ip addr del ... dev "
                    "%s)", tun_name, e, tun_name)
        return
    if gone:
        log.warning("%s, left by the daemon before (the kernel path keeps it), held the "
                    "addresses of another lease: removed %s", tun_name, ", ".join(map(str, gone)))


class DaemonKernelPath:
    """``choice``: engine/choice.py's EngineChoice; ``ext`` the external interface (host/iface.py
    ExternalInterface), ``port`` the config's; ``pin_dir`` where the path is pinned (the one
    the choice loaded it with: ``--bpf-pins``/:attr:`tun_name`)."""

    def __init__(self, choice, ext, port: int, pin_dir: str):
        from ..host.tunnel_gso import TunnelSegmentation
        self.kpath = choice.kernel
        self.required = choice.forced and self.kpath is not None
        self.why = choice.kernel_why      # why the programs do not run ("" while they do)
        # whether the engines are wrapped at all: decided once, so the route table's type
        # stays the same for the daemon's whole run (engine/kernel_engine.py KernelTable)
        self.wraps = self.kpath is not None
        self.ext, self.port = ext, port
        self.pin_dir = pin_dir
        self.tun_name = os.path.basename(pin_dir)     # flannel0's, by :func:`device_name`
        from ..engine.bpf_pins import OffloadRecord
        # what it turns off is recorded beside the pins: the path's removal puts it back
        self.segmentation = TunnelSegmentation(ext.name, OffloadRecord(pin_dir)) \
            if self.wraps else None
        self.attached = False
        self.left = False                 # :meth:`close` left the path forwarding
        self._tun_fd = None
        if self.kpath is not None and self.kpath.adopted:
            log.info("kernel path: adopted the one pinned at %s (%s programs: %s); only what "
                     "changed is written to its maps", pin_dir,
                     "the same" if self.kpath.same_programs else "other",
                     "left on their hooks" if self.kpath.same_programs
                     else "they replace the running ones in place")
        if not self.wraps:
            self._remove_stale()
        if self.kpath is not None and ext.ext_addr != ext.iface_addr:
            self._drop(f"the PublicIP {ext.ext_addr} is not {ext.name}'s address "
                       f"{ext.iface_addr} (address translation): the programs send from and "
                       "listen on one address")

    def check(self) -> str | None:
        """Why ``--engine kernel`` cannot run after all (None when it can)."""
        return self.why if self.required and self.kpath is None else None

    def hold(self, tun_fd: int) -> None:
        """flannel0 (one queue's fd, once open or handed over) outlives the process exactly
        while the kernel path runs (adopted, or once attached: :meth:`started`): its packets
        cross flannel0 with no process in the way. A start that fails before leaves none."""
        self._tun_fd = tun_fd
        self._persist(self.kpath is not None and (self.attached or self.kpath.adopted))

    def _persist(self, want: bool) -> None:
        from ..host.tun import IFF_PERSIST, set_persist, tun_info
        if self._tun_fd is None:
            return
        try:
            if bool(tun_info(self._tun_fd)[1] & IFF_PERSIST) == want:
                return
            set_persist(self._tun_fd, want)
        except OSError as e:
            log.warning("cannot make %s %spersistent: %s", self.tun_name, "" if want else "non-", e)
            return
        log.info("%s %s", self.tun_name, "outlives the daemon from now on (persistent): the "
                 "kernel path's packets cross it with no process" if want else
                 "goes with the daemon again (no longer persistent): no kernel path runs on it")

    def table_type(self, cls) -> type:
        """The route table type of the engines the daemon makes of ``cls``."""
        if not self.wraps:
            return cls.table_type
        from ..engine.kernel_engine import KernelTable
        return KernelTable.over(cls.table_type)

    def wrap(self, engine, tun_name: str, own_ip6=None):
        """``engine`` (made, not started) behind the programs, or as it is without them;
        ``own_ip6`` the IPv6 underlay's address (None: none, or the programs do without it)."""
        if not self.wraps:
            return engine
        from ..host.assembly import kernel_engine
        return kernel_engine(engine, self.kpath, tun_name=tun_name, ext_name=self.ext.name,
                             own_ip=self.ext.iface_addr, port=self.port,
                             required=self.required, owns_path=False,
                             segmentation=self.segmentation, kernel_why=self.why,
                             own_ip6=own_ip6)

    def started(self, engine) -> None:
        """After ``engine`` (one :meth:`wrap` made) started: whether the programs attached."""
        if not self.wraps or self.kpath is None:
            return
        if engine.in_kernel:
            self.attached = True
            self._persist(True)
        else:
            self._drop(engine.kernel_why)

    def _drop(self, why: str) -> None:
        kpath, self.kpath = self.kpath, None
        self.why = f"kernel path: not used: {why}"
        if self.required:
            return                      # the start fails with it (check)
        log.warning("%s; the engine forwards alone", self.why)
        if kpath is not None:
            kpath.close()
        self._remove_stale()
        self._persist(False)
        if self.segmentation is not None:
            self.segmentation.restore()

    def _remove_stale(self) -> None:
        """What a kernel path left (pinned, or only a filter of a killed daemon) taken away:
        the engine forwards alone, and programs beside it would take the peers' datagrams."""
        from ..engine.bpf_lib import BpfLibError
        from ..engine.kernel_engine import remove_stale_filter
        try:
            if os.path.isdir(self.pin_dir):
                from ..engine import bpf_pinned
                lines = bpf_pinned.remove(self.pin_dir)
                for line in lines:
                    log.info("kernel path left by a daemon before: %s", line)
                if lines:
                    log.warning("Removed the kernel path pinned at %s: this daemon runs "
                                "without it", self.pin_dir)
        except (OSError, BpfLibError) as e:
            log.warning("cannot remove the kernel path pinned at %s (%s): its programs may take "
                        "the peers' datagrams from the engine; `flannel-udp cleanup "
                        "--kernel-path` removes it", self.pin_dir, e)
        if remove_stale_filter(self.ext.index):
            log.warning("Removed the kernel path's filter from %s's ingress, left by a daemon that "
                        "did not stop (killed): it delivered the peers' datagrams to a flannel0 "
                        "that is gone, so the engine alone would have seen none", self.ext.name)

    @property
    def in_kernel(self) -> bool:
        return self.kpath is not None and self.attached

    def counters(self) -> dict | None:
        """The programs' counters (engine/bpf_contract.py COUNTER_NAMES), None when they do
        not run."""
        return self.kpath.counters() if self.in_kernel else None

    def status(self) -> dict:
        """What `flannel-udp status` says of it."""
        return {"path": "kernel" if self.in_kernel else "engine",
                "why": self.why or "the tc programs forward; the engine is the slow path",
                "offload": self.segmentation.note if self.segmentation is not None else None,
                "pins": self.pin_dir if self.kpath is not None else None,
                "counters": self.counters()}

    def close(self, leave_attached: bool = False) -> None:
        """The daemon goes, the path stays: a stop, a restart, a crash's successor and a handover
        (``leave_attached``) alike, since the daemon cannot tell a stop from a restart. The
        programs stay on their hooks with their maps pinned, flannel0 persistent, the
        segmentation as the programs need it; the next daemon adopts them, and `flannel-udp
        cleanup --kernel-path` removes them. One attached by nobody (a start that ended before
        its engine) and adopted from nobody is closed."""
        kpath, self.kpath = self.kpath, None
        if kpath is None:
            return
        if self.attached or kpath.adopted or leave_attached:
            kpath.leave()
            self.left = True
        else:
            kpath.close()
            self._persist(False)
