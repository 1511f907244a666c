"""Health, readiness, Prometheus metrics and the packet trace over HTTP (daemon/metrics.py
says what the metrics are).

Endpoints (which server serves which is the daemon's choice, see
:class:`HttpServer`):

* ``GET /healthz`` -> 200 ``flanneld is running`` (exactly flanneld's reply) while every loop
  of the daemon makes progress, else 503 with one line per stalled loop saying for how long
  (:meth:`MetricsSource.stalls`, daemon/liveness.py);
* ``GET /readyz`` -> 200 when every check of :meth:`MetricsSource.readiness`
  passes (lease, engine, etcd watch), else 503; one line per check;
* ``GET /metrics`` -> Prometheus text format from a custom collector over
  :class:`MetricsSource` (engine counters per queue, peers, lease expiry, the
  engine in use, etcd health) and prometheus_client's process_* and python_*
  collectors: every family is in daemon/metrics.py's DECLARED, and
  docs/metrics.md says what each means;
* ``GET /debug/trace?after=N[&payload=1]`` -> JSON list of the engine's trace
  events with ``seq > N`` (oldest first; ``head`` is hex: the IPv4 and L4
  headers only, the payload too with ``payload=1``). Served to loopback
  clients only unless the daemon runs with ``--trace-remote`` (403); 404 with
  a hint without ``--trace``; 400 naming the parameter for a malformed query.

The endpoints face whoever can reach the port (``0.0.0.0`` by default, as
flanneld), so no client holds a thread: one thread multiplexes every
connection, closes it when its request is not complete within
REQUEST_TIMEOUT_S or its reply not taken within WRITE_TIMEOUT_S, and sheds
the oldest waiting connection beyond MAX_CONNECTIONS; a small fixed pool of
workers only turns complete requests into replies, and sends what the socket
takes at once (the loop sends the rest, never waiting on a client).

(Over 450 lines as one piece: the endpoints and the one thread that guards every connection
for them are one server, whose limits read together.)
"""
from __future__ import annotations

import ipaddress
import json
import logging
import socket
import socketserver
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from ipaddress import ip_address
from queue import Empty, SimpleQueue
from selectors import EVENT_READ, EVENT_WRITE, DefaultSelector
from socket import MSG_DONTWAIT, SHUT_WR, socketpair
from time import monotonic, thread_time
from urllib.parse import parse_qsl, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST

from ..engine import ipv4, ipv6
from . import answer_clock
from .metrics import MetricsSource, make_registry
from .metrics_text import MetricsText

log = logging.getLogger(__name__)

HEALTHZ_BODY = b"flanneld is running"

REQUEST_TIMEOUT_S = 5.0      # accept -> request line and headers complete (slow clients included)
WRITE_TIMEOUT_S = 10.0       # reply ready -> taken by the client
LINGER_S = 1.0               # reply sent -> the client's close: what it sent beyond is read away
MAX_CONNECTIONS = 256        # open at once per listener; beyond, the oldest waiting one is closed
MAX_REQUEST_BYTES = 8192     # request line and headers
WORKERS = 2                  # threads turning requests into replies
LISTEN_BACKLOG = 128
TRACE_AFTER_MAX = 2 ** 64 - 1    # the engines' sequence numbers are unsigned 64-bit


# flannel_udp_answer_seconds' endpoint label: a path, else "other" (no client's text as a label)
_ENDPOINTS = {"/healthz": "healthz", "/readyz": "readyz", "/metrics": "metrics",
              "/debug/trace": "trace"}

_STAMP_SPACE = socket.CMSG_SPACE(16)       # one SCM_TIMESTAMPNS (struct timespec)

_L4_HEADER = {ipv4.PROTO_UDP: 8, ipv4.PROTO_ICMP: ipv4.ICMP_HEADER}
_TCP_HEADER_MIN = 20


