"""The kernel path (bpf_path.py KernelPath) in front of a slow-path engine, seen as one Engine.

The tc programs carry what they can in the kernel; whatever they hand on reaches the engine
behind them (a MultiEngine of C or Python queues), which answers it as it does alone. Callers
keep talking to one Engine (api.py), and this wrapper gives each call to both:

* the route table: ``table_type`` is :class:`KernelTable`, the slow engine's table beside the
  routes as a dict by subnet, derived from a change in the same call (``updated``, at the
  cost of the change, not of the table), so a peer change builds its routes once; ``set_table`` publishes the slow engine's part and writes the
  programs' maps (KernelPath.set_routes: only what changed is written); a path adopted from
  its pins runs already, so it gets the table the engine starts with, and the config once it
  is whole (set_local's subnets), never a half-made one;
* own sources (``set_local``), the strict rule, accept_any: both, the programs through
  KernelPath.configure, with what the engine was made with (own PublicIP, port, flannel0's MTU)
  and the lease's subnets as set_local last gave them (a lease move gives new ones);
* ``start``: the slow engine, then the programs attached (flannel0's egress, the external
  interface's ingress; KernelPath.attach replaces a filter at our handle and priority, so a
  successor's attach takes a handed-over daemon's place with no gap). Where the attach fails
  and the path was not asked for by name (``required`` False), the slow engine forwards alone
  and ``kernel_why`` says why; ``on_attach`` runs just before the attach (host/assembly.py:
  the external interface's tunnel segmentation);
* ``stop`` stops the slow engine only: the programs go on (a handover's switch);
  ``close`` detaches them when this engine owns its KernelPath (``owns_path``; then
  ``on_detach`` puts the segmentation back), else the owner does (the daemon's shutdown,
  which leaves them attached for a successor);
* ``stats`` are the slow engine's; ``kernel_counters`` the programs' (KernelPath.counters).

Everything else (queues, heartbeats, trace, offloads) is the slow engine's, by delegation.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time

from .api import ICMP_BURST_DEFAULT, Engine

log = logging.getLogger(__name__)
_TABLE_TYPES: dict = {}
_SERIALS = itertools.count(1)


def remove_stale_filter(ext_ifindex: int) -> bool:
    """Our ingress filter removed from the external interface (``ext_ifindex``, the caller's
    network namespace) where a kernel path that did not detach left it (a process killed):
    it would decapsulate the peers' datagrams into a flannel0 that is gone, and an engine
    running alone would never see one. True when there was one; False too without libbpf
    (then nothing of ours can be attached)."""
    from .bpf_lib import BpfLibError, lib, sized
    from .bpf_path import TC_HANDLE, TC_PRIORITY
    try:
        bpf = lib()
    except BpfLibError:
        return False
    hook = sized("struct bpf_tc_hook")
    hook.ifindex, hook.attach_point = ext_ifindex, bpf.BPF_TC_INGRESS
    opts = sized("struct bpf_tc_opts")
    opts.handle, opts.priority = TC_HANDLE, TC_PRIORITY
    return bpf.bpf_tc_detach(hook, opts) == 0


class KernelTable:
    """A slow engine's route table (``slow``) and the same routes by subnet (``routes``), made
    together from one change; immutable like the tables it wraps. ``serial`` numbers it,
    ``change`` is (the serial of the table it was derived from, removed, added), or None for
    one made whole: the programs are given the change when they hold that table.
    ``shadowed``: the routes of a table made whole that a later route of the same subnet
    replaced (their peers are senders still, as in the engines' tables; a derived table has
    none, as theirs).

    A change costs its own size, not the table's: the tables derived from one another share
    one dict, held by the newest, and each older one keeps how to undo the changes since
    (``_node``: the dict, or (the next table, its undo list)). Reading an older table's
    ``routes`` turns the dict back to it (the undo lists reversed on the way), under the lock
    its lineage shares: the daemon derives tables on one thread and may hand one to a new
    engine on another."""
    __slots__ = ("slow", "serial", "change", "shadowed", "_node", "_lock")
    slow_type: type = None

    def __init__(self, slow, routes: dict, change=None, shadowed=(), lock=None):
        self.slow, self.change, self.shadowed = slow, change, tuple(shadowed)
        self._node = routes
        self._lock = lock or threading.Lock()
        self.serial = next(_SERIALS)

    @classmethod
    def over(cls, slow_type: type) -> type:
        """The table type of a KernelEngine over engines whose table type is ``slow_type``
        (one class per slow type)."""
        made = _TABLE_TYPES.get(slow_type)
        if made is None:
            made = _TABLE_TYPES[slow_type] = type(f"Kernel{slow_type.__name__}", (cls,),
                                                  {"__slots__": (), "slow_type": slow_type})
        return made

    @classmethod
    def of(cls, routes=()):
        routes = list(routes)
        slow = cls.slow_type.of(routes)         # checks them: nothing is built if refused
        # one hash a subnet (a Python call each: 16,000 at a start), two where one repeats
        by_subnet, shadowed = {r.subnet: r for r in routes}, []
        if len(by_subnet) != len(routes):
            by_subnet = {}
            for r in routes:
                old = by_subnet.get(r.subnet)
                if old is not None:
                    shadowed.append(old)
                by_subnet[r.subnet] = r
        return cls(slow, by_subnet, shadowed=shadowed)

    def updated(self, removed=(), added=()):
        removed, added = list(removed), list(added)
        slow = self.slow.updated(removed, added)
        with self._lock:
            routes = self._head()
            undo = []
            for subnet in removed:
                if subnet in routes:
                    undo.append((subnet, routes.pop(subnet)))
            for r in added:
                undo.append((r.subnet, routes.get(r.subnet)))
                routes[r.subnet] = r
            undo.reverse()
            table = type(self)(slow, routes, (self.serial, removed, added), lock=self._lock)
            self._node = (table, undo)
        return table

    def _head(self) -> dict:
        """The shared dict, made this table's (the caller holds the lock)."""
        path, t = [], self
        while not isinstance(t._node, dict):
            path.append(t)
            t = t._node[0]
        routes = t._node
        for older in reversed(path):            # from the newest back to this one
            newer, undo = older._node
            redo = []
            for subnet, route in undo:
                redo.append((subnet, routes.get(subnet)))
                if route is None:
                    routes.pop(subnet, None)
                else:
                    routes[subnet] = route
            redo.reverse()
            newer._node = (older, redo)
            older._node = routes
        return routes

    @property
    def routes(self) -> dict:
        """{subnet: Route}: a copy (the work of the whole table: for a set made whole)."""
        with self._lock:
            return dict(self._head())

    def whole(self) -> list:
        """Every route as the engines' tables were given it, a replaced duplicate before the
        route that replaced it (KernelPath.set_routes takes the last one of a subnet)."""
        with self._lock:
            return list(self.shadowed) + list(self._head().values())

    def __len__(self) -> int:
        return len(self.slow)


