"""The Prometheus metrics of /metrics and the readiness of /readyz: what the daemon reports.

A custom collector over :class:`MetricsSource`: the build, engine counters per queue (packets,
bytes, drops by reason, ICMP sent, syscalls by kind, batches), peers, lease expiry, the engine in
use, etcd health (watches connected, reconnects, resyncs; lease renewals, re-acquisitions, lost
races), next to prometheus_client's process_* and python_* families. Every family is a row of
DECLARED (name, type, labels, help, and which value of the source its samples are), which
docs/metrics.md documents, and the collector serves the rows: a new series is a row here and the
method that says its value, on MetricsSource (nothing to report) and on the daemon's own source
(daemon/state.py DaemonSource, which reads the daemon's DaemonState). daemon/http.py serves it.

(Over 450 lines as one piece: DECLARED, the source it reads and the collector that serves it
are one table and its reader, which docs/metrics.md follows row by row.)
"""
from __future__ import annotations

import logging
import threading
from operator import itemgetter
from typing import Callable, NamedTuple

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .. import __version__
from . import answer_clock, metrics_kernel
from ..engine.contract import V6_SHARES
from .cached_collector import CachedCollector
from .carried_counters import CarriedCounters  # noqa: F401 (daemon/state.py's, kept importable here)
from .metrics_text import KeptFamilies

log = logging.getLogger(__name__)

PREFIX = "flannel_udp"


class MetricsSource:
    """What the collector reads; the daemon's is daemon/state.py DaemonSource. Every method must
    be cheap and thread-safe (called from the HTTP thread)."""

    def engine_stats(self) -> dict | None:
        return None

    def engine_queue_stats(self) -> list | None:
        """The engine counters of each queue, queue 0 first (the queue label); by default
        engine_stats() as queue 0's."""
        stats = self.engine_stats()
        return [stats] if stats else None

    def kernel_counters(self) -> dict | None:
        """The kernel path's programs' counters while they forward (daemon/metrics_kernel.py)."""
        return None

    def answer_times(self) -> list:
        """flannel_udp_answer_seconds: the process's answers (daemon/answer_clock.py)."""
        return answer_clock.CLOCK.samples()

    def datapath(self) -> str | None:
        """kernel while the kernel path's programs forward, else engine; None: no engine yet."""
        return None

    def engine_info(self) -> dict:
        """Labels for flannel_udp_engine_info: {"engine": "c", "reason": "auto",
        "accept_from": "leases"} (reason: engine_reason's words, never free text)."""
        return {}

    def peers_count(self) -> int:
        return 0

    def peers_by_mode(self) -> dict:
        """{"direct": n, "encapsulated": m} when DirectRouting is on, else empty (no series)."""
        return {}

    def peers_ipv6(self) -> int | None:
        """Peers whose IPv6 part the engines route; None while IPv6 is off (no series)."""
        return None

    def peers_ipv6_by_mode(self) -> dict:
        """peers_by_mode for those IPv6 parts: {"direct": n, "encapsulated": m} when IPv6 and
        DirectRouting are on, else empty."""
        return {}

    def ipv6_underlay_fallback(self) -> dict | None:
        """With --ipv6-underlay-fallback probing: {"on_ipv4": [peers whose IPv6 part goes over
        IPv4 because their IPv6 underlay failed], "fallbacks": n, "probes_sent": n,
        "probes_answered": n, ...} (daemon/underlay_fallback.py report); else None."""
        return None

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

    def host_forwarding(self) -> dict:
        """{"ipv4": on, "ipv6": on}: the host's forwarding sysctls of the families the daemon
        forwards; empty = not checked yet."""
        return {}

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

    def stalls(self) -> list:
        """/healthz: the daemon's loops that make no progress (daemon/liveness.py's Stall, its
        str() a line naming the loop and for how long); empty while every one does."""
        return []

    def etcd_watches(self) -> dict:
        """{watch name: {"connected": bool, "reconnects": n, "resyncs": n}}; counts since start."""
        return {}

    def lease_counts(self) -> dict | None:
        """{"renewals": n, "renew_failures": n, "reacquisitions": n, "races_lost": n} since
        start, or None."""
        return None


