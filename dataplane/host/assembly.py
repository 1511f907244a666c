"""The dataplane's assembly: flannel0's queues, the UDP sockets, the offloads they take and the
engines on them, put together here once for `flannel-udp run` (daemon/startup.py) and
`flannel-udp forward` (cli/forward.py); the bench, the demo and the testbed run those two.

The steps, in flanneld's order (the TUN before the socket):

1. the TUN, one fd per queue, with vnet headers when offloads are wanted (host/offload.py); its
   address in each family the lease has a subnet of (host/family.py Part), MTU and queue length,
   up, and the route of the overlay's network of each through it;
2. the UDP sockets, one per queue (host/udpsock.py), or ONE where the host refuses their
   steering: then the TUN queues beyond the sockets are closed, because the kernel spreads
   flannel0's packets over every attached queue and a queue that no engine reads would strand
   its share (:func:`open_sockets` says so, once); with an IPv6 underlay a second group beside
   it on the IPv6 address, one socket per queue kept;
3. the offloads the kernel accepts on those fds, probed once and said in one line;
4. engines, one per queue behind one MultiEngine (engine/multi.py), made on the fds when asked:
   the daemon makes new ones on the same fds when its lease moves or a handover fails;
5. with the kernel path, the tc programs in front of them (:func:`kernel_engine`:
   engine/kernel_engine.py), given flannel0's and the external interface's ifindexes, attached
   when the engine starts, the external interface's tunnel segmentation turned off first where
   it would pass super-packets on uncut (host/tunnel_gso.py).

A daemon handed the fds of the one before it (daemon/inherited.py) skips steps 1 and 2:
:meth:`Dataplane.adopt` takes them as they are, with the same one-queue rule, and probes. A step
that fails raises :class:`AssemblyError` naming it, once what the assembly opened is closed, so
that each caller says it in its own words (the daemon's advice to an operator, forward's line).
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket

from ..engine import multi
from . import netconf, sched
from .family import V4, V6
from .tun import TXQUEUELEN
from .udpsock import (SOCKET_BUFFER, one_queue_warning, open_queue_sockets, path_mtu_defaults,
                      path_mtu_options, steering_refusal)

log = logging.getLogger(__name__)

# What AssemblyError.step names: opening the TUN queues, giving flannel0 its address, MTU and
# route, opening the UDP sockets, probing the offloads.
STEPS = ("tun", "configure", "sockets", "offloads")


class AssemblyError(Exception):
    """A step of the assembly failed: ``step`` (one of STEPS), ``error`` what it raised (an
    OSError; for "configure" with the kernel's errno and what was asked: host/rtnl.py),
    ``tun_name`` the TUN once it exists."""

    def __init__(self, step: str, error: BaseException, tun_name: str | None = None):
        super().__init__(f"{step}: {error}")
        self.step, self.error, self.tun_name = step, error, tun_name


def open_sockets(ip: str, port: int, queues: int, *, bufsize: int = SOCKET_BUFFER) -> list:
    """Step 2 on ``ip:port``: one socket per queue, or one where the host refuses the steering
    (said here in one warning). Non-blocking: a full socket buffer drops and counts a datagram
    rather than stall the loop. SocketCallError names the call that failed."""
    socks, refused = open_queue_sockets(ip, port, queues, bufsize=bufsize, blocking=False)
    if refused is not None:
        log.warning("%s", one_queue_warning(refused, queues))
    return socks


def kernel_engine(slow, kpath, *, tun_name: str, ext_name: str, own_ip, port: int,
                  required: bool, owns_path: bool, segmentation=None, kernel_why: str = "",
                  own_ip6=None):
    """Step 5: ``slow`` (step 4's engine) behind ``kpath`` (engine/bpf_path.py KernelPath, loaded;
    None: the slow engine alone behind the same interface), for flannel0 ``tun_name`` and the
    external interface ``ext_name`` of this network namespace; ``segmentation`` (a
    host/tunnel_gso.py TunnelSegmentation of ``ext_name``, one per run: the daemon's engines
    share it) is cut just before the programs attach and said once in the log."""
    from ..engine.kernel_engine import KernelEngine
    from .tunnel_gso import TunnelSegmentation
    seg = segmentation if segmentation is not None else TunnelSegmentation(ext_name)

    def cut() -> None:
        before = list(seg.turned_off)
        note = seg.cut()
        if seg.turned_off != before:
            log.info("kernel path: %s (a peer reads a longer datagram truncated, and an "
                     "unfinished checksum as a wrong one); put back when the path is "
                     "removed", note)
    try:
        return KernelEngine(slow, kpath, tun_ifindex=socket.if_nametoindex(tun_name),
                            ext_ifindex=socket.if_nametoindex(ext_name), own_ip=own_ip,
                            port=port, required=required, owns_path=owns_path,
                            on_attach=cut, on_detach=seg.restore if owns_path else None,
                            kernel_why=kernel_why, own_ip6=own_ip6)
    except BaseException:
        slow.close()
        raise


def make_engine(cls, tun_fds, sockets, *, realtime_priority: int = 0, **settings):
    """Step 4: one ``cls`` engine per (TUN fd, socket) pair behind one MultiEngine, configured
    and not started; ``sockets`` maps each underlay's family (host/family.py) to its sockets,
    one per queue: the IPv4 ones always, the IPv6 ones with an IPv6 underlay; ``settings``
    are multi.create's (tun_addr, mtu, offloads, accept_any, icmp_rate, icmp_burst,
    coalesce_us, trace, batch); the IPv6 sockets get path_mtu_options, all or none, and the
    IPv4 ones the kernel's defaults (a daemon killed inside a probe may have handed them over
    switched). A ``realtime_priority`` is not probed here: the loop threads try it as they
    start (host/sched.py), callers probe it first."""
    try:
        for s in sockets.get(V4, ()):
            path_mtu_defaults(s)
    except OSError as e:
        log.warning("The IPv4 underlay's sockets cannot be put back to the kernel's path MTU "
                    "defaults (%s): the pods' IPv6 to IPv4 peers may be dropped, not fragmented, "
                    "where the path is narrow", e)
    try:
        for s in sockets.get(V6, ()):
            path_mtu_options(s)
    except OSError as e:
        for s in sockets.get(V6, ()):
            with contextlib.suppress(OSError):
                path_mtu_defaults(s)
        log.warning("The IPv6 underlay's sockets cannot refuse to fragment (%s): the kernel cuts "
                    "the pods' IPv6 into fragments where the path to a peer is narrower than "
                    "this host's interface", e)
    fds = {family.version: [s.fileno() for s in socks] for family, socks in sockets.items()
           if socks}
    return multi.create(cls, tun_fds, fds, thread_init=sched.thread_init(realtime_priority),
                        **settings)


class Dataplane:
    """flannel0's queues and the UDP sockets of one run, one pair per queue, and the offloads
    they took. It owns the fds (:meth:`close`; the last TUN fd closed removes the device) and
    makes engines on them (:meth:`engine`). ``Dataplane()`` is none yet: no fds."""

    def __init__(self, offloads=None, tun_fds=(), tun_name: str | None = None, sockets=None):
        self.offloads = offloads            # host/offload.py Offloads
        self.tun_fds: list = list(tun_fds)
        self.tun_name = tun_name
        # the underlay's family -> its sockets, one per queue: IPv4's, and IPv6's or none
        self.sockets: dict = {f: list(s) for f, s in (sockets or {}).items() if s}
        self.offload_flags = 0              # the OFF_* bits the probe left on

    @property
    def all_sockets(self) -> list:
        return [s for group in self.sockets.values() for s in group]

    @property
    def queues(self) -> int:
        return len(self.sockets.get(V4, ()))

    @classmethod
    def open(cls, offloads, *, tun_name: str, mtu: int, queues: int, parts,
             sockets) -> "Dataplane":
        """Steps 1-3: a TUN named after ``tun_name`` (a template such as flannel%d), ``mtu``,
        up, with for each of ``parts`` (host/family.py Part, IPv4 first) its address and the
        route of its network (none when the network is None); ``sockets`` maps an underlay's
        family to what opens its UDP sockets: ``sockets[V4](n)`` for n queues
        (:func:`open_sockets`, which the daemon wraps in its own messages) may return fewer,
        then ``sockets[V6](n)``, when there, opens the IPv6 underlay's, exactly n."""
        try:
            tun_fds, name = offloads.open_tun(tun_name, queues)
        except OSError as e:
            raise AssemblyError("tun", e) from None
        dp = cls(offloads, tun_fds, name)
        try:
            try:
                netconf.configure_tun(name, [p.tun_addr for p in parts], mtu,
                                      txqueuelen=TXQUEUELEN)
                for p in parts:
                    if p.network is not None:
                        netconf.add_network_route(p.network, name)
            except Exception as e:          # whatever failed, this step is the one to name
                raise AssemblyError("configure", e, name) from None
            try:
                for family, opener in sockets.items():
                    # the first group decides the queues, the others follow it
                    dp.sockets[family] = list(opener(dp.queues or queues))
            except OSError as e:
                raise AssemblyError("sockets", e, name) from None
            for fd in dp.tun_fds[dp.queues:]:
                os.close(fd)
            del dp.tun_fds[dp.queues:]
            dp._probe()
        except BaseException:
            dp.close()
            raise
        return dp

    @classmethod
    def adopt(cls, offloads, tun_fds, tun_name: str, sockets, queues: int) -> "Dataplane":
        """Step 3 on fds handed over, which the daemon found to be what it would open
        (daemon/inherited.py): the TUN has vnet headers exactly when offloads are wanted. Fewer
        sockets than ``queues`` are a daemon that ran one queue where the host refuses the
        steering, as it refuses ours: said as step 2 says it."""
        offloads.adopt_tun()
        dp = cls(offloads, tun_fds, tun_name, sockets)
        if dp.queues < queues:
            refused = steering_refusal()
            if refused is not None:
                log.warning("%s", one_queue_warning(refused, queues))
        try:
            dp._probe()
        except BaseException:
            dp.close()
            raise
        return dp

    def _probe(self) -> None:
        try:
            self.offload_flags = self.offloads.probe(self.tun_fds, self.all_sockets)
        except OSError as e:
            raise AssemblyError("offloads", e, self.tun_name) from None
        log.info("%s", self.offloads.summary())

    def engine(self, cls, **settings):
        """Step 4 on these fds, with the offloads they took: :func:`make_engine`."""
        return make_engine(cls, self.tun_fds, self.sockets, offloads=self.offload_flags,
                           **settings)

    def close(self) -> None:
        """The sockets, then the TUN queues; again, nothing."""
        socks, self.sockets = self.all_sockets, {}
        fds, self.tun_fds = self.tun_fds, []
        for s in socks:
            s.close()
        for fd in fds:
            os.close(fd)


__all__ = ["AssemblyError", "Dataplane", "STEPS", "kernel_engine", "make_engine", "open_sockets"]
