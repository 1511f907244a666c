"""Health, metrics and the packet trace over HTTP, on a thread.

Endpoints (which server serves which is the daemon's choice, see :class:`HttpServer`):

* ``GET /healthz`` -> 200 ``flanneld is running`` (exactly flanneld's reply);
* ``GET /metrics`` -> Prometheus text format (daemon/metrics.py);
* ``GET /debug/trace?after=N`` -> JSON list of the engine's trace events with
  ``seq > N`` (oldest first; ``head`` is hex). 404 with a hint when the
  daemon runs without ``--trace``.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .metrics import MetricsSource, make_registry

log = logging.getLogger(__name__)

HEALTHZ_BODY = b"flanneld is running"


def trace_event_json(ev: dict) -> dict:
    out = {}
    for k, v in ev.items():
        out[k] = v.hex() if isinstance(v, (bytes, bytearray, memoryview)) else v
    return out


class _HTTPServer6(ThreadingHTTPServer):
    """An IPv6 listener (``--healthz-ip ::1``). ``::`` also takes IPv4, as
    flanneld's Go listener does, whatever net.ipv6.bindv6only says."""
    address_family = socket.AF_INET6

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def _server_class(host: str):
    try:
        v6 = ipaddress.ip_address(host).version == 6
    except ValueError:       # a name: IPv4, as before
        v6 = False
    return _HTTPServer6 if v6 else ThreadingHTTPServer


def _url_host(host: str) -> str:
    """``host`` as it goes into a URL: IPv6 addresses in brackets."""
    return f"[{host}]" if ":" in host else host


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
            self.httpd = _server_class(host)((host, port), Handler)
        except OSError as e:
            raise OSError(e.errno, f"cannot listen on {_url_host(host)}:{port} for "
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
        host, port = self.address
        log.info("Serving %s on http://%s:%d", ", ".join(
            {"healthz": "/healthz", "metrics": "/metrics", "trace": "/debug/trace"}[p]
            for p in sorted(self.paths)), _url_host(host), port)
        return self

    def close(self):
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()