class Family(NamedTuple):
    """One metric family as /metrics serves it: the sample name (counters end in _total), the
    type, the label names in the order they are written, the HELP text, and where its samples
    come from: ``read(ask)`` -> [(label values, value)], none while there is nothing to report,
    where ``ask(name)`` is what the source's method ``name`` says in this scrape. No ``read``:
    the engine's counters, which ENGINE_COUNTERS places (or, in STANDARD, prometheus_client's)."""
    name: str
    type: str
    labels: tuple
    help: str
    read: Callable | None = None


def _value(method: str, pick=lambda x: x, present=lambda x: x is not None):
    """One sample without labels, ``pick`` of what ``method`` says, while ``present`` holds."""
    def read(ask):
        x = ask(method)
        return [((), pick(x))] if present(x) else []
    return read


def _by_label(method: str, pick=lambda x: x, sort: bool = False):
    """A sample per item of the {label value: x} that ``method`` says, ``pick`` of x."""
    def read(ask):
        items = ask(method).items()
        return [((k,), pick(x)) for k, x in (sorted(items) if sort else items)]
    return read


def _lease_count(name: str):
    return _value("lease_counts", lambda counts: counts.get(name, 0), present=bool)


def _build_info(_ask):
    return [((__version__, _built_engine()), 1)]


def _engine_info(ask):
    info = ask("engine_info")
    labels = _DECLARED[f"{PREFIX}_engine_info"].labels
    return [(tuple(str(info.get(k, "")) for k in labels), 1)] if info else []


def _lease_expiry(ask):
    lease = ask("lease_info")
    if not lease or lease.get("expiry") is None:
        return []
    return [((str(lease.get("subnet", "")),), float(lease["expiry"]))]


_Q = ("queue",)     # every engine counter is per queue: "0" .. "N-1" (docs/metrics.md#queues)
# The inner packet's family, on the series of packets, bytes, drops and ICMP errors sent
# (docs/metrics.md#families): ipv4, ipv6, or other (FIXED_FAMILY).
_F = ("family",)
# Who counted it: engine, or kernel (the kernel path's programs: daemon/metrics_kernel.py)
_D = ("datapath",)

