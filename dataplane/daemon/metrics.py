"""The Prometheus metrics of /metrics and the readiness of /readyz: what the daemon reports.

A custom collector over :class:`MetricsSource`: engine counters (packets, bytes, drops by reason,
ICMP sent, syscalls, batches), peers, lease expiry, the engine in use, etcd health (watches
connected, reconnects, resyncs; lease renewals, re-acquisitions, lost races). The daemon's own
source is :class:`DaemonSource`; daemon/http.py serves it.
"""
from __future__ import annotations

import logging
import threading
import time

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..engine.api import OFFLOAD_STATS, SYSCALL_STATS
from ..engine.contract import STAT_NAMES
from .timefmt import when

log = logging.getLogger(__name__)

PREFIX = "flannel_udp"


class MetricsSource:
    """What the collector reads; the daemon subclasses it. Every method must
    be cheap and thread-safe (called from the HTTP thread)."""

    def engine_stats(self) -> dict | None:
        return None

    def engine_info(self) -> dict:
        """Labels for flannel_udp_engine_info, e.g. {"engine": "c", "reason": "..."}."""
        return {}

    def peers_count(self) -> int:
        return 0

    def queues_count(self) -> int:
        """Forwarding queues (engines) running; 0 = none yet (no metric then)."""
        return 0

    def offloads_enabled(self) -> dict:
        """{offload name: on} (host/offload.py NAMES); empty = not decided yet."""
        return {}

    def bad_leases(self) -> tuple[int, int] | None:
        """(lease keys skipped now, distinct key/problem pairs skipped since start) or None."""
        return None

    def config_mismatch(self) -> bool | None:
        """Whether etcd's network config is not the one running (None: not known)."""
        return None

    def lease_info(self) -> dict | None:
        """{"subnet": "10.5.3.0/24", "expiry": epoch seconds or None} or None."""
        return None

    def lease_move_failures(self) -> int | None:
        """Failed attempts to move the host to a new lease since start (None: not known)."""
        return None

    def subnet_file(self) -> tuple[bool, int] | None:
        """(subnet.env does not name the lease now, failed writes since start) or None."""
        return None

    def trace_enabled(self) -> bool:
        return False

    def trace_events(self, after: int) -> list:
        return []

    def trace_remote(self) -> bool:
        """Whether /debug/trace is served to clients that are not on loopback (--trace-remote)."""
        return False

    def readiness(self) -> dict:
        """{check name: None when it passes, else a short reason}; empty = nothing to report,
        which /readyz takes as not ready."""
        return {}

    def etcd_watches(self) -> dict:
        """{watch name: {"connected": bool, "reconnects": n, "resyncs": n}}; counts since start."""
        return {}

    def lease_counts(self) -> dict | None:
        """{"renewals": n, "reacquisitions": n, "races_lost": n} since start, or None."""
        return None


class CarriedCounters:
    """Counters read off objects the daemon replaces while it runs (the own-lease watch after a
    re-acquisition, the lease manager after SIGHUP): when the object under a key changes, the
    last counts of the old one are carried over, so that exported totals never go down. Counts an
    object made after the last read before its replacement are not seen; replacements are rare."""

    def __init__(self):
        self._lock = threading.Lock()
        self._last: dict = {}
        self._base: dict = {}

    def read(self, key: str, obj, names) -> dict:
        with self._lock:
            base = self._base.setdefault(key, dict.fromkeys(names, 0))
            prev = self._last.get(key)
            if prev is not None and prev is not obj:
                for n in names:
                    base[n] += getattr(prev, n, 0)
            self._last[key] = obj
            return {n: base[n] + (getattr(obj, n, 0) if obj is not None else 0) for n in names}


# The ICMP error each icmp_<kind>_sent counter counts, as the label names it.
_ICMP_TYPES = {"unreach": "net_unreachable", "ttl": "time_exceeded"}
# Counters exported as a family of their own, without the engine_ prefix.
_OWN_FAMILIES = ("icmp_ratelimited",)


def _family_of(stat: str):
    """(family, label name, label value) of an engine counter, read off its name as the header
    spells them: <path>_packets / <path>_bytes, drop_<reason>, icmp_<kind>_sent, <direction>_batches,
    the syscall kinds and the offload ops (engine/api.py); None: exported alone, as
    flannel_udp_engine_<name>_total (syscalls, the total of the kinds: flannel_udp_syscalls_total)."""
    if stat.endswith(("_packets", "_bytes")):
        path, _, unit = stat.rpartition("_")
        return unit, "path", path
    if stat.startswith("drop_"):
        return "drops", "reason", stat[len("drop_"):]
    if stat.startswith("icmp_") and stat.endswith("_sent"):
        kind = stat[len("icmp_"):-len("_sent")]
        return "icmp_sent", "type", _ICMP_TYPES.get(kind, kind)
    if stat in _OWN_FAMILIES:
        return stat, None, None
    if stat.endswith("_batches"):
        return "batches", "direction", stat[:-len("_batches")]
    if stat in SYSCALL_STATS and stat != "syscalls":
        return "syscalls_by_kind", "kind", stat
    if stat in OFFLOAD_STATS:
        return "offload_ops", "op", stat
    return None


