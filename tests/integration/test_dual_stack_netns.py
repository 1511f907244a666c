"""IPv6 pods over the IPv4 underlay and the IPv6 one: two daemons on a dual-stack network config
(`EnableIPv6`), each engine on both ends, real etcd and hosts (docs/operating.md#dual-stack).

A pod hangs off a host with an address from FLANNEL_IPV6_SUBNET's range. ICMPv6 errors reach the
sender; h0 has an IPv6 underlay address, h1 none: between them IPv6 goes over IPv4; between two
hosts that both have one (:func:`ov6`), over IPv6, with a TCP stream of 20 MiB intact through the
C engine's IPv6 offloads (TSO6 read, TCPV6 GSO written). What a dual-stack host sets up, and pods
of three hosts talking over both families: test_dual_stack_hosts.py.
"""
from __future__ import annotations

import ipaddress
import json
import subprocess
import sys

import pytest

from dataplane.host.child import cli_argv
from dataplane.testbed import netns as ns
from dataplane.testbed.wait import wait_for
from dataplane.testbed.overlay import parse_ping
from tests.integration.conftest import other_engine, overlay_of
from tests.streams import NO_TX_OFFLOADS, hashed_transfer, udp_stream

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.66.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:66::/56",
          "Backend": {"Type": "udp"}}
NET6 = ipaddress.IPv6Network(CONFIG["IPv6Network"])


@pytest.fixture
def ov(path_kind):
    yield from overlay_of(path_kind, ((path_kind, {"underlay6": True}), path_kind),
                          config=CONFIG, ipv6=True)


def subnet6(ov, h) -> ipaddress.IPv6Network:
    return ipaddress.IPv6Interface(ov.subnet_env(h)["FLANNEL_IPV6_SUBNET"]).network


def ping6(netns: str, dst: str, count: int = 3) -> dict:
    r = subprocess.run(ns.exec_argv(netns, ["ping", "-6", "-n", "-q", "-c", str(count), "-i",
                                            "0.2", "-W", "1", "-w", "5", dst]),
                       capture_output=True, text=True, timeout=20)
    return parse_ping(r.stdout, r.returncode)


NBYTES6, NDGRAMS6 = 20 << 20, 1000


def _ipv6_streams(ov, src_pod: str, dst_pod: str, dst_addr) -> None:
    """NBYTES6 of TCP over IPv6 from src_pod to dst_pod, intact (sha256 on both ends), then
    NDGRAMS6 datagrams, all intact and in order. The C engine reads the TCP as TCPV6
    super-packets from flannel0 (TSO6) on the sending host and writes TCPV6 GSO packets into
    flannel0 on the receiving one, then UDP_L4 ones of the datagrams' runs; the receiving host's
    end of the pod's veth computes nothing, so its kernel must cut those packets and finish every
    checksum from the pseudo-header sum we left: a wrong header or sum loses data."""
    h0, h1 = ov.hosts
    near = f"{ns.PREFIX}{ov.tb.tag}{h0.index}p"          # hosts.add_pod's name for h0's end
    r = ov.exec(h0, [sys.executable, "-c", NO_TX_OFFLOADS, near])
    assert r.returncode == 0 and "True" not in r.stdout, r.stdout + r.stderr
    ops = 'flannel_udp_offload_ops_total{op="%s"}'

    def gso_ops() -> tuple[float, float]:
        return (ov.metrics(h1).get(ops % "tun_rx_gso", 0),
                ov.metrics(h0).get(ops % "tun_tx_gso", 0))

    hashed_transfer(src_pod, dst_pod, str(dst_addr), NBYTES6)
    after_tcp = gso_ops()
    got, bad, in_order, distinct = udp_stream(src_pod, dst_pod, str(dst_addr), NDGRAMS6, 1000, 25)
    assert (got, bad, in_order, distinct) == (NDGRAMS6, 0, 1, NDGRAMS6)
    after_udp = gso_ops()
    # the sender h1 reads TSO6 super-packets, the receiver h0 writes TCPV6 then UDP_L4 packets;
    # the Python engine does neither
    if ov.daemon(h1).engine == "c":
        assert after_tcp[0] > 0, after_tcp
    else:
        assert after_udp[0] == 0, after_udp
    if ov.daemon(h0).engine == "c":
        assert after_tcp[1] > 0 and after_udp[1] > after_tcp[1], (after_tcp, after_udp)
    else:
        assert after_udp[1] == 0, after_udp


def ping6_out(netns: str, dst: str, *extra: str) -> str:
    r = subprocess.run(ns.exec_argv(netns, ["ping", "-6", "-n", "-c", "1", "-W", "2", *extra,
                                            dst]), capture_output=True, text=True, timeout=20)
    return r.stdout


