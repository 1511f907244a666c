"""A host that refuses the sockets' steering program: the daemon and `forward` run one queue.

::

    h0 (netns) flannel-udp run --queues 2         h1 (netns) flannel-udp run --queues 2
    under a seccomp filter: SO_ATTACH_REUSEPORT_CBPF  <-- UDP 8285 -->   steering works
    fails with ENOPROTOOPT (refuse_steering.py)

This is what QEMU user-mode emulation, kernels before 4.5 and some sandboxes do
(dataplane/host/udpsock.py). h0 must say so once in a WARNING naming the call and
the errno, keep one socket and one flannel0 queue (a second queue nobody reads
would strand the packets the kernel steers to it), and forward; a new daemon
that takes h0's fds over (--handover) must agree on that one queue rather than
make flannel0 again. `forward --queues 2` falls back the same way. Both engines;
the daemons, namespaces and etcd go away in teardown, also on failure.
"""
from __future__ import annotations

import pytest

from tests.conftest import require_engine, require_overlay, require_root
from tests.integration.refuse_steering import wrap

pytestmark = [pytest.mark.root, pytest.mark.slow]

CALL = "SO_ATTACH_REUSEPORT_CBPF"
FALLBACK = "running 1 queue instead of 2"


def _warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if CALL in line and FALLBACK in line]


def _queues_of(exec_in, host) -> list[str]:
    r = exec_in(host, ["ls", "/sys/class/net/flannel0/queues"])
    return sorted(r.stdout.split())


def _sockets_of(exec_in, host) -> int:
    r = exec_in(host, ["ss", "-Hlun", "sport = :8285"])
    return len(r.stdout.strip().splitlines())


@pytest.mark.timeout(120)
def test_daemon_runs_one_queue_where_steering_is_refused(engine_kind):
    require_overlay()
    from dataplane.testbed.overlay import Overlay
    with Overlay(hosts=0, engine=engine_kind, daemon_args=("--queues", "2")) as ov:
        a = ov.add_host(start=False)
        b = ov.add_host(start=False)
        plain_argv = ov.daemon_argv
        ov.daemon_argv = lambda h, engine, args=(): (
            wrap(plain_argv(h, engine, args)) if h is a else plain_argv(h, engine, args))
        ov.start_daemon(a, wait=False)
        ov.start_daemon(b, wait=False)
        for h in (a, b):
            ov.wait_ready(h)
        da = ov.daemon(a)
        log_a = da.log_text()
        warned = _warnings(log_a)
        assert len(warned) == 1 and "WARNING" in warned[0] and "ENOPROTOOPT" in warned[0], log_a
        assert "1 queue(s)" in log_a.split("Running:")[-1], log_a
        assert not _warnings(ov.daemon(b).log_text())

        for src, dst in ((a, b), (b, a)):
            assert ov.reachable(src, ov.flannel_ip(dst), 15), ov.daemon(src).log_text()
            r = ov.ping(src, ov.flannel_ip(dst), count=5)
            assert r["received"] == 5, (r, ov.daemon(src).log_text())
        ma, mb = ov.metrics(a), ov.metrics(b)
        assert ma["flannel_udp_queues"] == 1 and mb["flannel_udp_queues"] == 2, (ma, mb)
        # one socket and one flannel0 queue left on h0: every packet the kernel steers into
        # flannel0 reaches the one engine that reads it
        assert _sockets_of(ov.exec, a) == 1 and _sockets_of(ov.exec, b) == 2
        assert _queues_of(ov.exec, a) == ["rx-0", "tx-0"]
        assert ma['flannel_udp_packets_total{path="tun_rx"}'] >= 5, ma
        assert ma['flannel_udp_packets_total{path="tun_tx"}'] >= 5, ma

        # a new daemon (same host, same filter) is handed the one queue and agrees on it
        before = len(da.log_text())         # both daemons write into the host's one log
        new, rc = ov.handover_daemon(a)
        assert rc == 0, da.log_text()
        log_new = new.log_text()[before:]
        assert "Took over from pid" in log_new, log_new
        assert "Not taking over" not in log_new, log_new
        assert len(_warnings(log_new)) == 1, log_new
        assert ov.metrics(a)["flannel_udp_queues"] == 1
        assert _queues_of(ov.exec, a) == ["rx-0", "tx-0"] and _sockets_of(ov.exec, a) == 1
        for src, dst in ((a, b), (b, a)):
            r = ov.ping(src, ov.flannel_ip(dst), count=3)
            assert r["received"] == 3, (r, new.log_text())


@pytest.mark.timeout(60)
def test_forward_runs_one_queue_where_steering_is_refused(engine_kind):
    require_root()
    require_engine(engine_kind)
    from dataplane.testbed.forwarder import start_static_overlay
    from dataplane.testbed.hosts import Testbed
    from tests.integration.traffic import ping
    with Testbed(2) as tb:
        plain_popen = tb.popen

        def popen(where, argv, **kw):
            if tb.host(where).name == "h0" and "forward" in argv:
                argv = wrap(list(argv))
            return plain_popen(where, argv, **kw)
        tb.popen = popen
        fwd = start_static_overlay(tb, engine_kind, extra=["--queues", "2"])
        fa, fb = fwd["h0"], fwd["h1"]
        assert fa.info()["queues"] == 1 and fb.info()["queues"] == 2
        assert len(_warnings(fa.log())) == 1 and "ENOPROTOOPT" in fa.log(), fa.log()
        assert not _warnings(fb.log()), fb.log()
        assert _queues_of(tb.exec, "h0") == ["rx-0", "tx-0"]
        assert _sockets_of(tb.exec, "h0") == 1
        a_tun, b_tun = (f.tun_addr.ip for f in (fa, fb))
        for src, dst in (("h0", str(b_tun)), ("h1", str(a_tun))):
            r = ping(tb, src, dst)
            assert r.returncode == 0 and " 0% packet loss" in r.stdout, \
                f"{r.stdout}{r.stderr}\nh0:\n{fa.log()}\nh1:\n{fb.log()}"
        assert fa.stop() == 0, fa.log()
        assert fb.stop() == 0, fb.log()
        assert len(fa.info()["queue_stats"]) == 1
