"""A mixed cluster on a dual-stack config: a flanneld udp host takes a dual-stack key but forwards
no IPv6 (docs/flannel-compat.md#dual-stack; its lease value has no `ForwardsIPv6`), so a
flannel-udp host routes none of its IPv6 part. A pod of the flannel-udp host that sends IPv6
there is told at once, by its own host: the engine's ICMPv6 destination unreachable from
flannel0's IPv6 address (csrc/dataplane.h "ICMPv6 errors"), which ping prints and which fails a
TCP connect with ENETUNREACH, rather than a wait for a timeout. Real daemon, real etcd, both
engines; the flanneld host is its lease alone, as flanneld v0.20.2's udp backend writes it (the
suite does not need flanneld). Silence comes only from a host that does not forward IPv6:
tests/integration/test_host_forwarding.py.
"""
from __future__ import annotations

import ipaddress
import json
import subprocess
import sys

import pytest

from dataplane.testbed import netns as ns
from tests.integration.conftest import overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.66.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:66::/56",
          "Backend": {"Type": "udp"}}
FLANNELD_KEY = "subnets/10.66.200.0-24&fc00:66:0:c8::-64"
FLANNELD_PART = ipaddress.IPv6Network("fc00:66:0:c8::/64")
CONNECT = """
import errno, socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
s.settimeout(5)
try:
    s.connect((sys.argv[1], 80))
    print("connected")
except socket.timeout:
    print("timeout")
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno))
"""


@pytest.fixture
def ov(path_kind):
    # --ip-masq as flannel's manifests run flanneld: the error crosses its masquerade rules too
    yield from overlay_of(path_kind, ({"engine": path_kind, "args": ("--ip-masq",)},),
                          config=CONFIG, ipv6=True)


def test_ipv6_to_a_flanneld_host_is_unreachable_at_once(ov):
    h0 = ov.hosts[0]
    flanneld = ov.tb.add_host()         # a host namespace with a lease and no flannel-udp
    ov.put(FLANNELD_KEY, json.dumps({"PublicIP": flanneld.ip, "PublicIPv6": None}))
    assert ov.wait_log(h0, f"its IPv6 part {FLANNELD_PART} gets no route: the lease does not say "
                           "ForwardsIPv6"), ov.daemon(h0).log_text()[-2000:]
    six = ipaddress.IPv6Interface(ov.subnet_env(h0)["FLANNEL_IPV6_SUBNET"]).network
    pod = ov.tb.add_pod(h0, "p", f"{six.network_address + 2}/64", str(six.network_address + 1))
    target = str(FLANNELD_PART.network_address + 2)     # where its first pod would be

    r = subprocess.run(ns.exec_argv(pod, ["ping", "-6", "-n", "-c", "1", "-W", "5", target]),
                       capture_output=True, text=True, timeout=20)
    assert f"From {six.network_address} icmp_seq=1 Destination unreachable" in r.stdout, r.stdout
    r = subprocess.run(ns.exec_argv(pod, [sys.executable, "-c", CONNECT, target]),
                       capture_output=True, text=True, timeout=20)
    assert r.stdout.strip() in ("ENETUNREACH", "EHOSTUNREACH", "EACCES"), r.stdout + r.stderr
    m = ov.metrics(h0)
    assert m['flannel_udp_icmp_sent_total{family="ipv6",type="net_unreachable"}'] >= 2, m
    assert m['flannel_udp_drops_total{family="ipv6",reason="no_route"}'] >= 2, m
    if ov.kind == "kernel":     # the programs handed both on to the engine, which answered
        assert m['flannel_udp_kernel_passed_total{direction="tx",reason="no_route"}'] >= 2, m
    # its IPv4 subnet is a route all the same
    assert m["flannel_udp_peers"] == 1 and m["flannel_udp_peers_ipv6"] == 0, m