# stat name -> (family, label name, label value) for every counter of the engine contract: one
# added to csrc/dataplane.h is exported without a change here.
FAMILIES = {name: _family_of(name) for name in STAT_NAMES}


_HELP = {
    "packets": "Packets through the engine, by path (tun_rx: read from flannel0, udp_tx: sent "
               "to peers, udp_rx: received from peers, tun_tx: written to flannel0).",
    "bytes": "Bytes through the engine, by path (see flannel_udp_packets_total).",
    "drops": "Packets dropped by the engine, by reason.",
    "icmp_sent": "ICMP errors the engine generated (net unreachable for a subnet with no lease).",
    "icmp_ratelimited": "ICMP errors not sent because of the --icmp-rate/--icmp-burst limit.",
    "syscalls_by_kind": "Engine syscalls by kind.",
    "batches": "Batched syscalls (sendmmsg/recvmmsg or equivalent) by direction.",
    "offload_ops": "Offloaded operations, by op: tun_rx_gso (super-packets read from flannel0 "
                   "and segmented), udp_tx_gso (sends of a train of datagrams), udp_rx_gro "
                   "(receives holding a train), tun_tx_gso (coalesced writes into flannel0), "
                   "udp_gso_fallbacks (trains the kernel refused, sent again one by one).",
}


class DaemonCollector:
    """prometheus_client custom collector over a MetricsSource."""

    def __init__(self, source: MetricsSource):
        self.source = source

    def collect(self):
        stats = None
        try:
            stats = self.source.engine_stats()
        except Exception as e:  # a closed engine during shutdown: report what we can
            log.debug("engine stats unavailable: %s", e)
        fams = {}
        if stats:
            for name, value in stats.items():
                fam = FAMILIES.get(name)
                if fam is None:
                    if name == "syscalls":
                        f = CounterMetricFamily(f"{PREFIX}_syscalls",
                                                "Syscalls made by the engine, all kinds.")
                    else:
                        f = CounterMetricFamily(f"{PREFIX}_engine_{name}",
                                                f"Engine counter {name}.")
                    f.add_metric([], value)
                    fams[name] = f
                    continue
                fname, lname, lval = fam
                if fname not in fams:
                    fams[fname] = CounterMetricFamily(f"{PREFIX}_{fname}", _HELP[fname],
                                                      labels=[lname] if lname else [])
                fams[fname].add_metric([lval] if lname else [], value)
        yield from fams.values()

        g = GaugeMetricFamily(f"{PREFIX}_peers", "Peer leases in the route table.")
        g.add_metric([], self.source.peers_count())
        yield g

        n = self.source.queues_count()
        if n:
            g = GaugeMetricFamily(f"{PREFIX}_queues", "Forwarding queues: flannel0 queues, UDP "
                                  "sockets and engine threads (--queues).")
            g.add_metric([], n)
            yield g

        offloads = self.source.offloads_enabled()
        if offloads:
            g = GaugeMetricFamily(f"{PREFIX}_offload_enabled", "Kernel offloads switched on "
                                  "(1) or not (0): decided at start (--offload); udp_gso goes "
                                  "to 0 if the kernel later cannot segment (EIO).",
                                  labels=["offload"])
            for name, on in offloads.items():
                g.add_metric([name], 1 if on else 0)
            yield g

        bad = self.source.bad_leases()
        if bad is not None:
            g = GaugeMetricFamily(f"{PREFIX}_bad_leases", "Keys under the subnets prefix skipped "
                                  "now: malformed, or no usable lease (see the log).")
            g.add_metric([], bad[0])
            yield g
            c = CounterMetricFamily(f"{PREFIX}_bad_leases_seen", "Distinct (key, problem) pairs skipped "
                                    "under the subnets prefix since start.")
            c.add_metric([], bad[1])
            yield c
        mismatch = self.source.config_mismatch()
        if mismatch is not None:
            g = GaugeMetricFamily(f"{PREFIX}_config_mismatch", "1 while the network config in etcd "
                                  "is not the one this daemon runs (changed, invalid or deleted).")
            g.add_metric([], int(mismatch))
            yield g

        lease = self.source.lease_info()
        if lease and lease.get("expiry") is not None:
            g = GaugeMetricFamily(f"{PREFIX}_lease_expiry_timestamp_seconds",
                                  "When this host's subnet lease expires (Unix time).",
                                  labels=["subnet"])
            g.add_metric([str(lease.get("subnet", ""))], float(lease["expiry"]))
            yield g

        yield from _etcd_families(self.source.etcd_watches(), self.source.lease_counts())

        failures = self.source.lease_move_failures()
        if failures is not None:
            c = CounterMetricFamily(f"{PREFIX}_lease_move_failures", "Failed attempts to move "
                                    "this host to a new lease (flannel0's address and route, "
                                    "the engines); each is retried a second later.")
            c.add_metric([], failures)
            yield c

        sf = self.source.subnet_file()
        if sf is not None:
            g = GaugeMetricFamily(f"{PREFIX}_subnet_file_stale", "1 while subnet.env does not "
                                  "name this host's lease (a write failed; retried every "
                                  "second): workloads started meanwhile get a wrong subnet.")
            g.add_metric([], int(sf[0]))
            yield g
            c = CounterMetricFamily(f"{PREFIX}_subnet_file_write_failures", "Failed writes of "
                                    "subnet.env since start.")
            c.add_metric([], sf[1])
            yield c

        info = self.source.engine_info()
        if info:
            labels = sorted(info)
            g = GaugeMetricFamily(f"{PREFIX}_engine_info", "The forwarding engine in use.",
                                  labels=labels)
            g.add_metric([str(info[k]) for k in labels], 1)
            yield g


