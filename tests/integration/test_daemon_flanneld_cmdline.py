"""A daemon started with a flanneld command line on a simulated host (root, real etcd): Go-style
flags, a scheme-less etcd endpoint, Kubernetes flags at flanneld's defaults, an unparsable
FLANNELD_* value, and /healthz and /metrics served on IPv6 (`--healthz-ip ::1`, `::`)."""
from __future__ import annotations

import sys

import pytest

from tests.conftest import require_etcd, require_root

pytestmark = [pytest.mark.root, pytest.mark.etcd]

GET = ("import sys, urllib.request\n"
       "try:\n"
       "    r = urllib.request.urlopen(sys.argv[1], timeout=5)\n"
       "    print(r.status); sys.stdout.write(r.read().decode())\n"
       "except OSError as e:\n"
       "    print(0); sys.stdout.write(str(e))\n")


def get(ov, host, url) -> tuple[int, str]:
    r = ov.exec(host, [sys.executable, "-c", GET, url], timeout=20)
    status, _, body = r.stdout.partition("\n")
    return int(status or 0), body


@pytest.fixture
def overlay(engine_kind):
    require_root()
    require_etcd()
    from dataplane.testbed.overlay import Overlay
    ov = Overlay(hosts=0, engine=engine_kind)
    try:
        yield ov
    finally:
        ov.close()


def test_flanneld_command_line_and_healthz_on_ipv6(overlay):
    ov = overlay
    h = ov.add_host(start=False)
    # the testbed switches IPv6 off in its namespaces; the health check needs ::1 back
    ov.exec(h, ["sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=0"], check=True)
    endpoint = ov.etcd_url.split("://", 1)[1]                # 192.168.77.254:PORT, no scheme
    port = ov.healthz_port
    argv = [f"-etcd-endpoints={endpoint}", "-v", "2", "-ip-masq=false",
            "--kube-subnet-mgr=false", "--kube-annotation-prefix=flannel.alpha.coreos.com",
            "--healthz-ip=::1", "--metrics=[::1]:9285"]
    d = ov.start_daemon(h, args=argv, env={"FLANNELD_IPTABLES_RESYNC": "soon"})

    assert get(ov, h, f"http://[::1]:{port}/healthz") == (200, "flanneld is running")
    status, body = get(ov, h, "http://[::1]:9285/metrics")
    assert status == 200 and "flannel_udp_peers" in body
    assert get(ov, h, f"http://127.0.0.1:{port}/healthz")[0] == 0      # ::1 only
    log = d.log_text()
    assert f"on http://[::1]:{port}" in log
    assert "ignored FLANNELD_IPTABLES_RESYNC='soon'" in log
    assert "DEBUG" in log                                              # -v 2 took effect
    assert ov.subnet(h) in ov.leases()

    # `::` takes both families, as flanneld's listener does
    ov.restart_daemon(h, args=[f"-etcd-endpoints={endpoint}", "--healthz-ip", "::"])
    assert get(ov, h, f"http://[::1]:{port}/healthz") == (200, "flanneld is running")
    assert get(ov, h, f"http://127.0.0.1:{port}/healthz") == (200, "flanneld is running")
