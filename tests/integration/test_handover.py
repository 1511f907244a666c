"""Upgrading the daemon without systemd: the handover socket, against a plain stop + start
(root, namespaces, real etcd and TUN).

::

      h0: flannel-udp (old) --handover socket--> flannel-udp (new, --handover)
       ||  paced UDP both ways, TCP both ways (tests/integration/restart_traffic.py)
      h1: flannel-udp

Both hosts run the engine under test with two queues and, for the C engine, the offloads on.
The old and the new daemon are the same code. The handover must lose no datagram, never reset
the TCP streams nor leave them silent for longer than TCP_STALL_BOUND_MS, keep flannel0 (the
same device), the lease (no write to etcd: the key's mod revision stays) and the route. A plain
stop + start is measured the same way: what the handover saves (a figure of the run).
"""
from __future__ import annotations

import json

import pytest

from tests.conftest import wait_until
from tests.integration import restart_traffic
from tests.integration.conftest import overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]

QUEUES = ("--queues", "2")
TCP_STALL_BOUND_MS = 100


def _overlay(kind: str):
    for overlay in overlay_of(kind, ()):
        for _ in range(2):
            overlay.add_host(engine=kind, args=QUEUES, wait=False)
        for h in overlay.hosts:
            overlay.wait_ready(h)
        yield overlay


@pytest.fixture
def ov(engine_kind):
    yield from _overlay(engine_kind)


@pytest.fixture
def ov_path(path_kind):
    """Each engine alone, and the kernel path (whose programs stay attached through the
    handover, the successor's replacing them)."""
    yield from _overlay(path_kind)


def ifindex(ov, host) -> int:
    r = ov.exec(host, ["ip", "-j", "link", "show", "flannel0"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]["ifindex"]


def lease_revision(ov, host) -> int:
    net = ov.subnet(host)
    r = ov.etcdctl("get", f"{ov.prefix}/subnets/{net.network_address}-{net.prefixlen}",
                   "-w", "json")
    return int(json.loads(r.stdout)["kvs"][0]["mod_revision"])


def _across(ov, action):
    a, b = ov.hosts
    return restart_traffic.across(ov.tb, a, b, ov.flannel_ip(a), ov.flannel_ip(b), action)


def test_handover_loses_nothing(ov_path, figure):
    ov = ov_path
    a, _b = ov.hosts
    old = ov.daemon(a)
    before = (ifindex(ov, a), ov.subnet(a), lease_revision(ov, a))
    if ov.kind == "c":
        assert "tun_tso" in old.log_text() and "udp_gro" in old.log_text()
    got = {}

    def handover():
        got["new"], got["rc"] = ov.handover_daemon(a)

    out = _across(ov, handover)
    new = got["new"]
    figure(f"{ov.kind}: handover (--handover), 2 queues", out.summary())
    assert got["rc"] == 0 and new.pid != old.pid, old.log_text()[-3000:]
    assert "Took over from pid" in new.log_text()
    assert out.tcp_problems() == [], out.details()
    assert out.udp_lost() == {"a->b": 0, "b->a": 0}, out.details()
    for direction, gap in out.tcp_max_gap_ms().items():
        assert gap <= TCP_STALL_BOUND_MS, f"TCP {direction} silent {gap} ms: {out.details()}"
    # the same device, lease and etcd key: nothing made again, nothing written
    assert (ifindex(ov, a), ov.subnet(a), lease_revision(ov, a)) == before
    assert "nothing written to etcd" in new.log_text()
    if ov.kind == "kernel":
        # the successor's programs in the old ones' place, carrying the pings below
        assert "kernel path: the tc programs forward" in new.log_text(), new.log_text()[-3000:]
        filters = ov.exec(a, ["tc", "filter", "show", "dev", a.iface, "ingress"]).stdout
        assert [line for line in filters.splitlines() if "fu_ingress" in line] == \
            [line for line in filters.splitlines() if "handle 0x4655" in line] and \
            filters.count("handle 0x4655") == 1, filters
    # and the new daemon is a complete one: it can hand over again
    again, rc = ov.handover_daemon(a)
    assert rc == 0 and ifindex(ov, a) == before[0]
    assert ov.ping(a, ov.flannel_ip(ov.hosts[1]), count=2)["received"] == 2


def test_stop_and_start_loses_traffic(ov, figure):
    """The baseline the handover is measured against: flannel0 goes with the process."""
    a, _b = ov.hosts
    before = ifindex(ov, a)
    out = _across(ov, lambda: ov.restart_daemon(a))
    figure(f"{ov.kind}: stop + start, 2 queues", out.summary())
    # the daemon came back on a new device, and the streams went on through it
    assert ifindex(ov, a) != before
    assert out.tcp_problems() == [], out.details()
    for direction, r in out.udp.items():
        assert r["distinct"] > 0 and r["ended"], f"UDP {direction}: {out.details()}"


def test_handover_to_another_config_starts_afresh(ov):
    """--queues differs: the new daemon says why it does not take over, the old one exits, and
    the new one makes flannel0 again with its own config."""
    a, b = ov.hosts
    before = ifindex(ov, a)
    new, rc = ov.handover_daemon(a, args=("--queues", "1"))
    assert rc == 0
    log = new.log_text()
    assert "Not taking over flannel0 and the UDP sockets from the handover socket: flannel0 has " \
           "2 queue(s)" in log, log[-3000:]
    assert "runs 1 queue(s) (--queues)" in log
    assert ifindex(ov, a) != before
    wait_until(lambda: ov.ping(a, ov.flannel_ip(b), count=1)["received"] == 1, 10,
               what="traffic through the new flannel0")
