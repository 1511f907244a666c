"""The daemon's kernel path: the tc programs (engine/bpf_path.py) in front of its engines.

engine/choice.py decides at start whether they run (``--engine kernel|auto``: built and loaded,
else why not); this holds them for the daemon's whole run, since its engines come and go (a
lease move, a failed handover make new ones on the same fds) while the programs and their maps
stay: each engine the daemon makes is wrapped (engine/kernel_engine.py KernelEngine, through
host/assembly.py kernel_engine) around the one KernelPath, which the engines do not own. The
first engine's start attaches them; where that fails, ``--engine kernel`` fails the start and
auto goes on with the engine alone, saying why.

At the end (:meth:`close`): the programs are detached and the external interface's tunnel
segmentation put back, unless a successor took over (a handover: ``leave_attached``), whose own
programs then replace ours on the hooks with no gap. Pinning them across restarts
(docs/kernel-path.md) plugs in at that same call.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class DaemonKernelPath:
    """``choice``: engine/choice.py's EngineChoice; ``ext`` the external interface (host/iface.py
    ExternalInterface), ``port`` the config's."""

    def __init__(self, choice, ext, port: int):
        from ..host.tunnel_gso import TunnelSegmentation
        self.kpath = choice.kernel
        self.required = choice.forced and self.kpath is not None
        self.why = choice.kernel_why      # why the programs do not run ("" while they do)
        # whether the engines are wrapped at all: decided once, so the route table's type
        # stays the same for the daemon's whole run (engine/kernel_engine.py KernelTable)
        self.wraps = self.kpath is not None
        self.ext, self.port = ext, port
        self.segmentation = TunnelSegmentation(ext.name) if self.wraps else None
        self.attached = False
        if not self.wraps:
            self._remove_stale()
        if self.kpath is not None and ext.ext_addr != ext.iface_addr:
            self._drop(f"the PublicIP {ext.ext_addr} is not {ext.name}'s address "
                       f"{ext.iface_addr} (address translation): the programs send from and "
                       "listen on one address")

    def check(self) -> str | None:
        """Why ``--engine kernel`` cannot run after all (None when it can)."""
        return self.why if self.required and self.kpath is None else None

    def table_type(self, cls) -> type:
        """The route table type of the engines the daemon makes of ``cls``."""
        if not self.wraps:
            return cls.table_type
        from ..engine.kernel_engine import KernelTable
        return KernelTable.over(cls.table_type)

    def wrap(self, engine, tun_name: str):
        """``engine`` (made, not started) behind the programs, or as it is without them."""
        if not self.wraps:
            return engine
        from ..host.assembly import kernel_engine
        return kernel_engine(engine, self.kpath, tun_name=tun_name, ext_name=self.ext.name,
                             own_ip=self.ext.iface_addr, port=self.port,
                             required=self.required, owns_path=False,
                             segmentation=self.segmentation, kernel_why=self.why)

    def started(self, engine) -> None:
        """After ``engine`` (one :meth:`wrap` made) started: whether the programs attached."""
        if not self.wraps or self.kpath is None:
            return
        if engine.in_kernel:
            self.attached = True
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
        if self.segmentation is not None:
            self.segmentation.restore()

    def _remove_stale(self) -> None:
        from ..engine.kernel_engine import remove_stale_filter
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
                "counters": self.counters()}

    def close(self, leave_attached: bool = False) -> None:
        """The programs detached and the segmentation put back; with ``leave_attached`` (a
        successor forwards) both stay as they are, the programs on their hooks."""
        kpath, self.kpath = self.kpath, None
        if kpath is None:
            return
        if leave_attached:
            kpath.leave_attached()
        kpath.close()
        if not leave_attached and self.segmentation is not None:
            self.segmentation.restore()
