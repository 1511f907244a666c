"""The daemon's state as its reports read it: /metrics, /readyz, /healthz, /debug/trace and the
status socket.

:class:`DaemonState` is the small object the daemon (daemon/main.py) keeps what it runs in: the
lease, the engine, flannel0 and the sockets, the peers by IP version, the watchers, what failed;
each fact has that one name. The daemon writes it (under ``lock`` for the engine, the lease and
the peers); the reports, and what a successor is handed (daemon/succession.py), only read it.
:class:`DaemonSource` is the state as daemon/metrics.py's collector, /readyz and the status socket
(daemon/status.py) ask it, one MetricsSource method per value; a new series is a row of
metrics.DECLARED plus the method here that reads its value off the state.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ..control.direct import DIRECT, ENCAPSULATED, DirectRouting
from ..control.peerset import PeerSnapshot
from ..host.assembly import Dataplane
from ..host.family import V4, V6
from .metrics import CarriedCounters, MetricsSource, engine_reason
from .timefmt import when


def no_peers() -> dict:
    """The peers by IP version before the first listing: none of either."""
    return {4: PeerSnapshot(), 6: PeerSnapshot()}


def _no_direct_routes() -> DirectRouting:
    """Until the config says otherwise (the daemon's watches start): every peer is encapsulated."""
    return DirectRouting(False, lambda _ip: False)


@dataclass(eq=False, slots=True)
class DaemonState:
    """What the daemon runs, for whoever reports on it. ``None`` is not there yet (the daemon is
    starting, or was stopped before that step)."""
    opts: object                        # daemon/options.py Options
    subnet_env: object                  # daemon/subnet_env.py SubnetEnv
    move_failures: object              # daemon/lease_move.py Failures
    blackhole: object                   # daemon/blackhole_route.py BlackholeRoute
    liveness: object = None             # daemon/liveness.py Liveness
    lock: object = field(default_factory=threading.RLock)   # guards engine, lease, peers
    ext: object = None                  # host/iface.py ExternalInterface
    config: object = None               # control/config.py Config, the one running
    lease: object = None                # the lease the host is on
    lease_manager: object = None        # control/lease_manager.py LeaseManager
    peer_watcher: object = None         # control/peers.py PeerWatcher (or its process)
    config_watcher: object = None       # control/configwatch.py ConfigWatcher
    # The engine's peers by IP version, replaced whole (never changed in place): those whose
    # IPv4 subnet it routes (4: the encapsulated ones), those whose IPv6 part it routes (6:
    # every peer, daemon/peer_routes.py says why)
    peers: dict = field(default_factory=no_peers)
    direct: DirectRouting = field(default_factory=_no_direct_routes)   # the kernel's (direct)
    engine: object = None               # engine/multi.py MultiEngine
    engine_cls: object = None           # its class (engine/choice.py)
    engine_why: str = ""                # why this engine (engine/choice.py's sentence)
    kernel: object = None               # daemon/kernel_path.py DaemonKernelPath, once chosen
    # flannel0 (its name, its queues) and the UDP sockets: none until made or taken over
    dataplane: Dataplane = field(default_factory=Dataplane)
    rules: object = None                # host/firewall_stack.py Stack, the iptables rules
    offloads: object = None             # host/offload.py Offloads
    forwarding: object = None           # daemon/host_forwarding.py HostForwarding
    underlay_fallback: object = None    # daemon/underlay_fallback.py, when it probes
    # "starting" until READY=1, "running", then "stopping" (the reports answer in every phase)
    phase: str = "starting"

    def current_lease(self):
        """The lease manager's newest lease (renewed, re-acquired), else the one the host is on."""
        sm = self.lease_manager
        lease = sm.lease if sm is not None else None
        return lease or self.lease


def _queue_stats(engine) -> list:
    """One read per queue, no sum: the MultiEngine the daemon runs keeps them apart."""
    per_queue = getattr(engine, "queue_stats", None)
    return per_queue() if per_queue is not None else [engine.stats()]


class RoutedParts:
    """How many peers' IPv6 parts the engines route, for /metrics and status: each lease decided
    once (a Lease is immutable), not at every answer. At 16,000 dual-stack peers deciding them
    all took ~85 ms (the rule's ipaddress checks), twice a /metrics answer; now a walk of the
    snapshot by identity, and nothing while it is the same snapshot."""

    def __init__(self):
        # (snapshot, rule, count, {id(lease): (lease, its part is routed)}), replaced whole:
        # /metrics and status may ask at once
        self._last: tuple = (None, None, 0, {})

    def count(self, snapshot, rule, why_not) -> int:
        last_snapshot, last_rule, count, known = self._last
        if snapshot is last_snapshot and rule == last_rule:
            return count
        if rule != last_rule:
            known = {}
        routed = {}
        for lease in list(snapshot.peers.values()):
            got = known.get(id(lease))
            if got is None or got[0] is not lease:      # the lease held keeps its id unique
                got = (lease, why_not(lease) is None)
            routed[id(lease)] = got
        count = sum(1 for _, yes in routed.values() if yes)
        self._last = (snapshot, rule, count, routed)
        return count


class DaemonSource(MetricsSource):
    """The running daemon as the collector, /readyz, /debug/trace and the status read it."""

    def __init__(self, state):
        # named so for the readers' sake (``self.daemon.engine``): the daemon's DaemonState
        self.daemon = state
        self._carried = CarriedCounters()     # etcd health counts across replaced watches
        self._ipv6_parts = RoutedParts()

    def engine_stats(self):
        return self._engine_read(lambda engine: engine.stats())

    def engine_queue_stats(self):
        return self._engine_read(_queue_stats)

    def _engine_read(self, read):
        """``read(engine)``, not under state.lock: the peers' publisher holds it while it hands
        the engine a new table (and the kernel path writes its maps), up to tens of ms in a
        burst of leases, and /metrics and status would wait behind it. An engine guards its own
        close (a closed one raises); only then is the engine that replaced it read, under the
        lock."""
        engine = self.daemon.engine
        if engine is None:
            return None
        try:
            return read(engine)
        except Exception:
            with self.daemon.lock:
                engine = self.daemon.engine
                return read(engine) if engine is not None else None

    def kernel_counters(self):
        kernel = self.daemon.kernel
        return kernel.counters() if kernel is not None else None

    def datapath(self):
        d = self.daemon
        if d.engine is None:
            return None
        return "kernel" if d.kernel is not None and d.kernel.in_kernel else "engine"

    def engine_info(self):
        d = self.daemon
        if d.engine is None:
            return {}
        return {"engine": d.engine.name, "reason": engine_reason(d.engine_why),
                "accept_from": d.opts.accept_from}

    def peers_count(self):
        d = self.daemon
        return len(d.peers[4]) + (len(d.direct.direct[V4]) if d.direct is not None else 0)

    def peers_by_mode(self):
        d = self.daemon
        if d.direct is None or not d.direct.enabled:
            return {}
        return {DIRECT: len(d.direct.direct[V4]), ENCAPSULATED: len(d.peers[4])}

    def peers_ipv6(self):
        d = self.daemon
        if d.config is None or d.config.ipv6_network is None or d.direct is None:
            return None
        # the rule the engines' IPv6 table is made by (control/routes.py Ipv6Parts): it depends
        # on the lease alone, given the IPv6Network and our own part
        own = d.current_lease()
        rule = (d.direct, d.config.ipv6_network, getattr(own, "ipv6_subnet", None))
        return self._ipv6_parts.count(d.peers[6], rule, d.direct.ipv6_part)

    def peers_ipv6_by_mode(self):
        d = self.daemon
        parts = self.peers_ipv6()
        if parts is None or not d.direct.enabled:
            return {}
        # the engines route every part, those that go direct too (daemon/peer_routes.py)
        direct = len(d.direct.direct[V6])
        return {DIRECT: direct, ENCAPSULATED: max(0, parts - direct)}

    def ipv6_underlay_fallback(self):
        probes = self.daemon.underlay_fallback
        return probes.report() if probes is not None else None

    def queues_count(self):
        engine = self.daemon.engine
        return len(engine) if engine is not None else 0

    def offloads_enabled(self):
        d = self.daemon
        if d.offloads is None:
            return {}
        try:                                # not under state.lock either (_engine_read)
            in_use = self._engine_read(lambda engine: engine.offloads_in_use())
        except OSError:                     # closed while shutting down: as decided
            in_use = None
        return d.offloads.enabled(in_use)

    def bad_leases(self):
        w = self.daemon.peer_watcher
        return (len(w.bad()), w.bad_total) if w is not None else None

    def config_mismatch(self):
        w = self.daemon.config_watcher
        return w.mismatch if w is not None else None

    def lease_info(self):
        lease = self.daemon.current_lease()
        if lease is None:
            return None
        return {"subnet": str(lease.subnet), "expiry": lease.expiration}

    def lease_move_failures(self):
        return self.daemon.move_failures.total

    def subnet_file(self):
        env = self.daemon.subnet_env
        return env.stale() is not None, env.failures.total

    def host_forwarding(self):
        f = self.daemon.forwarding
        return f.status() if f is not None else {}

    def trace_enabled(self):
        return self.daemon.opts.trace and self.daemon.engine is not None

    def trace_events(self, after):
        with self.daemon.lock:
            engine = self.daemon.engine
            return engine.trace_events(after) if engine is not None else []

    def trace_remote(self):
        return self.daemon.opts.trace_remote

    def stalls(self):
        return self.daemon.liveness.stalls()

    def readiness(self):
        """/readyz: a lease that has not expired, a forwarding engine with its flannel0, and the
        peer watch connected to etcd (else routes go stale unnoticed)."""
        d = self.daemon
        lease, engine = d.current_lease(), d.engine
        w = d.peer_watcher
        watch = w.watch_loop if w is not None else None
        checks = {"lease": None, "engine": None, "etcd_watch": None,
                  "subnet_file": d.subnet_env.stale()}
        if lease is None:
            checks["lease"] = "no lease acquired yet"
        elif lease.expiration and lease.expiration <= time.time():
            checks["lease"] = f"lease {lease.subnet} expired at {when(lease.expiration)}"
        try:
            ended = engine.ended() if engine is not None else {}
        except RuntimeError:
            # the main thread is starting its loop: the thread is made and not started yet,
            # which threading cannot join(0), not even to ask (engine/api.py Engine.join)
            ended = None
        if engine is None:
            checks["engine"] = "not started yet"
        elif ended is None:
            checks["engine"] = "starting"
        elif any(why.tun_gone for why in ended.values()):
            checks["engine"] = f"{d.dataplane.tun_name} was deleted"
        elif (ended and d.phase == "starting"
              and all(why.why == "stopped" for why in ended.values())):
            # made, its routes going in (daemon/main.py step 9), its loops not started yet
            checks["engine"] = "starting"
        elif ended:
            checks["engine"] = f"queue(s) {', '.join(map(str, ended))} stopped"
        if watch is None:
            checks["etcd_watch"] = "peer leases not listed yet"
        elif not watch.connected.is_set():
            checks["etcd_watch"] = (f"not connected to etcd, reconnecting ({watch.reconnects} "
                                    "reconnect(s) so far)")
        return checks

    def etcd_watches(self):
        d = self.daemon
        out = {}
        for name, owner in (("subnets", d.peer_watcher), ("config", d.config_watcher),
                            ("own_lease", d.lease_manager)):
            watch = owner.watch_loop if owner is not None else None
            counts = self._carried.read(f"watch {name}", watch, ("reconnects", "resyncs"))
            if watch is not None or any(counts.values()):
                out[name] = {"connected": watch is not None and watch.connected.is_set(), **counts}
        return out

    def lease_counts(self):
        if self.daemon.lease_manager is None:
            return None
        return self._carried.read("lease", self.daemon.lease_manager,
                                  ("renewals", "renew_failures", "reacquisitions", "races_lost"))


__all__ = ["DaemonSource", "DaemonState", "no_peers"]
