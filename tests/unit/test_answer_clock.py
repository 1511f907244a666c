"""flannel_udp_answer_seconds: the daemon's own clock of its answers (daemon/answer_clock.py),
over a real HTTP server and a real status socket, and its start at the kernel's receipt of a
request (SO_TIMESTAMPNS) rather than at the accept."""
from __future__ import annotations

import socket
import time
import urllib.request

import pytest

from dataplane.daemon import answer_clock, status
from dataplane.daemon.http import HttpServer
from dataplane.daemon.main import Daemon
from dataplane.daemon.metrics import MetricsSource
from dataplane.daemon.options import Options
from dataplane.testbed.overlay import parse_metrics


def _answers(body: bytes, endpoint: str) -> float:
    return parse_metrics(body.decode()).get(
        f'flannel_udp_answer_seconds_count{{endpoint="{endpoint}"}}', 0.0)


@pytest.fixture
def server():
    s = HttpServer("127.0.0.1", 0, MetricsSource(), ("healthz", "metrics")).start()
    yield s
    s.close()


def _get(server, path: str) -> bytes:
    host, port = server.address
    return urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5).read()


def test_each_answer_is_counted_by_its_endpoint(server, tmp_path):
    before = _get(server, "/metrics")
    for path in ("/healthz", "/healthz", "/readyz", "/nothing-here"):
        try:
            _get(server, path)
        except urllib.error.HTTPError:          # /readyz of a source with no checks, the 404
            pass
    d = Daemon(Options(subnet_file=str(tmp_path / "subnet.env"),
                       status_socket=str(tmp_path / "status.sock")))
    st = status.listen(d.state.opts.status_socket, d.state, d.source, d.warnings)
    try:
        status.query(st.path, timeout=5.0)
    finally:
        st.close()
    after = _get(server, "/metrics")
    assert _answers(after, "healthz") - _answers(before, "healthz") == 2
    assert _answers(after, "readyz") - _answers(before, "readyz") == 1
    assert _answers(after, "other") - _answers(before, "other") == 1   # no client text as a label
    assert _answers(after, "status") - _answers(before, "status") == 1
    assert _answers(after, "metrics") - _answers(before, "metrics") == 1
    m = parse_metrics(after.decode())
    assert m['flannel_udp_answer_seconds_bucket{endpoint="healthz",le="+Inf"}'] == \
        _answers(after, "healthz")


def test_the_clock_starts_at_the_requests_arrival_not_at_the_accept():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        answer_clock.stamp_arrivals(listener)
        with socket.create_connection(listener.getsockname()) as client:
            client.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            time.sleep(0.2)                     # the daemon's thread not scheduled meanwhile
            conn, _ = listener.accept()
            with conn:
                since = answer_clock.begun()
                data, anc, _, _ = conn.recvmsg(4096, socket.CMSG_SPACE(16))
                assert data.startswith(b"GET")
                moved = answer_clock.arrived(anc, since)
    assert since[0] - moved[0] >= 0.19
    assert moved[1] == since[1]
    assert answer_clock.arrived([], since) == since     # no stamp: from the accept


def test_buckets_are_cumulative_and_the_slow_answer_is_logged(caplog):
    clock = answer_clock.AnswerClock()
    caplog.set_level("DEBUG", logger="dataplane.daemon.answer_clock")
    now = time.monotonic()
    clock.done("metrics", (now - 0.002, time.process_time()))
    clock.done("metrics", (now - 0.3, time.process_time()), own_cpu=0.001)
    ((labels, (cumulative, total)),) = clock.samples()
    assert labels == ("metrics",)
    assert cumulative[answer_clock.BUCKETS.index(0.0025)] == 1
    assert cumulative[answer_clock.BUCKETS.index(0.25)] == 1 and cumulative[-1] == 2
    assert 0.3 <= total < 0.4
    assert "metrics took" in caplog.text and "thread's CPU 1.0 ms" in caplog.text
