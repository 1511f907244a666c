"""The C engine's receive offloads in a real kernel: a TCP transfer whose
segments reach host B as UDP_GRO trains and enter B's TUN as GSO packets.

::

    h0 (A)                                        h1 (B)
    flannel0 10.5.1.0 -- gso-relay :8285 ==trains==> :8285 engine under test -- flannel0 10.5.2.0
                                                            (vnet TUN, UDP_GRO, TUN GRO)
             <------------------------------------- :8286 plain C engine   -- flannel1 (B -> A)
                                                     pod0 10.5.2.1/24 (no checksum, no TSO)
                                                       | veth
                                                     pod netns: eth0 10.5.2.5 (the sink)

A sends each run of equal-sized packets it reads from its TUN in one
sendmsg with UDP_SEGMENT (tests/integration/offload_rx_node.py): the
datagrams on the wire are flanneld's, but B's UDP_GRO socket receives them
as trains - which a plain sender's datagrams do not become on a veth. B's
engine splits them and coalesces the TCP segments into GSO writes that the
kernel must accept and deliver: the data arrives intact (sha256) and the
counters say trains and GSO writes happened. The receiver sits in a "pod"
behind B, as in flannel, and B's end of the pod's veth has checksum and TSO
offloads off: B's kernel must segment each GSO packet and compute every TCP
checksum from the pseudo-header sum we left in it, so a wrong header or
sum loses data (local delivery would trust CHECKSUM_PARTIAL unchecked). B's replies leave through a
second, plain TUN, so the test does not depend on the transmit half of the
offloads (reading a vnet TUN). The same transfer runs without offloads and
through the Python engine, which must give the same data.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from dataplane.engine.api import OFF_TUN_GRO, OFF_TUN_GRO_UDP, OFF_TUN_VNET, OFF_UDP_GRO
from tests.streams import NO_TX_OFFLOADS, hashed_transfer, udp_stream
from tests.conftest import require_engine, wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]

RX_ALL = OFF_TUN_VNET | OFF_UDP_GRO | OFF_TUN_GRO
RX_UDP = RX_ALL | OFF_TUN_GRO_UDP


def _env():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class Node:
    """offload_rx_node.py in a host; stats come at its exit."""

    def __init__(self, tb, host, mode, *args):
        base = os.path.join(tb.workdir, f"rxnode-{host.name}-{mode}")
        self.tb, self.stats_file, self.ready = tb, base + ".json", base + ".ready"
        self.log_file = base + ".log"
        with open(self.log_file, "w") as log:
            self.proc = tb.popen(host, [sys.executable, "-m", "tests.integration.offload_rx_node",
                                        mode, "--stats", self.stats_file, "--ready", self.ready,
                                        *map(str, args)],
                                 stdout=log, stderr=log, env=_env())

    def log(self) -> str:
        with open(self.log_file, errors="replace") as f:
            return f.read()

    def wait_ready(self):
        wait_until(lambda: os.path.exists(self.ready) or self.proc.poll() is not None, 15, 0.05,
                   lambda: f"the node to be ready: {self.log()}")
        assert os.path.exists(self.ready), f"node not ready: {self.log()}"

    def stop(self) -> dict:
        rc = self.tb.kill(self.proc, timeout=10)
        assert rc == 0, f"node exited with {rc}: {self.log()}"
        with open(self.stats_file) as f:
            return json.load(f)


POD_IP, NBYTES = "10.5.2.5", 8 << 20


def _make_pod(tb, b) -> str:
    """A namespace behind B on a veth whose B end computes nothing in
    hardware; returns its name (the caller deletes it)."""
    from dataplane.testbed import netns as ns
    pod = ns.ns_name(tb.run_id, "pod")
    ns.create(pod)
    ns.run_ip(["link", "add", "pod0", "netns", b.netns, "type", "veth", "peer", "eth0",
               "netns", pod])
    ns.run_ip(["-batch", "-"], netns=b.netns, input=(
        "addr add 10.5.2.1/24 dev pod0\nlink set pod0 up\n"))
    ns.run_ip(["-batch", "-"], netns=pod, input=(
        f"addr add {POD_IP}/24 dev eth0\nlink set eth0 up\nlink set lo up\n"
        "route add default via 10.5.2.1\n"))
    r = tb.exec(b, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    assert r.returncode == 0, r.stderr
    r = tb.exec(b, [sys.executable, "-c", NO_TX_OFFLOADS, "pod0"])
    assert r.returncode == 0 and "True" not in r.stdout, r.stdout + r.stderr
    return pod


def _transfer(tb, a, pod) -> None:
    """NBYTES from A to the pod; the sha256 on both ends must agree."""
    hashed_transfer(a.netns, pod, POD_IP, NBYTES)


def _through_b(tb, kind: str, offloads: int, load):
    """A relays with UDP GSO to B's engine under test (kind, offloads),
    which forwards to a pod; runs load(tb, a, pod) and returns (A's relay
    stats, B's stats, what load returned). Everything is removed after."""
    from dataplane.testbed import netns as ns
    a, b = tb["h0"], tb["h1"]
    pod = _make_pod(tb, b)
    nb = Node(tb, b, "rx", "--addr", "10.5.2.0", "--addr2", "10.5.2.2", "--underlay", b.ip,
              "--peer", f"{a.ip}:8285", "--peer-subnet", "10.5.1.0/24", "--offloads", offloads,
              "--engine", kind)
    na = Node(tb, a, "gso-relay", "--addr", "10.5.1.0", "--underlay", a.ip,
              "--peer", f"{b.ip}:8285")
    stopped = False
    try:
        nb.wait_ready()
        na.wait_ready()
        result = load(tb, a, pod)
        sa, sb = na.stop()["relay"], nb.stop()
        stopped = True
    finally:
        if not stopped:
            print("A:", na.log(), "\nB:", nb.log())
            for n in (na, nb):
                tb.kill(n.proc)
        ns.delete(pod)
    return sa, sb, result


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind,offloads", [("c", RX_ALL), ("c", 0), ("python", 0)],
                         ids=["c-rx-offloads", "c-plain", "python-plain"])
