"""The daemon's HTTP server against hostile clients (loopback only): idle and slow connections,
malformed queries, the packet trace's exposure; /readyz and the etcd counters in /metrics."""
from __future__ import annotations

import json
import resource
import socket
import threading
import urllib.error
import urllib.request

import pytest

from dataplane.daemon import http, metrics
from dataplane.daemon.http import HttpServer
from dataplane.daemon.metrics import MetricsSource
from dataplane.engine import ipv4, ipv6
from tests.conftest import wait_until

SECRET = b"PAYLOAD-SECRET-" * 4
PACKET = ipv4.build("10.5.1.2", "10.5.2.3", ipv4.udp_payload(4000, 53, SECRET))


class Source(MetricsSource):
    """A daemon as the server sees it; `ready` is its readiness report."""

    def __init__(self):
        self.ready = {"lease": None, "engine": None, "etcd_watch": None}
        self.remote = False

    def trace_enabled(self):
        return True

    def trace_events(self, after):
        if not 0 <= after < 2 ** 64:                 # what the C engine does with -1
            raise ValueError(f"after {after} out of range")
        return [{"seq": after + 1, "kind": "tun_read", "len": len(PACKET), "head": PACKET[:64]}]

    def trace_remote(self):
        return self.remote

    def readiness(self):
        return dict(self.ready)

    def etcd_watches(self):
        return {"subnets": {"connected": True, "reconnects": 3, "resyncs": 1},
                "config": {"connected": False, "reconnects": 5, "resyncs": 0}}

    def lease_counts(self):
        return {"renewals": 7, "reacquisitions": 2, "races_lost": 4}


def get(url, timeout=5):
    try:
        r = urllib.request.urlopen(url, timeout=timeout)
        return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def source():
    return Source()


@pytest.fixture
def server(source):
    s = HttpServer("127.0.0.1", 0, source, ("healthz", "metrics", "trace")).start()
    yield s
    s.close()


def url(server, path):
    return "http://%s:%d%s" % (*server.address, path)


# -- exhaustion -----------------------------------------------------------------------------------

def _raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))
    return soft, hard


def _closed_by_peer(s: socket.socket) -> bool:
    """True once the server has closed `s` (after an error reply, if it sent one)."""
    try:
        while s.recv(4096, socket.MSG_DONTWAIT):
            pass
        return True                    # end of file
    except BlockingIOError:
        return False                   # open, nothing (more) to read
    except OSError:                    # reset: closed with our bytes unread
        return True


