"""The healthz/metrics server on IPv6 addresses (--healthz-ip ::1, --metrics [::1]:PORT), no root."""
from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from dataplane.daemon.http import HEALTHZ_BODY, HttpServer
from dataplane.daemon.metrics import MetricsSource
from tests.conftest import require


def _loopback_v6() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def healthz(host: str, port: int):
    url = f"http://{host}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.URLError as e:
        return None, str(e.reason).encode()


@pytest.fixture
def serve():
    require(_loopback_v6(), "needs IPv6 on the loopback (::1)")
    made = []

    def start(host):
        s = HttpServer(host, 0, MetricsSource(), ("healthz",)).start()
        made.append(s)
        return s.address[1]

    yield start
    for s in made:
        s.close()


# (listen address, answers on [::1], answers on 127.0.0.1); `::` takes both families, as
# flanneld's Go listener on [::] does; `0.0.0.0` does not (Go's would: docs/flannel-compat.md#known-command-lines)
@pytest.mark.parametrize("listen,on_v6,on_v4", [("::1", True, False), ("::", True, True),
                                                ("127.0.0.1", False, True),
                                                ("0.0.0.0", False, True)])
def test_healthz_families(serve, listen, on_v6, on_v4):
    port = serve(listen)
    ok = (200, HEALTHZ_BODY)
    assert (healthz("[::1]", port) == ok, healthz("127.0.0.1", port) == ok) == (on_v6, on_v4)


def test_listen_error_names_the_v6_address(serve):
    port = serve("::1")
    with pytest.raises(OSError, match=rf"\[::1\]:{port}"):
        HttpServer("::1", port, MetricsSource())
