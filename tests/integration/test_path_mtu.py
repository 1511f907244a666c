"""Path MTU (issue 44): TCPv6 between pods over a path narrower than the hosts' interfaces, each
underlay, each engine and the kernel path, and no outer packet cut into fragments on the way out.

::

      h0 (engine), pod p                                h1 (engine), pod p
      veth 192.168.77.1 / fd00:99::1, MTU 1500          veth 192.168.79.2 / fd00:79::2, MTU 1500
           |                                                 |
      -----+---- bridge (switch netns, etcd) ---- router ----+---- its own link, 1400 on the
                                                             router's side (testbed/narrow.py)

The router answers a longer packet towards h1 with ICMP fragmentation needed or ICMPv6 packet
too big, and h0's kernel learns the path MTU, 1400. Before the change the engines went on
sending datagrams of flannel0's size, which h0's kernel then cut into fragments (many networks
drop them): now the IPv6 underlay's socket refuses to fragment, and the engine answers the pod's
packet with packet too big, the path MTU less the outer headers (docs/operating.md#dual-stack).
The kernel path's programs send with no socket: the router's error reaches the engine's socket
all the same, the kernel records the path MTU on its route to h1, and the egress program, which
looks that route up for a datagram over it, hands the too-big packets to the engine, which
answers them (docs/kernel-path.md#path-mtu); the rest of the stream the programs carry.
"""
from __future__ import annotations

import ipaddress

import pytest

from dataplane.testbed.narrow import frag_creates, narrow_router_link
from tests.integration.conftest import overlay_of
from tests.streams import hashed_transfer

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.66.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:66::/56",
          "Backend": {"Type": "udp"}}
PATH_MTU = 1400
KERNEL_SENT = 'flannel_udp_packets_total{datapath="kernel",path="udp_tx"}'
KERNEL_SENT_BYTES = 'flannel_udp_bytes_total{datapath="kernel",path="udp_tx"}'
PASSED_PATH_MTU = 'flannel_udp_kernel_passed_total{direction="tx",reason="path_mtu"}'
NBYTES = 4 << 20


@pytest.fixture(params=["ipv6", "ipv4"])
def ov(path_kind, request):
    """h0 and h1, h1 behind the router; with an IPv6 underlay address each (so pods' IPv6 goes
    over IPv6) or none (over IPv4)."""
    on = {"underlay6": request.param == "ipv6"}
    yield from overlay_of(path_kind, [{"engine": path_kind, **on},
                                      {"engine": path_kind, **on, "behind_router": True}],
                          config=CONFIG, ipv6=True)


def pod(ov, h) -> tuple[str, str]:
    """A pod on ``h`` with the second address of its lease's IPv6 part: (netns, address)."""
    six = ipaddress.IPv6Interface(ov.subnet_env(h)["FLANNEL_IPV6_SUBNET"]).network
    addr = str(six.network_address + 2)
    return ov.tb.add_pod(h, "p", f"{addr}/64", str(six.network_address + 1)), addr


def test_tcpv6_over_a_narrower_path_sends_no_fragments(ov, request, figure):
    h0, h1 = ov.hosts
    narrow_router_link(ov.tb, PATH_MTU)
    # h0 forwards IPv4 as every flannel host does (its pods'): the testbed turns on only what its
    # pods need, and the kernel path's route lookup needs it (docs/kernel-path.md#path-mtu)
    ov.tb.exec(h0, ["sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
    pod0, _ = pod(ov, h0)
    pod1, addr1 = pod(ov, h1)
    v6_underlay = request.node.callspec.params["ov"] == "ipv6"
    frags, udp, m0 = frag_creates(h0), ov.tb.udp_out(h0), ov.metrics(h0)
    hashed_transfer(pod0, pod1, addr1, NBYTES)
    sent4, sent6 = (b - a for a, b in zip(udp, ov.tb.udp_out(h0)))
    m = ov.metrics(h0)
    if ov.kind == "kernel":
        # the programs carried the stream and handed the packets over the path MTU on; over
        # the IPv6 underlay the TCP super-packets go to the engine (tx_pass_gso6, each segment
        # needs its own checksum), the programs carry the rest (docs/kernel-path.md)
        sent = m[KERNEL_SENT] - m0.get(KERNEL_SENT, 0)
        sent_bytes = m[KERNEL_SENT_BYTES] - m0.get(KERNEL_SENT_BYTES, 0)
        passed = {k: v for k, v in m.items() if "passed" in k and v}
        print(f"FIGURE kernel {request.node.callspec.params['ov']}: programs sent {sent} "
              f"({sent_bytes} B), passed {passed}")
        # in bytes: a super-packet encapsulated whole counts once, however many segments
        assert sent >= 1 and (v6_underlay or sent_bytes >= NBYTES // 2), (sent, sent_bytes)
        assert m.get(PASSED_PATH_MTU, 0) >= 1, passed
    elif ov.kind != "kernel":
        # the underlay it took: the IPv6 one where both hosts have an address on it
        assert (sent6 if v6_underlay else sent4) >= 100, (sent4, sent6)
    assert frag_creates(h0) == frags, "h0's kernel cut outer packets into fragments"
    # the pod learned the path's MTU from the engine: its route to the peer pod says so
    route = ov.tb.exec(pod0, ["ip", "-6", "route", "get", addr1]).stdout
    inner = PATH_MTU - (48 if v6_underlay else 28)
    assert f"mtu {inner}" in route, route
    too_big = m.get('flannel_udp_drops_total{reason="too_big"}', 0)
    figure(f"{ov.kind}: {NBYTES >> 20} MiB TCPv6 over a {PATH_MTU}-byte path, "
           f"{'IPv6' if v6_underlay else 'IPv4'} underlay",
           f"intact, no fragments; the pod's route says {route.split('mtu')[1].split()[0]}; "
           f"{too_big:.0f} packets too big")