# Every family the daemon's collector serves: docs/metrics.md documents exactly these (a unit test
# holds the two equal), and nothing outside this table is ever served.
DECLARED = (
    # the build and the engine
    Family(f"{PREFIX}_build_info", "gauge", ("version", "engine"),
           "Always 1: the package version and the fastest engine this installation has (c when "
           "the C engine is built, else python).",
           _build_info),
    Family(f"{PREFIX}_engine_info", "gauge", ("engine", "reason", "accept_from"),
           "Always 1: the forwarding engine in use, why it was chosen (forced, auto, "
           "c_unavailable; the log has the sentence) and --accept-from.",
           _engine_info),
    Family(f"{PREFIX}_queues", "gauge", (),
           "Forwarding queues: flannel0 queues, UDP sockets and engine threads (--queues).",
           _value("queues_count", present=bool)),
    Family(f"{PREFIX}_offload_enabled", "gauge", ("offload",),
           "Kernel offloads switched on (1) or not (0): decided at start (--offload); udp_gso "
           "goes to 0 if the kernel later cannot segment (EIO).",
           _by_label("offloads_enabled", lambda on: 1 if on else 0)),
    # the engine's counters (ENGINE_COUNTERS below), per queue
    Family(f"{PREFIX}_packets_total", "counter", ("path",) + _F + _Q + _D,
           "Packets through the engine, by path (tun_rx: read from flannel0, udp_tx: sent to "
           "peers, udp_rx: received from peers, tun_tx: written to flannel0) and the inner "
           "packet's family (ipv4, ipv6); datapath kernel: the kernel path's programs' (queue "
           "none, family all)."),
    Family(f"{PREFIX}_bytes_total", "counter", ("path",) + _F + _Q + _D,
           "Bytes through the engine, by path and family (see flannel_udp_packets_total)."),
    Family(f"{PREFIX}_drops_total", "counter", ("reason",) + _F + _Q + _D,
           "Packets dropped by the engine, by reason and the packet's family (ipv4, ipv6; "
           "other: not_ipv4 and truncated, whose family is neither or not looked at); "
           "datapath kernel: by the kernel path's programs."),
    Family(f"{PREFIX}_kernel_passed_total", "counter", ("direction", "reason"),
           "Packets the kernel path's programs handed on to the engine (the slow path), by "
           "direction (tx: from flannel0, rx: from peers) and reason.", metrics_kernel.passed),
    Family(f"{PREFIX}_datapath_info", "gauge", _D,
           "Always 1: what forwards, kernel (the kernel path's programs, the engine behind "
           "them) or engine (the engine alone).",
           lambda ask: [((d,), 1) for d in [ask("datapath")] if d]),
    Family(f"{PREFIX}_icmp_sent_total", "counter", ("type",) + _F + _Q,
           "ICMP errors the engine generated, by type and family (net_unreachable: a subnet with "
           "no lease; time_exceeded: TTL ran out; packet_too_big: an IPv6 route's MTU or its "
           "path's)."),
    Family(f"{PREFIX}_icmp_ratelimited_total", "counter", _Q,
           "ICMP errors not sent because of the --icmp-rate/--icmp-burst limit."),
    Family(f"{PREFIX}_syscalls_total", "counter", ("kind",) + _Q,
           "Syscalls the engine loop made, by kind (wake_reads: reads of its wake-up eventfd, "
           "on a new route table or a stop)."),
    Family(f"{PREFIX}_batches_total", "counter", ("direction",) + _Q,
           "Non-empty batches (sendmmsg/recvmmsg or equivalent) by direction: tx = flannel0 to "
           "UDP, rx = UDP to flannel0."),
    Family(f"{PREFIX}_route_swaps_total", "counter", _Q,
           "Route tables taken into use by the engine loop (one per queue and route change)."),
    Family(f"{PREFIX}_fragmented_sends_total", "counter", _Q,
           "Pods' IPv6 packets of at most 1280 bytes sent as outer fragments: the underlay's "
           "path to the peer is too narrow for them whole."),
    Family(f"{PREFIX}_offload_ops_total", "counter", ("op",) + _Q,
           "Offloaded operations, by op: tun_rx_gso (super-packets read from flannel0 and "
           "segmented), udp_tx_gso (sends of a train of datagrams), udp_rx_gro (receives holding "
           "a train), tun_tx_gso (coalesced writes into flannel0), udp_gso_fallbacks (trains the "
           "kernel refused, sent again one by one)."),
    # leases and peers
    Family(f"{PREFIX}_peers", "gauge", (), "Peer leases in the route table.",
           _value("peers_count")),
    Family(f"{PREFIX}_peers_by_mode", "gauge", ("mode",),
           "With DirectRouting on: peers by the way their packets go (direct: a plain kernel "
           "route via their PublicIP; encapsulated: through flannel0 and the engine).",
           _by_label("peers_by_mode", sort=True)),
    Family(f"{PREFIX}_peers_ipv6", "gauge", (),
           "With EnableIPv6: peer leases whose IPv6 part the engines route (ForwardsIPv6, inside "
           "IPv6Network).",
           _value("peers_ipv6")),
    Family(f"{PREFIX}_peers_ipv6_by_mode", "gauge", ("mode",),
           "With EnableIPv6 and DirectRouting on: those IPv6 parts by the way their packets go "
           "(direct: a plain kernel route via the peer's PublicIPv6; encapsulated: through "
           "flannel0 and the engine).",
           _by_label("peers_ipv6_by_mode", sort=True)),
    Family(f"{PREFIX}_peers_ipv6_underlay_fallback", "gauge", (),
           "With --ipv6-underlay-fallback probing: peers whose IPv6 part goes over the IPv4 "
           "underlay because their IPv6 underlay answers no probe.",
           _value("ipv6_underlay_fallback", lambda r: len(r["on_ipv4"]))),
    Family(f"{PREFIX}_ipv6_underlay_fallbacks_total", "counter", (),
           "Times a peer's IPv6 part went over to the IPv4 underlay because its IPv6 underlay "
           "answered no probe.",
           _value("ipv6_underlay_fallback", itemgetter("fallbacks"))),
    Family(f"{PREFIX}_ipv6_underlay_probes_total", "counter", ("result",),
           "Probes of the peers' IPv6 underlay: sent, and answered.",
           lambda ask: [((k,), r[f"probes_{k}"]) for r in [ask("ipv6_underlay_fallback")] if r
                        for k in ("sent", "answered")]),
    Family(f"{PREFIX}_lease_expiry_timestamp_seconds", "gauge", ("subnet",),
           "When this host's subnet lease expires (Unix time).",
           _lease_expiry),
    Family(f"{PREFIX}_lease_renewals_total", "counter", (),
           "Renewals of this host's subnet lease.",
           _lease_count("renewals")),
    Family(f"{PREFIX}_lease_renew_failures_total", "counter", (),
           "Renewals etcd did not take (each retried at the renewal retry interval).",
           _lease_count("renew_failures")),
    Family(f"{PREFIX}_lease_reacquisitions_total", "counter", (),
           "Leases acquired again after ours was lost in etcd (deleted, expired, taken).",
           _lease_count("reacquisitions")),
    Family(f"{PREFIX}_lease_races_lost_total", "counter", (),
           "Lease creations another node won (a subnet picked again).",
           _lease_count("races_lost")),
    Family(f"{PREFIX}_lease_move_failures_total", "counter", (),
           "Failed attempts to move this host to a new lease (flannel0's address and route, the "
           "engines); each is retried a second later.",
           _value("lease_move_failures")),
    Family(f"{PREFIX}_bad_leases", "gauge", (),
           "Keys under the subnets prefix skipped now: malformed, no usable lease, or in "
           "conflict with an older key (see the log).",
           _value("bad_leases", itemgetter(0))),
    Family(f"{PREFIX}_bad_leases_seen_total", "counter", (),
           "Distinct (key, problem) pairs skipped under the subnets prefix since start.",
           _value("bad_leases", itemgetter(1))),
    Family(f"{PREFIX}_config_mismatch", "gauge", (),
           "1 while the network config in etcd is not the one this daemon runs (changed, invalid "
           "or deleted).",
           _value("config_mismatch", int)),
    Family(f"{PREFIX}_subnet_file_stale", "gauge", (),
           "1 while subnet.env does not name this host's lease (a write failed; retried every "
           "second): workloads started meanwhile get a wrong subnet.",
           _value("subnet_file", lambda sf: int(sf[0]))),
    Family(f"{PREFIX}_subnet_file_write_failures_total", "counter", (),
           "Failed writes of subnet.env since start.",
           _value("subnet_file", itemgetter(1))),
    Family(f"{PREFIX}_host_forwarding", "gauge", ("family",),
           "1 while the host forwards the family's packets (net.ipv4.ip_forward; with "
           "EnableIPv6 net.ipv6.conf.all.forwarding), 0 while it does not: the pods' packets of "
           "that family then stop at this host.",
           _by_label("host_forwarding", lambda on: 1 if on else 0, sort=True)),
    # etcd
    Family(f"{PREFIX}_etcd_watch_connected", "gauge", ("watch",),
           "1 while the etcd watch has a stream established, by watch (subnets, config, "
           "own_lease).",
           _by_label("etcd_watches", lambda w: int(bool(w.get("connected"))), sort=True)),
    Family(f"{PREFIX}_etcd_watch_reconnects_total", "counter", ("watch",),
           "etcd watch streams broken and resumed (etcd restarted, unreachable, failed over), by "
           "watch.",
           _by_label("etcd_watches", lambda w: w.get("reconnects", 0), sort=True)),
    Family(f"{PREFIX}_etcd_watch_resyncs_total", "counter", ("watch",),
           "Full re-lists after the watched revision was compacted away, by watch.",
           _by_label("etcd_watches", lambda w: w.get("resyncs", 0), sort=True)),
    Family(f"{PREFIX}_answer_seconds", "histogram", ("endpoint",),
           "Seconds from a question's arrival (HTTP: the kernel's receipt of the request; status: "
           "the accept) to its reply's last byte handed to the kernel, by endpoint (metrics, "
           "healthz, readyz, trace, other, status).",
           lambda ask: ask("answer_times")),
)

