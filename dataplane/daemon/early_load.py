"""The kernel path's programs loaded in a thread while a fresh start talks to etcd.

Loading them (the loader's imports, cffi parsing maps.h and libbpf's declarations, then libbpf
and the kernel's verifier) needs neither the config nor the lease, and takes a few hundred ms a
start would otherwise spend before its lease (docs/kernel-path.md#maps-at-scale). So a start
that may run them (``--engine kernel|auto``) and takes nothing over begins the load at once,
with the pin directory the engine's choice will name, and the choice takes its result
(:meth:`EarlyLoad.loader`): the same KernelPath, or the same error, as a load at that point,
read at the join. What the maps hold and the attach still follow the lease, as before. The
programs are loaded, never attached, so a result the start does not use (it stopped or failed
first, or the pin directory is another by then) is closed without a trace: :meth:`discard`.
A takeover loads as it did, after the handed-over state says where (daemon/main.py).

`flannel-udp run` begins it before it imports the daemon (:func:`begin`, ~0.4 s of imports the
load's C part runs beside) when nothing can be handed over: no --handover, no fds from systemd.
"""
from __future__ import annotations

import os
import threading


class EarlyLoad:
    """``load(pin_dir=...)`` (engine/choice.py load_kernel_path) run in a thread from now, for
    the pin directory ``where()`` names (found in the thread too: its module is the loader's)."""

    def __init__(self, where, load=None):
        self.pin_dir = None
        self._where, self._load = where, load
        self._kpath = self._error = None
        self._thread = threading.Thread(target=self._run, name="kernel-path-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.pin_dir = self._where()
            if self._load is None:
                from ..engine.choice import load_kernel_path as load
                self._load = load
            self._kpath = self._load(pin_dir=self.pin_dir)
        except BaseException as e:    # noqa: BLE001 -- raised again at the join, in its place
            self._error = e

    def _take(self):
        """The join: the loaded KernelPath, now the caller's, or the load's error raised."""
        self._thread.join()
        kpath, error, self._kpath, self._error = self._kpath, self._error, None, None
        if error is not None:
            raise error
        return kpath

    def loader(self, pin_dir: str):
        """What choose_engine loads the kernel path with (its ``load_kernel``): this load's result
        for the same ``pin_dir``; None (the caller loads, as without this) for another one."""
        self._thread.join()
        if pin_dir == self.pin_dir:
            return self._take
        self.discard()
        return None

    def discard(self) -> None:
        """Joined, and what was loaded and not taken closed (nothing was attached or pinned)."""
        self._thread.join()
        kpath, self._kpath, self._error = self._kpath, None, None
        if kpath is not None:
            kpath.close()


def begin(opts) -> EarlyLoad | None:
    """:func:`start`'s load begun before the daemon knows what it inherits: only where nothing
    can be handed over (no --handover, no fds passed by systemd); else None (the daemon then
    starts it as before)."""
    env = os.environ
    if opts.handover or env.get("LISTEN_FDS", "0") not in ("", "0"):
        return None
    return start(opts, None)


def start(opts, inherited, begun: EarlyLoad | None = None) -> EarlyLoad | None:
    """The early load for a start that takes nothing over and whose engine choice loads the
    kernel path, pinned where daemon/main.py's choice will pin it; else None. ``begun``: the
    one :func:`begin` started, taken for a fresh start, else discarded."""
    if begun is not None:
        if inherited is None:
            return begun
        begun.discard()
    from ..engine.choice import loads_kernel
    flag = None if opts.sources.get("engine") == "default" else opts.engine
    if inherited is not None or not loads_kernel(flag):
        return None

    def where():
        from ..engine.bpf_pins import pin_dir
        from .kernel_path import device_name
        return pin_dir(device_name(opts.bpf_pins), opts.bpf_pins)
    return EarlyLoad(where)


def loader(early: EarlyLoad | None, pin_dir: str):
    """``early``'s loader for ``pin_dir`` (None: load there as before)."""
    return None if early is None else early.loader(pin_dir)


def discard(early: EarlyLoad | None) -> None:
    if early is not None:
        early.discard()
