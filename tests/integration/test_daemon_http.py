"""The daemon's HTTP endpoints on a real overlay: /readyz follows etcd, etcd health in /metrics,
/debug/trace kept to loopback (and to headers) unless the operator says otherwise."""
from __future__ import annotations

import json

import pytest

from dataplane.engine import ipv4
from tests.conftest import require_etcd, require_root, wait_until

pytestmark = [pytest.mark.root, pytest.mark.etcd]


@pytest.fixture(scope="module")
def ov():
    require_root()
    require_etcd()
    from dataplane.testbed.overlay import Overlay
    overlay = Overlay(hosts=0, engine="auto")
    try:
        overlay.add_host(start=False)
        overlay.add_host(start=False)
        yield overlay
    finally:
        overlay.close()


@pytest.fixture
def hosts(ov):
    a, b = ov.hosts
    yield a, b
    ov.stop_daemon(a)
    ov.stop_daemon(b)


def _readyz(ov, host, status, timeout):
    """(status, body) of /readyz once it answers ``status``."""
    def answered():
        got = ov.healthz(host, "/readyz")
        return got if got[0] == status else None
    return wait_until(answered, timeout, 0.3,
                      lambda: f"/readyz {status}; it answers {ov.healthz(host, '/readyz')}")


def test_readyz_follows_the_etcd_watch(ov, hosts):
    a, _ = hosts
    ov.start_daemon(a)
    status, body = _readyz(ov, a, 200, 10)
    assert status == 200, body
    assert {"[+]lease ok", "[+]engine ok", "[+]etcd_watch ok"} <= set(body.splitlines())
    ov.stop_etcd()
    try:
        status, body = _readyz(ov, a, 503, 15)
        assert status == 503 and "[-]etcd_watch failed: not connected to etcd" in body, body
        assert "[+]engine ok" in body                  # forwarding does not depend on etcd
        assert ov.healthz(a) == (200, "flanneld is running")
    finally:
        ov.start_etcd()
    status, body = _readyz(ov, a, 200, 30)
    assert status == 200, body
    m = ov.metrics(a)
    assert m['flannel_udp_etcd_watch_reconnects_total{watch="subnets"}'] >= 1
    assert m['flannel_udp_etcd_watch_connected{watch="subnets"}'] == 1
    assert 'flannel_udp_lease_renewals_total' in m


def test_trace_is_loopback_only_and_headers_only_by_default(ov, hosts, engine_kind):
    a, b = hosts
    ov.start_daemon(a, engine=engine_kind, args=("--trace",))
    ov.start_daemon(b, engine=engine_kind)
    # A ping with a payload we can look for, through a's engine.
    ov.exec(a, ["ping", "-c", "1", "-W", "1", "-p", "5345435245543131", "-s", "64",
                ov.flannel_ip(b)])
    status, body = ov.healthz(a, "/debug/trace?after=0")
    assert status == 200
    reads = [e for e in json.loads(body) if e["kind"] == "tun_read" and e["head"]]
    assert reads
    for e in reads:
        head = bytes.fromhex(e["head"])
        assert len(head) <= ipv4.parse(head).header_len + 8 and b"SECRET11" not in head
    full = json.loads(ov.healthz(a, "/debug/trace?after=0&payload=1")[1])
    assert any(b"SECRET11" in bytes.fromhex(e["head"]) for e in full)
    assert ov.healthz(a, "/debug/trace?after=-1")[0] == 400     # a traceback on the C engine before
    status, body = ov.healthz(b, "/debug/trace?after=0", addr=a.ip)
    assert status == 403 and "--trace-remote" in body
    ov.restart_daemon(a, args=("--trace", "--trace-remote"))
    status, body = ov.healthz(b, "/debug/trace?after=0", addr=a.ip)
    assert status == 200 and isinstance(json.loads(body), list)