# The families prometheus_client's ProcessCollector, PlatformCollector and GCCollector serve
# (their own names and HELP), in the same registry: declared here too, so that the unit test and
# docs/metrics.md account for every family a scrape returns.
STANDARD = (
    Family("process_virtual_memory_bytes", "gauge", (), "Virtual memory size in bytes."),
    Family("process_resident_memory_bytes", "gauge", (), "Resident memory size in bytes."),
    Family("process_start_time_seconds", "gauge", (),
           "Start time of the process since unix epoch in seconds."),
    Family("process_cpu_seconds_total", "counter", (),
           "Total user and system CPU time spent in seconds."),
    Family("process_open_fds", "gauge", (), "Number of open file descriptors."),
    Family("process_max_fds", "gauge", (), "Maximum number of open file descriptors."),
    Family("python_info", "gauge", ("implementation", "major", "minor", "patchlevel", "version"),
           "Python platform information"),
    Family("python_gc_objects_collected_total", "counter", ("generation",),
           "Objects collected during gc"),
    Family("python_gc_objects_uncollectable_total", "counter", ("generation",),
           "Uncollectable objects found during GC"),
    Family("python_gc_collections_total", "counter", ("generation",),
           "Number of times this generation was collected"),
)

_DECLARED = {f.name: f for f in DECLARED}