class KernelEngine(Engine):
    """``slow`` (an Engine, usually a MultiEngine) behind ``kpath`` (a KernelPath, loaded), for
    flannel0 (``tun_ifindex``) and the external interface (``ext_ifindex``); ``own_ip`` and
    ``port`` are the datagrams' outer address and port. ``kpath`` None: the slow engine alone
    behind this interface (the table type stays)."""

    def __init__(self, slow, kpath, *, tun_ifindex: int, ext_ifindex: int, own_ip, port: int,
                 required: bool = False, owns_path: bool = True, on_attach=None,
                 on_detach=None, kernel_why: str = "", own_ip6=None):
        super().__init__(slow.tun_fd, slow.udp_fds[4], slow.tun_addr, slow.mtu, slow.batch,
                         slow.accept_any)
        self.slow, self.kpath = slow, kpath
        self.name = slow.name
        self.table_type = KernelTable.over(slow.table_type)
        self.forwards_in_python = slow.forwards_in_python
        self.tun_ifindex, self.ext_ifindex = tun_ifindex, ext_ifindex
        self.own_ip, self.port = own_ip, int(port)
        self.own_ip6 = own_ip6            # the IPv6 underlay's (None: the programs go without)
        self.required, self.owns_path = required, owns_path
        self.on_attach, self.on_detach = on_attach, on_detach
        self.kernel_why = kernel_why      # why the programs do not run, when they do not
        self.attached = False
        self._subnets: list = []
        self._strict = False
        self._closed = False
        self._refused = False
        self._written = None              # the serial of the table the programs hold
        # the config is written once it is whole (set_local's subnets, or start): a pinned
        # path adopted by this engine runs meanwhile, and must not see it half made
        self._config_whole = False
        self._started = False
        self._pending = None              # the table set before start

    # what the slow engine has and this wrapper does not change
    def __getattr__(self, name):
        if name == "slow":                # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.slow, name)

    def __len__(self) -> int:
        return len(self.slow)

    @property
    def in_kernel(self) -> bool:
        """Whether the programs forward (loaded, configured and attached)."""
        return self.kpath is not None and self.attached

    def _configure(self, whole: bool = False) -> None:
        self._config_whole = self._config_whole or whole
        if self.kpath is not None and self._config_whole:
            self.kpath.configure(own_ip=self.own_ip, port=self.port, mtu=self.mtu,
                                 own_subnets=self._subnets, strict=self._strict,
                                 accept_any=self.accept_any, own_ip6=self.own_ip6)

    # ---- the calls given to both -----------------------------------------------------------

    def set_table(self, table) -> None:
        self.slow.set_table(table.slow)
        if self.kpath is None:
            return
        if not self._started and self.kpath.adopted:
            # an adopted path (pinned: bpf_pins.py) forwards meanwhile from what it holds: its
            # maps get the table the engine starts with, not the ones before (the daemon's
            # first is empty until the peers are listed)
            self._pending = table
            return
        self._write(table)

    def _write(self, table) -> None:
        try:
            if table.change is not None and table.change[0] == self._written and \
                    not self._refused:
                self.kpath.change_routes(table.change[1], table.change[2])
            else:
                t0 = time.monotonic()
                routes = table.whole()
                self.kpath.set_routes(routes)
                log.debug("kernel path: a whole set of %d routes written in %.0f ms",
                          len(routes), (time.monotonic() - t0) * 1000)
        except RuntimeError as e:           # KernelPathError: routes the programs cannot hold
            self._routes_refused(table, e)
        self._written = table.serial

    def _routes_refused(self, table, e) -> None:
        """The programs get the routes over the IPv4 underlay only (no own_ip6 for the IPv6
        underlay's): the others find no route there and go on to the engine, which has them."""
        if not self._refused:
            log.warning("kernel path: %s; the engine carries what the programs cannot", e)
            self._refused = True
        # a subnet the engine routes over the IPv6 underlay has none here, not a replaced
        # duplicate's over IPv4
        routes = table.whole()
        last = {r.subnet: r.peer_ip.version for r in routes}
        self.kpath.set_routes([r for r in routes if r.peer_ip.version == 4 == last[r.subnet]])

    def set_local(self, own_subnets, addrs) -> None:
        own_subnets, addrs = list(own_subnets), list(addrs)
        self.slow.set_local(own_subnets, addrs)
        self._subnets = own_subnets
        if self.kpath is not None:
            self.kpath.set_local(addrs)
            self._configure(whole=True)

    def set_strict_sources(self, enable: bool) -> None:
        self.slow.set_strict_sources(enable)
        self._strict = bool(enable)
        self._configure()

    def start(self) -> None:
        self.slow.start()
        if self.kpath is None:
            return
        self._started = True
        try:
            self._configure(whole=True)
            if self._pending is not None:
                pending, self._pending = self._pending, None
                self._write(pending)
            if self.on_attach is not None:
                self.on_attach()
            self.kpath.attach(self.tun_ifindex, self.ext_ifindex)
            self.attached = True
        except (OSError, RuntimeError) as e:   # KernelPathError, BpfLibError, an ioctl's
            if self.required:
                self.slow.stop()
                raise
            self.kernel_why = f"attaching the programs failed: {e}"
            log.warning("kernel path: not used: %s; the %s engine forwards alone",
                        self.kernel_why, self.name)
            self._drop_path()

    def _drop_path(self) -> None:
        kpath, self.kpath = self.kpath, None
        if self.owns_path:
            kpath.close()
            if self.on_detach is not None:
                self.on_detach()

    def stop(self) -> None:
        self.slow.stop()

    def join(self, timeout: float | None = None) -> bool:
        return self.slow.join(timeout)

    def ended(self):
        return self.slow.ended()

    def on_end(self, callback) -> None:
        self.slow.on_end(lambda _slow: callback(self))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.slow.close()
        finally:
            if self.kpath is not None and self.owns_path:
                self._drop_path()

    # ---- the slow engine's -----------------------------------------------------------------

    def stats(self) -> dict:
        return self.slow.stats()

    def kernel_counters(self) -> dict | None:
        """The programs' counters (bpf_contract.COUNTER_NAMES), None when they do not run."""
        return self.kpath.counters() if self.in_kernel else None

    def heartbeat(self) -> int:
        return self.slow.heartbeat()

    def offloads_in_use(self) -> int:
        return self.slow.offloads_in_use()

    def set_icmp_limit(self, rate: int, burst: int = ICMP_BURST_DEFAULT) -> None:
        self.slow.set_icmp_limit(rate, burst)

    def set_coalesce(self, usecs: int) -> None:
        self.slow.set_coalesce(usecs)

    def set_tun_addr(self, addr) -> None:
        self.slow.set_tun_addr(addr)

    def set_udp(self, version: int, fd) -> None:
        self.slow.set_udp(version, fd)

    def set_offloads(self, flags: int) -> None:
        self.slow.set_offloads(flags)

    def trace(self, enable: bool) -> None:
        self.slow.trace(enable)

    def trace_events(self, after: int = 0) -> list:
        return self.slow.trace_events(after)