def test_tcp_transfer_arrives_through_gro_and_gso(testbed, kind, offloads):
    require_engine("c")
    sa, sb, _ = _through_b(testbed, kind, offloads, _transfer)
    rx, back = sb["rx"], sb["back"]
    # A really sent trains; otherwise this test would prove nothing.
    assert sa["trains"] > 0 and sa["send_errors"] == 0, sa
    assert {k: v for k, v in rx.items() if k.startswith("drop_") and v} == {}, rx
    assert rx["udp_rx_packets"] == rx["tun_tx_packets"] > 0, rx
    assert rx["udp_rx_packets"] <= sa["tun_packets"], (rx, sa)
    assert back["tun_rx_packets"] > 0 and sa["udp_packets"] > 0, (back, sa)
    if offloads:
        # trains received whole, TCP segments written as GSO packets
        assert rx["udp_rx_gro"] > 0 and rx["tun_tx_gso"] > 0, rx
        assert rx["tun_writes"] < rx["tun_tx_packets"], rx
        print(f"\nB: {rx['udp_rx_packets']} datagrams in {rx['udp_recvs']} receives "
              f"({rx['udp_rx_gro']} trains), {rx['tun_writes']} TUN writes "
              f"({rx['tun_tx_gso']} GSO); A sent {sa['trains']} trains of "
              f"{sa['train_datagrams']} datagrams")
    else:
        assert rx["udp_rx_gro"] == rx["tun_tx_gso"] == 0, rx
        assert rx["tun_tx_packets"] == rx["udp_rx_packets"]


# A UDP stream (tests/streams.py's udp_stream), in paced bursts: A's relay is Python, its TUN
# queue of 500 must not overflow.
NDGRAMS, DGRAM, BURST = 3000, 1000, 25


def _udp_stream(tb, a, pod) -> tuple[int, int, int, int]:
    return udp_stream(a.netns, pod, POD_IP, NDGRAMS, DGRAM, BURST)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind,offloads", [("c", RX_UDP), ("python", 0)],
                         ids=["c-udp-runs", "python-plain"])
def test_udp_stream_arrives_through_uso_writes(testbed, kind, offloads):
    """B's engine writes runs of datagrams as UDP GSO packets; B's kernel
    must cut them on the way to a pod (no offloads on its veth) into exactly
    the datagrams A sent: all of them, intact, in order."""
    require_engine("c")
    sa, sb, (got, bad, in_order, distinct) = _through_b(testbed, kind, offloads, _udp_stream)
    rx = sb["rx"]
    assert (bad, in_order, distinct) == (0, 1, got)
    assert got == NDGRAMS, f"{NDGRAMS - got} datagrams lost: A {sa}, B {rx}"
    assert {k: v for k, v in rx.items() if k.startswith("drop_") and v} == {}, rx
    assert sa["trains"] > 0, sa
    if offloads:
        assert rx["tun_tx_gso"] > 0 and rx["tun_writes"] < rx["tun_tx_packets"], rx
        print(f"\nB: {rx['tun_tx_packets']} datagrams in {rx['tun_writes']} TUN writes "
              f"({rx['tun_tx_gso']} UDP GSO); A sent {sa['trains']} trains")
    else:
        assert rx["tun_tx_gso"] == 0, rx