# Every counter of the engine contract (dp_stats, csrc/dataplane.h) but the IPv6 shares (served
# with their totals: FAMILY_LABELLED) -> (family, the value of the family's label other than
# queue and family, or None). Listed, not derived from the counter's name: a counter added to the
# header without a line here is not served, and tests/unit/test_metrics_names.py fails until it
# has one (and docs/metrics.md says what it is).
ENGINE_COUNTERS = {
    "tun_rx_packets": (f"{PREFIX}_packets_total", "tun_rx"),
    "tun_rx_bytes": (f"{PREFIX}_bytes_total", "tun_rx"),
    "udp_tx_packets": (f"{PREFIX}_packets_total", "udp_tx"),
    "udp_tx_bytes": (f"{PREFIX}_bytes_total", "udp_tx"),
    "udp_rx_packets": (f"{PREFIX}_packets_total", "udp_rx"),
    "udp_rx_bytes": (f"{PREFIX}_bytes_total", "udp_rx"),
    "tun_tx_packets": (f"{PREFIX}_packets_total", "tun_tx"),
    "tun_tx_bytes": (f"{PREFIX}_bytes_total", "tun_tx"),
    "icmp_unreach_sent": (f"{PREFIX}_icmp_sent_total", "net_unreachable"),
    "icmp_ttl_sent": (f"{PREFIX}_icmp_sent_total", "time_exceeded"),
    "drop_no_route": (f"{PREFIX}_drops_total", "no_route"),
    "drop_ttl": (f"{PREFIX}_drops_total", "ttl"),
    "drop_malformed": (f"{PREFIX}_drops_total", "malformed"),
    "drop_not_ipv4": (f"{PREFIX}_drops_total", "not_ipv4"),
    "drop_truncated": (f"{PREFIX}_drops_total", "truncated"),
    "drop_bad_source": (f"{PREFIX}_drops_total", "bad_source"),
    "drop_send_error": (f"{PREFIX}_drops_total", "send_error"),
    "drop_tun_full": (f"{PREFIX}_drops_total", "tun_full"),
    "drop_tun_error": (f"{PREFIX}_drops_total", "tun_error"),
    "drop_inner_local": (f"{PREFIX}_drops_total", "inner_local"),
    "drop_inner_foreign": (f"{PREFIX}_drops_total", "inner_foreign"),
    "drop_scope": (f"{PREFIX}_drops_total", "scope"),
    "drop_too_big": (f"{PREFIX}_drops_total", "too_big"),
    "icmp_too_big_sent": (f"{PREFIX}_icmp_sent_total", "packet_too_big"),
    # `syscalls` counts every syscall, the kinds below each one kind: what it has beyond their
    # sum are the wake-up eventfd's reads, which have no counter of their own (SYSCALL_REST).
    "syscalls": (f"{PREFIX}_syscalls_total", "wake_reads"),
    "tun_reads": (f"{PREFIX}_syscalls_total", "tun_reads"),
    "tun_writes": (f"{PREFIX}_syscalls_total", "tun_writes"),
    "udp_sends": (f"{PREFIX}_syscalls_total", "udp_sends"),
    "udp_recvs": (f"{PREFIX}_syscalls_total", "udp_recvs"),
    "polls": (f"{PREFIX}_syscalls_total", "polls"),
    "coalesce_waits": (f"{PREFIX}_syscalls_total", "coalesce_waits"),
    "tx_batches": (f"{PREFIX}_batches_total", "tx"),
    "rx_batches": (f"{PREFIX}_batches_total", "rx"),
    "route_swaps": (f"{PREFIX}_route_swaps_total", None),
    "icmp_ratelimited": (f"{PREFIX}_icmp_ratelimited_total", None),
    "tun_rx_gso": (f"{PREFIX}_offload_ops_total", "tun_rx_gso"),
    "udp_tx_gso": (f"{PREFIX}_offload_ops_total", "udp_tx_gso"),
    "udp_rx_gro": (f"{PREFIX}_offload_ops_total", "udp_rx_gro"),
    "tun_tx_gso": (f"{PREFIX}_offload_ops_total", "tun_tx_gso"),
    "udp_gso_fallbacks": (f"{PREFIX}_offload_ops_total", "udp_gso_fallbacks"),
    "udp_tx_fragmented": (f"{PREFIX}_fragmented_sends_total", None),
}
# The families whose engine counters carry the family label. A counter in one of them with an IPv6
# share (engine/contract.py V6_SHARES, dp_stats' v6_<counter>) is two samples, ipv6 = the share
# and ipv4 = the counter - the share (the counter being the total); one without a share is one
# sample of the family FIXED_FAMILY says (tests/unit/test_metrics_names.py: every one says one).
FAMILY_LABELLED = frozenset({f"{PREFIX}_packets_total", f"{PREFIX}_bytes_total",
                             f"{PREFIX}_drops_total", f"{PREFIX}_icmp_sent_total"})
