"""Health, Prometheus metrics and the packet trace over HTTP, on a thread.

Endpoints (which server serves which is the daemon's choice, see
:class:`HttpServer`):

* ``GET /healthz`` -> 200 ``flanneld is running`` (exactly flanneld's reply);
* ``GET /metrics`` -> Prometheus text format from a custom collector over
  :class:`MetricsSource`: engine counters (packets, bytes, drops by reason,
  ICMP sent, syscalls, batches), peers, lease expiry, the engine in use;
* ``GET /debug/trace?after=N`` -> JSON list of the engine's trace events with
  ``seq > N`` (oldest first; ``head`` is hex). 404 with a hint when the
  daemon runs without ``--trace``.
"""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)

HEALTHZ_BODY = b"flanneld is running"
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
        """{offload name: on} (dataplane.offload.NAMES); empty = not decided yet."""
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

    def trace_enabled(self) -> bool:
        return False

    def trace_events(self, after: int) -> list:
        return []


# stat name -> (family, label name, label value); anything else is exported as
# flannel_udp_engine_<name>_total so a new engine counter is never lost.
_PATHS = ("tun_rx", "udp_tx", "udp_rx", "tun_tx")
_SYSCALL_KINDS = ("tun_reads", "tun_writes", "udp_sends", "udp_recvs", "polls")
_OFFLOAD_OPS = ("tun_rx_gso", "udp_tx_gso", "udp_rx_gro", "tun_tx_gso")   # api.OFFLOAD_STATS


def _family_of(stat: str):
    for p in _PATHS:
        if stat == f"{p}_packets":
            return "packets", "path", p
        if stat == f"{p}_bytes":
            return "bytes", "path", p
    if stat.startswith("drop_"):
        return "drops", "reason", stat[len("drop_"):]
    if stat == "icmp_unreach_sent":
        return "icmp_sent", "type", "net_unreachable"
    if stat == "icmp_ttl_sent":
        return "icmp_sent", "type", "time_exceeded"
    if stat == "icmp_ratelimited":
        return "icmp_ratelimited", None, None
    if stat in _SYSCALL_KINDS:
        return "syscalls_by_kind", "kind", stat
    if stat == "tx_batches":
        return "batches", "direction", "tx"
    if stat == "rx_batches":
        return "batches", "direction", "rx"
    if stat in _OFFLOAD_OPS:
        return "offload_ops", "op", stat
    return None


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
                   "(receives holding a train), tun_tx_gso (coalesced writes into flannel0).",
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
                fam = _family_of(name)
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
                                  "(1) or not (0), decided at start (--offload).",
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

        info = self.source.engine_info()
        if info:
            labels = sorted(info)
            g = GaugeMetricFamily(f"{PREFIX}_engine_info", "The forwarding engine in use.",
                                  labels=labels)
            g.add_metric([str(info[k]) for k in labels], 1)
            yield g


def make_registry(source: MetricsSource) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DaemonCollector(source))
    return reg


def trace_event_json(ev: dict) -> dict:
    out = {}
    for k, v in ev.items():
        out[k] = v.hex() if isinstance(v, (bytes, bytearray, memoryview)) else v
    return out


class HttpServer:
    """One listener; ``paths`` picks what it serves: any of healthz, metrics, trace."""

    def __init__(self, host: str, port: int, source: MetricsSource, paths=("healthz",)):
        self.source = source
        self.paths = set(paths)
        self.registry = make_registry(source)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "flannel-udp"

            def log_message(self, fmt, *args):  # no access log on stderr
                log.debug("http: " + fmt, *args)

            def _send(self, code, body: bytes, ctype="text/plain; charset=utf-8"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self):
                u = urlsplit(self.path)
                try:
                    if u.path == "/healthz" and "healthz" in outer.paths:
                        return self._send(200, HEALTHZ_BODY)
                    if u.path == "/metrics" and "metrics" in outer.paths:
                        return self._send(200, generate_latest(outer.registry), CONTENT_TYPE_LATEST)
                    if u.path == "/debug/trace" and "trace" in outer.paths:
                        return self._trace(u)
                except BrokenPipeError:
                    return
                self._send(404, b"404 page not found\n")

            do_HEAD = do_GET

            def _trace(self, u):
                if not outer.source.trace_enabled():
                    return self._send(404, b"the packet trace is off: start the daemon with "
                                           b"--trace\n")
                q = parse_qs(u.query)
                try:
                    after = int(q.get("after", ["0"])[0])
                except ValueError:
                    return self._send(400, b"after must be an integer\n")
                events = [trace_event_json(e) for e in outer.source.trace_events(after)]
                return self._send(200, json.dumps(events).encode(), "application/json")

        try:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise OSError(e.errno, f"cannot listen on {host}:{port} for "
                                   f"{'/'.join(sorted(self.paths))}: {e.strerror}; choose "
                                   "another port or address") from None
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name=f"http-{port}",
                                        daemon=True)

    @property
    def address(self):
        return self.httpd.server_address[:2]

    def start(self):
        self._thread.start()
        log.info("Serving %s on http://%s:%d", ", ".join(
            {"healthz": "/healthz", "metrics": "/metrics", "trace": "/debug/trace"}[p]
            for p in sorted(self.paths)), *self.address)
        return self

    def close(self):
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()