def test_icmpv6_errors_reach_the_sender(ov):
    """dataplane.h's "ICMPv6 errors" seen by the senders' kernels: an unleased address inside
    IPv6Network is unreachable, a hop limit of 1 through flannel0 exceeded; both come from
    flannel0's IPv6 address (the kernel takes its own address as an error's source)."""
    h0, h1 = ov.hosts
    six0, six1 = subnet6(ov, h0), subnet6(ov, h1)
    pod0 = ov.tb.add_pod(h0, "p", f"{six0.network_address + 2}/64", str(six0.network_address + 1))
    assert wait_for(lambda: ping6(h0.netns, str(six1.network_address), count=1)["received"] == 1,
                    10, interval=0.2)
    # h1 has no PublicIPv6: h0 sends it IPv6 over IPv4 though it has an IPv6 underlay itself
    # (the kernel path's programs send without a socket: their own counter says it)
    kernel = 'flannel_udp_packets_total{datapath="kernel",path="udp_tx"}'
    v4, v6, k = *udp_out(ov, h0), ov.metrics(h0).get(kernel, 0)
    assert ping6(pod0, str(six1.network_address))["received"] == 3
    v4_after, v6_after, k_after = *udp_out(ov, h0), ov.metrics(h0).get(kernel, 0)
    assert (k_after - k if ov.kind == "kernel" else v4_after - v4) >= 3 and v6_after - v6 < 3, \
        (v4, v4_after, v6, v6_after, k, k_after)
    unleased = next(n for n in NET6.subnets(new_prefix=64) if n not in (six0, six1))
    out = ping6_out(pod0, str(unleased.network_address + 5))
    assert f"From {six0.network_address} icmp_seq=1 Destination unreachable" in out, out
    out = ping6_out(h0.netns, str(six1.network_address), "-t", "1")
    assert f"From {six0.network_address} icmp_seq=1 Time exceeded" in out, out
    if ov.kind == "kernel":     # both handed on by the programs, answered by the engine
        m = ov.metrics(h0)
        passed = 'flannel_udp_kernel_passed_total{direction="tx",reason="%s"}'
        assert m[passed % "no_route"] >= 1 and m[passed % "ttl"] >= 1, m


# -- the IPv6 underlay (docs/operating.md#dual-stack) ---------------------------------------
def udp_out(ov, h) -> tuple[int, int]:
    """(IPv4, IPv6) UDP datagrams sent by ``h``'s network namespace so far: the kernel's own
    counters, which only the engines' sockets move here."""
    return ov.tb.udp_out(h)


@pytest.fixture
def ov6(engine_kind):
    """h0 and h1 with an IPv6 underlay address, each engine on one of them."""
    yield from overlay_of(engine_kind, ((kind, {"underlay6": True})
                                        for kind in (engine_kind, other_engine(engine_kind))),
                          config=CONFIG, ipv6=True)


def test_ipv6_goes_over_the_ipv6_underlay_where_both_hosts_have_one(ov6):
    ov = ov6
    h0, h1 = ov.hosts
    for h in ov.hosts:
        value = ov.etcdctl("get", "--prefix",
                           f"{ov.prefix}/subnets/{ov.subnet(h).network_address}-",
                           "--print-value-only").stdout.strip()
        assert json.loads(value) == {"PublicIP": h.ip, "PublicIPv6": h.ip6, "ForwardsIPv6": True}
    status = subprocess.run(cli_argv("status", "--json", "--status-socket", ov.status_socket(h0)),
                            capture_output=True, text=True, timeout=30).stdout
    assert json.loads(status)["lease"]["public_ipv6"] == h0.ip6, status
    six = {h.name: subnet6(ov, h) for h in ov.hosts}
    pod0 = ov.tb.add_pod(h0, "p", f"{six['h0'].network_address + 2}/64",
                         str(six["h0"].network_address + 1))
    pod1_addr = six["h1"].network_address + 2
    pod1 = ov.tb.add_pod(h1, "p", f"{pod1_addr}/64", str(six["h1"].network_address + 1))
    assert wait_for(lambda: ping6(pod0, str(pod1_addr), count=1)["received"] == 1, 10,
                    interval=0.2), "pod0 -> pod1 over IPv6"

    # pods' IPv6 between h0 and h1: IPv6 datagrams, no IPv4 ones
    v4, v6 = udp_out(ov, h0)
    assert ping6(pod0, str(pod1_addr), count=3)["received"] == 3
    v4_after, v6_after = udp_out(ov, h0)
    assert v6_after - v6 >= 3 and v4_after - v4 < 3, (v4, v4_after, v6, v6_after)
    # IPv4 between them stays on IPv4
    v4, v6 = udp_out(ov, h0)
    assert ov.ping(h0, ov.flannel_ip(h1), count=3)["received"] == 3
    v4_after, v6_after = udp_out(ov, h0)
    assert v4_after - v4 >= 3 and v6_after - v6 < 3, (v4, v4_after, v6, v6_after)
    # the other way, host to pod: IPv6 too
    _, v6 = udp_out(ov, h1)
    assert ping6(h1.netns, str(six["h0"].network_address + 2))["received"] == 3
    assert udp_out(ov, h1)[1] - v6 >= 3

    # TCP and UDP over the IPv6 underlay, with the C engine's IPv6 offloads. Before any ping of
    # full size: a path MTU the pods learned already would shrink the TCP segments from the start
    _ipv6_streams(ov, pod1, pod0, six["h0"].network_address + 2)
    # the TCP sender's first full-sized segments were longer than the route's MTU (1452): its
    # kernel learned the path MTU from our packet too big, and the stream still came intact
    assert ov.metrics(h1).get('flannel_udp_drops_total{reason="too_big"}', 0) > 0

    # the route's MTU over IPv6 (1500 - 48) is below flannel0's (1500 - 28): a packet between
    # the two gets packet too big, from flannel0's IPv6 address
    out = ping6_out(pod0, str(pod1_addr), "-s", "1420", "-M", "do", "-w", "1")
    assert "Packet too big: mtu=1452" in out or "mtu = 1452" in out, out

    # a handover carries the IPv6 sockets: the new daemon sends over IPv6 at once
    new, rc = ov.handover_daemon(h0)
    assert rc == 0 and "No IPv6 underlay" not in new.log_text(), new.log_text()[-2000:]
    v4, v6 = udp_out(ov, h0)
    assert ping6(pod0, str(pod1_addr))["received"] == 3
    v4_after, v6_after = udp_out(ov, h0)
    assert v6_after - v6 >= 3 and v4_after - v4 < 3, (v4, v4_after, v6, v6_after)
    # the routes handed over had the peers' IPv6 underlay: no reply was refused meanwhile
    assert int(ov.metrics(h0).get('flannel_udp_drops_total{reason="bad_source"}', 0)) == 0