FIXED_FAMILY = {"drop_scope": "ipv6", "drop_too_big": "ipv6", "icmp_too_big_sent": "ipv6",
                "drop_not_ipv4": "other", "drop_truncated": "other"}
SYSCALL_REST = "syscalls"
# The syscall kinds SYSCALL_REST is the total of (tx/rx_batches count batches, not syscalls).
_SYSCALL_KINDS = tuple(n for n, (fam, _) in ENGINE_COUNTERS.items()
                       if fam == f"{PREFIX}_syscalls_total" and n != SYSCALL_REST)
_SHARE_NAMES = frozenset(V6_SHARES.values())

# flannel_udp_engine_info's reason: choose_engine's sentence (engine/choice.py) goes to the log;
# the label keeps which of its cases it was, by the words each case starts with.
ENGINE_REASONS = (("requested with", "forced"), ("auto: the C engine is built", "auto"),
                  ("auto: the C engine is not built", "c_unavailable"))


def engine_reason(why: str) -> str:
    """The label value for choose_engine's sentence: forced, auto, c_unavailable (other: none)."""
    for start, reason in ENGINE_REASONS:
        if why.startswith(start):
            return reason
    return "other"


def _new(name: str):
    """An empty family as DECLARED has it."""
    f = _DECLARED[name]
    cls = CounterMetricFamily if f.type == "counter" else GaugeMetricFamily
    return cls(name, f.help, labels=list(f.labels))


_build_engine: str | None = None


def _built_engine() -> str:
    """c when the C engine is built, else python: asked once (a failed import is tried again on
    every call, and a scrape must stay cheap)."""
    global _build_engine
    if _build_engine is None:
        from ..engine.choice import c_available
        _build_engine = "c" if c_available() else "python"
    return _build_engine


class _Asked:
    """One scrape's view of a source: each method is called once, so that families that share a
    value (the lease counts, the etcd watches, subnet.env's) serve one reading of it."""

    def __init__(self, source: MetricsSource):
        self._source = source
        self._said: dict = {}

    def __call__(self, method: str):
        if method not in self._said:
            self._said[method] = getattr(self._source, method)()
        return self._said[method]