def _etcd_families(watches: dict, leases: dict | None):
    if watches:
        connected = GaugeMetricFamily(f"{PREFIX}_etcd_watch_connected", "1 while the etcd watch "
                                      "has a stream established, by watch.", labels=["watch"])
        reconnects = CounterMetricFamily(f"{PREFIX}_etcd_watch_reconnects", "etcd watch streams "
                                         "broken and resumed (etcd restarted, unreachable, "
                                         "failed over), by watch.", labels=["watch"])
        resyncs = CounterMetricFamily(f"{PREFIX}_etcd_watch_resyncs", "Full re-lists after the "
                                      "watched revision was compacted away, by watch.",
                                      labels=["watch"])
        for name, w in sorted(watches.items()):
            connected.add_metric([name], int(bool(w.get("connected"))))
            reconnects.add_metric([name], w.get("reconnects", 0))
            resyncs.add_metric([name], w.get("resyncs", 0))
        yield from (connected, reconnects, resyncs)
    if leases:
        for name, what in (("renewals", "Renewals of this host's subnet lease."),
                           ("reacquisitions", "Leases acquired again after ours was lost in etcd "
                                              "(deleted, expired, taken)."),
                           ("races_lost", "Lease creations another node won (a subnet picked "
                                          "again).")):
            c = CounterMetricFamily(f"{PREFIX}_lease_{name}", what)
            c.add_metric([], leases.get(name, 0))
            yield c


def make_registry(source: MetricsSource) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DaemonCollector(source))
    return reg


class DaemonSource(MetricsSource):
    """The running daemon as the collector and /debug/trace see it."""

    def __init__(self, daemon):
        self.daemon = daemon
        self._carried = CarriedCounters()     # etcd health counts across replaced watches

    def engine_stats(self):
        with self.daemon.lock:
            engine = self.daemon.engine
            return engine.stats() if engine is not None else None

    def engine_info(self):
        d = self.daemon
        if d.engine is None:
            return {}
        return {"engine": d.engine.name, "reason": d.engine_why, "accept_from": d.opts.accept_from}

    def peers_count(self):
        return len(self.daemon.peers)

    def queues_count(self):
        engine = self.daemon.engine
        return len(engine) if engine is not None else 0

    def offloads_enabled(self):
        d = self.daemon
        if d.offloads is None:
            return {}
        with d.lock:
            engine = d.engine
            try:
                in_use = engine.offloads_in_use() if engine is not None else None
            except OSError:                 # closed while shutting down: as decided
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

    def trace_enabled(self):
        return self.daemon.opts.trace and self.daemon.engine is not None

    def trace_events(self, after):
        with self.daemon.lock:
            engine = self.daemon.engine
            return engine.trace_events(after) if engine is not None else []

    def trace_remote(self):
        return self.daemon.opts.trace_remote

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
        ended = engine.ended() if engine is not None else {}
        if engine is None:
            checks["engine"] = "not started yet"
        elif any(why.tun_gone for why in ended.values()):
            checks["engine"] = f"{d.tun_name} was deleted"
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
                                  ("renewals", "reacquisitions", "races_lost"))