def test_healthz_answers_while_1000_idle_or_slow_connections_are_open(server):
    limits = _raise_nofile(4096)
    threads_before = threading.active_count()
    conns, stop = [], threading.Event()
    try:
        for _ in range(1000):
            c = socket.create_connection(server.address, timeout=2)
            c.setblocking(False)
            conns.append(c)
        slow = conns[-100:]            # the newest: the ones a server is least likely to have shed
        second_byte_sent = threading.Event()

        def one_byte_per_second():     # slowloris: a request that never ends, for at most 8 s
            for i in range(8):
                for c in slow:
                    try:
                        c.send(b"GET /healthz HTTP/1.1\r\n"[i:i + 1])
                    except OSError:
                        pass
                if i == 1:
                    second_byte_sent.set()
                if stop.wait(1.0):
                    return

        sender = threading.Thread(target=one_byte_per_second, daemon=True)
        sender.start()
        assert second_byte_sent.wait(10)
        status, body = get(url(server, "/healthz"), timeout=3)
        assert (status, body) == (200, "flanneld is running")
        # Answered while the slow requests are still being sent, not after the server gave up
        # on them (its request timeout closes them).
        assert not any(map(_closed_by_peer, slow))
        assert threading.active_count() - threads_before <= 8
        # Every connection that sent no complete request is closed by the server within its
        # request timeout, the slow ones included.
        wait_until(lambda: all(map(_closed_by_peer, conns)), http.REQUEST_TIMEOUT_S + 3, 0.2,
                   lambda: f"the server to close every connection; "
                           f"{sum(not _closed_by_peer(c) for c in conns)} still held")
    finally:
        stop.set()
        for c in conns:
            c.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_oversized_and_garbled_requests_get_an_error_and_a_close(server):
    for request, code in ((b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", b"431"),
                          (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"400")):
        with socket.create_connection(server.address, timeout=5) as c:
            try:
                c.sendall(request)
            except OSError:            # the server may stop reading at its limit
                pass
            reply = b""
            while chunk := c.recv(4096):
                reply += chunk
            assert reply.split(b" ", 2)[1] == code, reply[:80]


# -- queries --------------------------------------------------------------------------------------

@pytest.mark.parametrize("query,says", [
    ("after=-1", "after"), ("after=abc", "after"), ("after=1e3", "after"),
    ("after=" + "9" * 30, "after"), ("after=18446744073709551616", "after"),
    ("after=%2B5", "after"), ("after=1&after=2", "after"), ("payload=maybe", "payload"),
    ("befor=3", "befor"), ("after", "after"),
])
def test_malformed_trace_queries_get_400_naming_the_parameter(server, query, says):
    status, body = get(url(server, f"/debug/trace?{query}"))
    assert status == 400 and says in body


def test_largest_cursor_is_accepted(server):
    assert get(url(server, f"/debug/trace?after={2 ** 64 - 2}"))[0] == 200


# -- the packet trace -----------------------------------------------------------------------------

def test_trace_serves_headers_only_unless_payload_is_asked_for(server):
    status, body = get(url(server, "/debug/trace?after=0"))
    head = bytes.fromhex(json.loads(body)[0]["head"])
    assert status == 200 and head == PACKET[:28]             # IPv4 (20) + UDP (8) headers
    assert b"SECRET" not in head
    status, body = get(url(server, "/debug/trace?after=0&payload=1"))
    assert bytes.fromhex(json.loads(body)[0]["head"]) == PACKET[:64]


@pytest.mark.parametrize("packet,keep", [
    (ipv4.build("10.5.1.2", "10.5.2.3", ipv4.echo_request(data=SECRET), proto=ipv4.PROTO_ICMP), 28),
    (ipv4.build("10.5.1.2", "10.5.2.3", bytes([0] * 12) + bytes([0x80]) + bytes(7) + SECRET,
                proto=ipv4.PROTO_TCP), 52),                  # data offset 8 words: 32 bytes
    (ipv4.build("10.5.1.2", "10.5.2.3", SECRET, proto=47), 20),         # GRE: no known L4 header
    (b"\x50" + bytes(39) + SECRET, 20),                       # neither: where a header would be
    (b"\x45\x00", 2),
    (ipv6.echo_request("fc00::1", "fc00::2", data=SECRET), 48),           # IPv6 40 + ICMPv6 8
    (ipv6.build("fc00::1", "fc00::2", ipv6.udp_payload("fc00::1", "fc00::2", 1, 2, SECRET)), 48),
    (ipv6.build("fc00::1", "fc00::2", SECRET, next_header=ipv6.NH_NONE), 40),
    (ipv6.build("fc00::1", "fc00::2", bytes(12) + bytes([0x50]) + bytes(7) + SECRET,
                next_header=ipv6.NH_TCP), 60),
], ids=["icmp", "tcp-options", "gre", "not-ip", "short", "icmpv6", "udp6", "ipv6-none", "tcp6"])
def test_headers_only_cut(packet, keep):
    assert http.headers_only(packet[:64]) == packet[:keep]


def test_later_fragment_keeps_only_the_ip_header():
    frag = bytearray(PACKET)
    frag[6:8] = (185).to_bytes(2, "big")                     # offset 1480: payload, no UDP header
    assert http.headers_only(bytes(frag[:64])) == bytes(frag[:20])


@pytest.mark.parametrize("host,local", [
    ("127.0.0.1", True), ("127.3.4.5", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.1", False), ("192.168.77.2", False), ("::ffff:10.0.0.1", False),
    ("fe80::1%eth0", False), ("2001:db8::1", False), ("", False),
])
def test_which_clients_are_loopback(host, local):
    assert http.client_is_loopback(host) is local


def test_trace_refused_to_a_remote_client_unless_the_daemon_allows_it(server, source, monkeypatch):
    monkeypatch.setattr(http, "client_is_loopback", lambda host: False)
    status, body = get(url(server, "/debug/trace?after=0"))
    assert status == 403 and "--trace-remote" in body
    source.remote = True
    assert get(url(server, "/debug/trace?after=0"))[0] == 200
    assert get(url(server, "/healthz"))[0] == 200            # only the trace is restricted


# -- readiness and etcd health --------------------------------------------------------------------

def test_readyz_200_when_every_check_passes(server):
    status, body = get(url(server, "/readyz"))
    assert status == 200
    assert body.splitlines() == ["[+]lease ok", "[+]engine ok", "[+]etcd_watch ok",
                                 "readyz check passed"]


def test_readyz_503_naming_each_failing_check(server, source):
    source.ready.update(etcd_watch="not connected to etcd (3 reconnects)", engine="not started")
    status, body = get(url(server, "/readyz"))
    assert status == 503
    assert "[-]etcd_watch failed: not connected to etcd (3 reconnects)" in body
    assert "[-]engine failed: not started" in body and "[+]lease ok" in body
    assert body.rstrip().endswith("readyz check failed")


def test_readyz_without_a_report_is_not_ready():
    s = HttpServer("127.0.0.1", 0, MetricsSource(), ("healthz",)).start()
    try:
        assert get(url(s, "/readyz"))[0] == 503
    finally:
        s.close()


def test_metrics_carry_etcd_health(server):
    body = get(url(server, "/metrics"))[1]
    for line in ('flannel_udp_etcd_watch_connected{watch="subnets"} 1.0',
                 'flannel_udp_etcd_watch_connected{watch="config"} 0.0',
                 'flannel_udp_etcd_watch_reconnects_total{watch="subnets"} 3.0',
                 'flannel_udp_etcd_watch_reconnects_total{watch="config"} 5.0',
                 'flannel_udp_etcd_watch_resyncs_total{watch="subnets"} 1.0',
                 "flannel_udp_lease_renewals_total 7.0",
                 "flannel_udp_lease_reacquisitions_total 2.0",
                 "flannel_udp_lease_races_lost_total 4.0"):
        assert line in body


def test_counts_of_a_replaced_object_are_carried_over():
    class Loop:
        def __init__(self, reconnects):
            self.reconnects = reconnects

    carried = metrics.CarriedCounters()
    first = Loop(3)
    assert carried.read("own", first, ("reconnects",)) == {"reconnects": 3}
    first.reconnects = 4
    assert carried.read("own", Loop(1), ("reconnects",)) == {"reconnects": 5}    # 4 + 1
    assert carried.read("own", None, ("reconnects",)) == {"reconnects": 5}


def test_binding_asks_no_name_service(monkeypatch):
    # http.server's own bind calls socket.getfqdn(): a DNS query at start where the host's
    # name is not in /etc/hosts (10 s when DNS is unreachable, as at boot)
    import socket as socket_mod
    from dataplane.daemon import http as daemon_http

    def no_lookup(*args):
        raise AssertionError("a name lookup while binding")
    monkeypatch.setattr(socket_mod, "getfqdn", no_lookup)
    for host in ("127.0.0.1", "::1"):
        srv = daemon_http._server_class(host)((host, 0), None)
        try:
            assert srv.server_name == host and srv.server_port == srv.socket.getsockname()[1]
        finally:
            srv.server_close()