def headers_only(head) -> bytes:
    """The IPv4 header and the L4 header (UDP, ICMP: 8 bytes; TCP: its data offset) at the start
    of a packet, without its payload. A later fragment keeps its IPv4 header only; bytes that are
    no IPv4 header keep at most the 20 where one would be. An IPv6 packet (version 6) keeps its
    headers up to the upper layer's, as headers6_only."""
    head = bytes(head)
    if head and head[0] >> 4 == ipv6.VERSION and len(head) >= ipv6.HEADER_LEN:
        return headers6_only(head)
    try:
        h = ipv4.parse(head)
    except ValueError:
        return head[:ipv4.HEADER_MIN]
    if h.version != 4 or h.ihl * 4 < ipv4.HEADER_MIN:
        return head[:ipv4.HEADER_MIN]
    end = h.header_len
    if h.is_later_fragment:
        return head[:end]
    if h.proto == ipv4.PROTO_TCP:
        offset = head[end + 12] >> 4 if len(head) > end + 12 else 0
        return head[:end + max(_TCP_HEADER_MIN, offset * 4)]
    return head[:end + _L4_HEADER.get(h.proto, 0)]


_L4_HEADER6 = {ipv6.NH_UDP: 8, ipv6.NH_ICMPV6: 8}


def headers6_only(head: bytes) -> bytes:
    """The IPv6 header, its extension headers and the upper layer's header (UDP, ICMPv6: 8 bytes;
    TCP: its data offset) at the start of an IPv6 packet, without its payload; the fixed header
    alone when the chain cannot be followed within ``head``."""
    upper = ipv6.upper_layer(head)
    if upper is None:
        return head[:ipv6.HEADER_LEN]
    proto, off = upper
    if proto == ipv6.NH_TCP:
        offset = head[off + 12] >> 4 if len(head) > off + 12 else 0
        return head[:off + max(_TCP_HEADER_MIN, offset * 4)]
    return head[:off + _L4_HEADER6.get(proto, 0)]


def client_is_loopback(host: str) -> bool:
    """Whether a peer address (as accept() gives it) is this host's loopback, IPv4-mapped too."""
    try:
        addr = ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


class BadQuery(ValueError):
    """A query /debug/trace cannot serve; the message names the parameter."""


def parse_trace_query(query: str) -> tuple[int, bool]:
    """(after, payload) from /debug/trace's query string; raises BadQuery."""
    usage = "/debug/trace takes after=N (0 to %d) and payload=1" % TRACE_AFTER_MAX
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query),
                          max_num_fields=4)
    except ValueError as e:
        raise BadQuery(f"malformed query ({e}); {usage}") from None
    seen = {}
    for name, value in pairs:
        if name not in ("after", "payload"):
            raise BadQuery(f"unknown parameter {name[:40]!r}; {usage}")
        if name in seen:
            raise BadQuery(f"{name} given twice; {usage}")
        seen[name] = value
    after, payload = seen.get("after", "0"), seen.get("payload", "0")
    if not (after.isascii() and after.isdigit() and len(after) <= 20
            and int(after) <= TRACE_AFTER_MAX):
        raise BadQuery(f"after must be a sequence number, 0 to {TRACE_AFTER_MAX} (got "
                       f"{after[:40]!r})")
    if payload not in ("0", "1", "false", "true"):
        raise BadQuery(f"payload must be 0 or 1 (got {payload[:40]!r})")
    return int(after), payload in ("1", "true")


def _plain_reply(code: int, text: str) -> bytes:
    """A complete reply the loop sends itself (the request never reached a handler)."""
    body = text.encode()
    return (f"HTTP/1.0 {code} {HTTPStatus(code).phrase}\r\nServer: flannel-udp\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


# what a worker hands the loop instead of a reply: sent whole, or the client is gone
_SENT, _GONE = object(), object()


def _end_sending(sock) -> bool:
    """Our side of a connection ended once its reply is sent; False if the client is gone.
    Closing instead would reset the connection if the client sent more than we read (a body,
    an oversized header), and its TCP could discard our reply."""
    try:
        sock.shutdown(SHUT_WR)
        return True
    except OSError:
        return False


class _Conn:
    """One client connection: what it sent so far, or what is left to send it. Its socket is
    left blocking (no ioctl to change that, one syscall less) and every recv and send on it
    says MSG_DONTWAIT."""
    __slots__ = ("sock", "addr", "buf", "out", "deadline", "since", "endpoint")

    def __init__(self, sock, addr, deadline: float):
        self.sock, self.addr, self.deadline = sock, addr, deadline
        self.buf = bytearray()
        self.out = memoryview(b"")
        self.since = answer_clock.begun()       # the answer's time counts from its accept
        self.endpoint = None                    # what it asked, once a worker read it


def trace_event_json(ev: dict, payload: bool = False) -> dict:
    out = {}
    for k, v in ev.items():
        if isinstance(v, (bytes, bytearray, memoryview)):
            v = (bytes(v) if payload or k != "head" else headers_only(v)).hex()
        out[k] = v
    return out


class _HTTPServer(ThreadingHTTPServer):
    """http.server's bind without its reverse lookup: HTTPServer.server_bind asks
    socket.getfqdn() for the listen address, a DNS query wherever the host's name is not
    in /etc/hosts (a stock Debian install), which held the daemon's start while DNS was
    unreachable - as it is at boot, when the overlay starts (docs/design.md#fig-http-bind)."""

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), port