class DaemonCollector:
    """prometheus_client custom collector over a MetricsSource: the families of DECLARED, each
    with the samples its ``read`` gives (the engine's: ENGINE_COUNTERS), those with some."""

    def __init__(self, source: MetricsSource):
        self.source = source
        self._unknown_logged: set = set()
        # The values derived as a difference (SYSCALL_REST's remainder, IPv4's share), by queue
        # and counter: (the total when read, value served). The counters are read while the loop
        # runs, so a part may be counted in a read that misses its total (or the other way
        # round); what is served never goes down but when the total does (a new engine).
        self._rest: dict = {}
        self._rest_lock = threading.Lock()
        self._kept = KeptFamilies(_new)     # each family made again only when its samples change

    def collect(self):
        ask = _Asked(self.source)
        per_queue = None
        try:
            per_queue = self.source.engine_queue_stats()
        except Exception as e:  # a closed engine during shutdown: report what we can
            log.debug("engine stats unavailable: %s", e)
        engine = dict(self._kept.engine(per_queue, self._engine_families) if per_queue else {})
        try:
            for name, samples in metrics_kernel.samples(ask("kernel_counters")).items():
                engine[name] = engine.get(name, []) + samples
        except Exception as e:  # the programs closed during shutdown
            log.debug("kernel path counters unavailable: %s", e)
        for f in DECLARED:
            samples = engine.get(f.name, ()) if f.read is None else f.read(ask)
            if samples and f.type == "histogram":
                yield answer_clock.family(f.name, f.help, f.labels, samples)
            elif samples:
                yield self._kept.family(f.name, samples)

    def _engine_families(self, per_queue) -> dict:
        """{family name: [(label values, value)]} of the engine's counters, queue by queue."""
        fams: dict = {}
        for q, stats in enumerate(per_queue):
            queue = str(q)
            for name, value in stats.items():
                decl = ENGINE_COUNTERS.get(name)
                if decl is None and name in _SHARE_NAMES:
                    continue                      # served with its total, below
                if decl is None:
                    if name not in self._unknown_logged:
                        self._unknown_logged.add(name)
                        log.warning("engine counter %s has no metric declared; not exported "
                                    "(dataplane/daemon/metrics.py ENGINE_COUNTERS)", name)
                    continue
                fname, lval = decl
                samples = fams.setdefault(fname, [])
                if fname in FAMILY_LABELLED:
                    dp = ("engine",) if fname in metrics_kernel.DATAPATH_LABELLED else ()
                    samples += [((lval, family, queue) + dp, n)
                                for family, n in self._by_family(q, name, stats)]
                    continue
                if name == SYSCALL_REST:
                    value = self._rest_of(q, name, value,
                                          sum(stats.get(k, 0) for k in _SYSCALL_KINDS))
                samples.append(((lval, queue) if lval is not None else (queue,), value))
        return fams

    def _by_family(self, q: int, name: str, stats: dict) -> list:
        """[(family, value)] of one counter of a FAMILY_LABELLED family."""
        share = V6_SHARES.get(name)
        if share is None:
            return [(FIXED_FAMILY.get(name, "other"), stats[name])]
        v6 = stats.get(share, 0)
        return [("ipv4", self._rest_of(q, name, stats[name], v6)), ("ipv6", v6)]

    def _rest_of(self, q: int, name: str, total: int, parts: int) -> int:
        """total - parts, served so that it never goes down while the total does not."""
        rest = max(0, total - parts)
        with self._rest_lock:
            seen, served = self._rest.get((q, name), (0, 0))
            if total >= seen:
                rest = max(rest, served)
            self._rest[(q, name)] = (total, rest)
        return rest


def make_registry(source: MetricsSource, *, standard: bool = True) -> CollectorRegistry:
    """The daemon's families (DECLARED) and, with ``standard``, the process_* and python_* ones
    every Prometheus client serves (STANDARD), which dashboards and alerts on CPU, memory and
    open fds expect."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DaemonCollector(source))
    if standard:
        # /proc read once a second at most: a scrape's syscalls wait for the interpreter lock
        reg.register(CachedCollector(ProcessCollector(registry=None)))
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)
    return reg