class _HTTPServer6(_HTTPServer):
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
    return _HTTPServer6 if v6 else _HTTPServer


def _url_host(host: str) -> str:
    """``host`` as it goes into a URL: IPv6 addresses in brackets."""
    return f"[{host}]" if ":" in host else host


class HttpServer:
    """One listener; ``paths`` picks what it serves: any of healthz, metrics, trace."""
    # /readyz is served wherever /healthz is.

    def __init__(self, host: str, port: int, source: MetricsSource, paths=("healthz",), *,
                 request_timeout: float = REQUEST_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
                 workers: int = WORKERS):
        self.source = source
        self.paths = set(paths)
        self.registry = make_registry(source)
        self.metrics_text = MetricsText()     # generate_latest's text, each series' labels kept
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        outer = self

        class Handler(BaseHTTPRequestHandler):
            """Turns one complete request (bytes) into one reply (bytes), off the socket."""
            server_version = "flannel-udp"
            default_request_version = "HTTP/1.0"    # errors get a status line, never HTTP/0.9

            def setup(self):
                self.rfile = BytesIO(self.request)
                self.wfile = BytesIO()

            def finish(self):
                pass

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
                if u.path == "/healthz" and "healthz" in outer.paths:
                    return self._healthz()
                if u.path == "/readyz" and "healthz" in outer.paths:
                    return self._readyz()
                if u.path == "/metrics" and "metrics" in outer.paths:
                    return self._send(200, outer.metrics_text.render(outer.registry),
                                      CONTENT_TYPE_LATEST)
                if u.path == "/debug/trace" and "trace" in outer.paths:
                    return self._trace(u)
                self._send(404, b"404 page not found\n")

            do_HEAD = do_GET

            def _healthz(self):
                stalls = outer.source.stalls()
                if not stalls:
                    return self._send(200, HEALTHZ_BODY)
                return self._send(503, "".join(f"{s}\n" for s in stalls).encode())

            def _readyz(self):
                checks = outer.source.readiness() or {"daemon": "no readiness report"}
                lines = [f"[+]{name} ok" if why is None else f"[-]{name} failed: {why}"
                         for name, why in checks.items()]
                ok = all(why is None for why in checks.values())
                lines.append(f"readyz check {'passed' if ok else 'failed'}")
                return self._send(200 if ok else 503, ("\n".join(lines) + "\n").encode())

            def _trace(self, u):
                if not outer.source.trace_enabled():
                    return self._send(404, b"the packet trace is off: start the daemon with "
                                           b"--trace\n")
                if not (client_is_loopback(self.client_address[0])
                        or outer.source.trace_remote()):
                    return self._send(403, b"/debug/trace shows the forwarded traffic: it answers "
                                           b"loopback clients only unless the daemon runs with "
                                           b"--trace-remote\n")
                try:
                    after, payload = parse_trace_query(u.query)
                except BadQuery as e:
                    return self._send(400, f"{e}\n".encode())
                events = [trace_event_json(e, payload) for e in outer.source.trace_events(after)]
                return self._send(200, json.dumps(events).encode(), "application/json")

        self._handler = Handler
        try:
            self.httpd = _server_class(host)((host, port), Handler)
        except OSError as e:
            raise OSError(e.errno, f"cannot listen on {_url_host(host)}:{port} for "
                                   f"{'/'.join(sorted(self.paths))}: {e.strerror}; choose "
                                   "another port or address") from None
        # socketserver made and bound the listening socket; the connections are served by
        # _loop (one thread for all of them) and the workers, not by its thread per request.
        self.httpd.socket.listen(LISTEN_BACKLOG)
        # the kernel's time of each request's arrival (its accepted sockets inherit this): the
        # answer's clock then counts the wait for our thread to be woken and take the
        # interpreter back before the accept, which the client waits too (answer_clock.py)
        answer_clock.stamp_arrivals(self.httpd.socket)
        self.httpd.socket.setblocking(False)
        self._thread = threading.Thread(target=self._loop, name=f"http-{port}", daemon=True)
        self._workers = [threading.Thread(target=self._work, name=f"http-{port}-worker{i}",
                                          daemon=True) for i in range(max(1, workers))]
        self._jobs: SimpleQueue = SimpleQueue()        # _Conn with a complete request, or None
        self._replies: SimpleQueue = SimpleQueue()     # (_Conn, reply bytes) from the workers
        self._wake_r, self._wake_w = socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._closing = threading.Event()
        self._waiting: dict = {}      # _Conn -> None, oldest first: reading a request
        self._working: set = set()    # with a worker
        self._sending: dict = {}      # _Conn -> None, oldest first: writing the reply
        self._draining: dict = {}     # _Conn -> None, oldest first: reply sent, reading to EOF

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
        self._closing.set()
        self._wake()
        if self._thread.is_alive():
            self._thread.join(5)
        for _ in self._workers:
            self._jobs.put(None)
        self.httpd.server_close()
        self._wake_r.close()
        self._wake_w.close()

    # -- the connection loop (one thread) --------------------------------------------------------
    def _loop(self):
        for w in self._workers:
            w.start()
        self._sel = DefaultSelector()
        self._sel.register(self.httpd.socket, EVENT_READ, "accept")
        self._sel.register(self._wake_r, EVENT_READ, "wake")
        try:
            while not self._closing.is_set():
                for key, events in self._sel.select(self._next_timeout()):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._take_replies()
                    elif key.data in self._draining:
                        self._drain(key.data)
                    elif events & EVENT_READ:
                        self._read(key.data)
                    else:
                        self._write(key.data)
                self._expire()
        except Exception:
            log.exception("the HTTP server on port %d stopped", self.address[1])
        finally:
            for conn in [*self._waiting, *self._working, *self._sending, *self._draining]:
                conn.sock.close()
            self._sel.close()

    def _timed(self):
        """The connections with a deadline, each dict oldest first (deadlines grow with age)."""
        return self._waiting, self._sending, self._draining

    def _next_timeout(self):
        firsts = [next(iter(d)).deadline for d in self._timed() if d]
        return max(0.0, min(firsts) - monotonic()) if firsts else None

    def _expire(self):
        now = monotonic()
        for d in self._timed():
            while d:
                conn = next(iter(d))
                if conn.deadline > now:
                    break
                self._drop(conn)

    def _accept(self):
        for _ in range(64):                 # then let the other connections have a turn
            try:
                sock, addr = self.httpd.socket.accept()
            except BlockingIOError:
                return
            except OSError as e:            # out of fds (EMFILE...): free one, or wait a moment
                if self._shed():
                    continue
                log.warning("http: cannot accept a connection: %s", e)
                self._closing.wait(0.05)
                return
            open_now = (len(self._waiting) + len(self._working) + len(self._sending)
                        + len(self._draining))
            if open_now >= self.max_connections and not self._shed():
                sock.close()                # all busy with replies: this one waits no turn
                continue
            conn = _Conn(sock, addr, monotonic() + self.request_timeout)
            self._waiting[conn] = None
            self._read(conn, registered=False)      # its request is often there already

    def _shed(self) -> bool:
        """Close the oldest connection that is still sending its request, or lingering."""
        for d in (self._waiting, self._draining):
            if d:
                self._drop(next(iter(d)))
                return True
        return False

    def _read(self, conn: _Conn, registered: bool = True):
        """What the client sent; a complete request goes to a worker. A connection just
        accepted is read once before it is watched: when its request is there, no epoll_ctl and
        no wait for the next select (each syscall gives the interpreter lock up, and taking it
        back waits behind the daemon's busy threads: perf/README.md#answer-handoffs)."""
        try:
            data, anc, _, _ = conn.sock.recvmsg(4096, _STAMP_SPACE, MSG_DONTWAIT)
        except BlockingIOError:
            data = None
        except OSError:
            data = b""
        if data and not conn.buf:
            conn.since = answer_clock.arrived(anc, conn.since)
        if data == b"":                     # gone before its request was complete
            return self._drop(conn)
        conn.buf += data or b""
        complete = b"\r\n\r\n" in conn.buf or b"\n\n" in conn.buf
        if not complete and len(conn.buf) <= MAX_REQUEST_BYTES:
            if not registered:
                self._sel.register(conn.sock, EVENT_READ, conn)
            return
        del self._waiting[conn]
        if registered:
            self._sel.unregister(conn.sock)
        if complete:
            self._working.add(conn)
            self._jobs.put(conn)
        else:
            self._reply(conn, _plain_reply(431, f"request line and headers longer than "
                                                f"{MAX_REQUEST_BYTES} bytes\n"))

    def _take_replies(self):
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                conn, reply = self._replies.get_nowait()
            except Empty:
                return
            self._working.discard(conn)
            self._reply(conn, reply)

    def _reply(self, conn: _Conn, reply):
        if reply is _GONE:
            return conn.sock.close()
        if reply is _SENT:                  # the worker sent it all and ended our side
            return self._linger(conn)
        if not reply:                       # nothing to say (an empty request line)
            conn.sock.close()
            return
        conn.out = memoryview(reply)
        conn.deadline = monotonic() + WRITE_TIMEOUT_S
        self._sending[conn] = None
        self._sel.register(conn.sock, EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn):
        try:
            conn.out = conn.out[conn.sock.send(conn.out, MSG_DONTWAIT):]
        except BlockingIOError:
            return
        except OSError:
            return self._drop(conn)
        if conn.out:
            return
        del self._sending[conn]
        self._sel.unregister(conn.sock)
        if conn.endpoint:
            answer_clock.CLOCK.done(conn.endpoint, conn.since)
        if _end_sending(conn.sock):
            self._linger(conn)
        else:
            conn.sock.close()

    def _linger(self, conn: _Conn):
        """The reply sent, our side ended: what the client still sends is read away until its
        close (or LINGER_S)."""
        conn.deadline = monotonic() + LINGER_S
        self._draining[conn] = None
        self._sel.register(conn.sock, EVENT_READ, conn)

    def _drain(self, conn: _Conn):
        try:
            if conn.sock.recv(65536, MSG_DONTWAIT):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._drop(conn)

    def _drop(self, conn: _Conn):
        for d in self._timed():
            d.pop(conn, None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _wake(self):
        try:
            self._wake_w.send(b"x")
        except OSError:                     # full (a wake-up is pending anyway) or closed
            pass

    # -- the workers -----------------------------------------------------------------------------
    def _work(self):
        while (conn := self._jobs.get()) is not None:
            cpu = thread_time()
            try:
                h = self._handler(bytes(conn.buf), conn.addr, self)
                reply = h.wfile.getvalue()
                conn.endpoint = _ENDPOINTS.get(urlsplit(getattr(h, "path", "")).path, "other")
            except Exception:
                log.exception("http: request from %s failed", conn.addr[0])
                reply = _plain_reply(500, "internal error (see the daemon's log)\n")
            sent = self._send_now(conn, reply)
            if sent is _SENT and conn.endpoint:
                answer_clock.CLOCK.done(conn.endpoint, conn.since, thread_time() - cpu)
            self._replies.put((conn, sent))
            self._wake()

    def _send_now(self, conn: _Conn, reply: bytes):
        """Send the reply from the worker, where the client gets it without waiting for the
        loop's thread to wake (behind a busy interpreter, each thread's turn can be a wait:
        perf/README.md#answer-handoffs); what the socket did not take (or SENT) for the loop."""
        if not reply:
            return reply
        try:
            sent = conn.sock.send(reply, MSG_DONTWAIT)
        except BlockingIOError:
            return reply
        except OSError:
            return _GONE
        if sent < len(reply):
            return memoryview(reply)[sent:]
        return _SENT if _end_sending(conn.sock) else _GONE
