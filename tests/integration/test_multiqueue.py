"""Several queues between two real hosts, and the offload probe on this kernel.

::

    h0 (netns) flannel0 10.5.1.0/32, 2 queues  <-- UDP 8285 (2 sockets each) -->  h1 (netns)

`flannel-udp forward --queues 2` in each namespace, both engines. Ping and a
TCP transfer cross; then many parallel flows, which the kernel spreads over
flannel0's two queues on the way out and the sockets' steering program over
the two sockets on the way in: every queue's engine must have moved packets,
in both directions. Everything is bounded in count and time; the testbed (and
its processes, namespaces and TUNs) goes away in teardown, also on failure.

The offload probe runs `forward --offload auto` without traffic (in this
branch the C loop does not read vnet headers yet) and checks that the flags
it reports agree with each other and with the device's features in the kernel.
"""
from __future__ import annotations

from dataplane.engine.api import OFF_TUN_VNET

import json
import sys

import pytest

from tests.conftest import require_engine, require_root
from tests.integration.conftest import require_iperf3
from tests.integration.traffic import hashed_transfer, iperf_transfer, ping

pytestmark = [pytest.mark.root, pytest.mark.slow]

NETWORK = "10.5.0.0/16"
A_TUN, B_TUN = "10.5.1.0", "10.5.2.0"
FLOWS = 16                   # UDP flows h0 -> h1, distinct source ports
PER_FLOW = 20

# FLOWS x PER_FLOW datagrams from FLOWS connected sockets (one source port each), paced a little.
_FLOWS = r"""
import socket, sys, time
dst, port, flows, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(flows)]
for s in socks:
    s.connect((dst, port))      # connect(): even, neighbouring source ports, as TCP gets
for r in range(per):
    for s in socks:
        s.send(b"flow")
    time.sleep(0.002)
print("sent", flows * per, flush=True)
"""

_SINK = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], int(sys.argv[2])))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
s.settimeout(3); print("listening", flush=True)
srcs = {}
try:
    while True:
        _, src = s.recvfrom(2048); srcs[src[1]] = srcs.get(src[1], 0) + 1
except socket.timeout:
    pass
print(sum(srcs.values()), len(srcs), flush=True)
"""

_FEATURES = r"""
import json, sys
from pyroute2.ethtool import Ethtool
e = Ethtool()
f = e.get_features(sys.argv[1]).features
print(json.dumps({k: bool(f[k].enable) for k in ("tx-tcp-segmentation", "tx-tcp6-segmentation",
                                                  "tx-udp-segmentation", "tx-checksum-ip-generic")
                  if k in f}))
e.close()
"""


@pytest.fixture
def testbed(testbed):
    """The two-host testbed (conftest.py), for tests that also run iperf3."""
    require_iperf3()
    return testbed


def _queues_of(tb, host, dev="flannel0"):
    r = tb.exec(host, ["ls", f"/sys/class/net/{dev}/queues"])
    return sorted(r.stdout.split())


def _udp_flows(tb, src, dst_host, dst_ip):
    sink = tb.popen(dst_host, [sys.executable, "-c", _SINK, dst_ip, "5400"])
    try:
        assert sink.stdout.readline().startswith("listening"), sink.stderr.read()
        r = tb.exec(src, [sys.executable, "-c", _FLOWS, dst_ip, "5400", str(FLOWS),
                          str(PER_FLOW)], timeout=30)
        assert r.returncode == 0, r.stderr
        out, err = sink.communicate(timeout=15)
        got, flows = map(int, out.split())
        # UDP over a paced, uncongested path: nothing should be lost
        assert (got, flows) == (FLOWS * PER_FLOW, FLOWS), (out, err)
    finally:
        tb.kill(sink)


@pytest.mark.timeout(150)
def test_two_queues_carry_ping_tcp_and_spread_flows(testbed, engine_kind):
    require_engine(engine_kind)
    from dataplane.testbed.forwarder import start_static_overlay
    tb = testbed
    a, b = tb["h0"], tb["h1"]
    fwd = start_static_overlay(tb, engine_kind, network=NETWORK, extra=["--queues", "2"])
    fa, fb = fwd["h0"], fwd["h1"]
    for f in (fa, fb):
        info = f.info()
        assert info["engine"] == engine_kind and info["queues"] == 2, f.log()
        # the default, --offload auto: the C engine takes what this kernel offers (and so
        # this test forwards with queues and offloads together); Python has none
        if engine_kind == "c":
            assert info["offload"]["flags"] & OFF_TUN_VNET, info["offload"]
        else:
            assert info["offload"]["flags"] == 0, info["offload"]
        assert _queues_of(tb, f.host) == ["rx-0", "rx-1", "tx-0", "tx-1"]
        r = tb.exec(f.host, ["ss", "-Hlun", "sport = :8285"])
        assert len(r.stdout.strip().splitlines()) == 2, r.stdout    # two sockets, one port

    for src, dst in ((a, B_TUN), (b, A_TUN)):
        r = ping(tb, src, dst)
        assert r.returncode == 0 and " 0% packet loss" in r.stdout, \
            f"{r.stdout}{r.stderr}\nh0:\n{fa.log()}\nh1:\n{fb.log()}"
        assert "ttl=62" in r.stdout, r.stdout
    iperf_transfer(tb, a, b, B_TUN)
    hashed_transfer(tb, b, a, A_TUN)
    _udp_flows(tb, a, b, B_TUN)

    assert fa.stop() == 0, fa.log()
    assert fb.stop() == 0, fb.log()
    ia, ib = fa.info(), fb.info()
    assert ia["final"] and ib["final"]
    qa, qb = ia["queue_stats"], ib["queue_stats"]
    # Out of h0: the kernel spread the flows over both TUN queues, and each queue's
    # engine sent what it read. Into h1: the steering program spread them over both
    # sockets, and each engine wrote what it received.
    for i in range(2):
        assert qa[i]["tun_rx_packets"] > 0 and qa[i]["udp_tx_packets"] > 0, (i, qa)
        assert qb[i]["udp_rx_packets"] > 0 and qb[i]["tun_tx_packets"] > 0, (i, qb)
    for info in (ia, ib):
        st = info["stats"]
        assert st == {k: sum(q[k] for q in info["queue_stats"]) for k in st}
        for k in ("drop_no_route", "drop_ttl", "drop_malformed", "drop_not_ipv4",
                  "drop_truncated", "drop_bad_source", "drop_tun_error"):
            assert st[k] == 0, (k, st)
    assert ia["stats"]["udp_tx_packets"] + ia["stats"]["drop_send_error"] == \
        ia["stats"]["tun_rx_packets"]
    for h in (a, b):
        assert tb.exec(h, ["ip", "link", "show", "flannel0"]).returncode != 0


@pytest.mark.timeout(90)
def test_offload_probe_is_consistent_with_the_kernel(testbed, engine_kind):
    """--offload auto: what forward reports matches the device; no traffic (see the docstring)."""
    require_engine(engine_kind)
    from dataplane.engine.api import OFF_TUN_GRO, OFF_TUN_GRO_UDP, OFF_TUN_VNET, OFF_UDP_GRO, OFF_UDP_GSO
    from dataplane.testbed.forwarder import Forwarder
    tb = testbed
    results = {}
    for mode in ("auto", "off"):
        f = Forwarder(tb, "h0", tun_addr=f"{A_TUN}/32", routes=[f"10.5.2.0/24={tb['h1'].ip}"],
                      network=NETWORK, engine=engine_kind,
                      extra=["--queues", "2", "--offload", mode]).wait_ready()
        try:
            off = f.info()["offload"]
            r = tb.exec("h0", [sys.executable, "-c", _FEATURES, "flannel0"])
            assert r.returncode == 0, r.stderr
            results[mode] = (off, json.loads(r.stdout), f.log())
        finally:
            assert f.stop() == 0, f.log()
    off, feats, log = results["off"]
    assert off["flags"] == 0 and not any(off["enabled"].values()) and "--offload off" in log
    assert not feats["tx-tcp-segmentation"], feats
    off, feats, log = results["auto"]
    on, flags = off["enabled"], off["flags"]
    if engine_kind == "python":
        assert flags == 0 and not any(on.values()), off
        assert "python engine has no offloads" in log, log
        assert not feats["tx-tcp-segmentation"], feats
        return
    # the C engine on this kernel (>= 5.0 for UDP GRO): the flags agree with each other ...
    assert "Offloads (--offload auto): on:" in log, log
    assert on["tun_vnet"] and bool(flags & OFF_TUN_VNET)
    assert on["udp_gso"] == bool(flags & OFF_UDP_GSO) and on["udp_gro"] == bool(flags & OFF_UDP_GRO)
    assert on["udp_gso"] and on["udp_gro"], off
    assert on["tun_gro"] == bool(flags & OFF_TUN_GRO) == (on["tun_vnet"] and on["tun_tso"])
    assert on["tun_gro_udp"] == bool(flags & OFF_TUN_GRO_UDP) == (on["tun_gro"] and on["tun_uso"])
    assert not on["tun_uso"] or on["tun_tso"], off          # USO is only tried with TSO
    assert on["tun_tso"] == ("tun_tso" not in off["refused"]), off
    # ... and with what the kernel made of the device
    assert feats["tx-tcp-segmentation"] == on["tun_tso"] == feats["tx-tcp6-segmentation"], feats
    if "tx-udp-segmentation" in feats:
        assert feats["tx-udp-segmentation"] == on["tun_uso"], (feats, off)
    assert feats["tx-checksum-ip-generic"] == on["tun_csum"], feats


@pytest.mark.timeout(120)
def test_daemon_queues_trace_and_metrics(engine_kind):
    """`run --queues 2`: two queues, summed counters and the new families in /metrics;
    with --trace the daemon runs one queue and says so."""
    from tests.conftest import require_etcd
    require_root()
    require_etcd()
    require_engine(engine_kind)
    from dataplane.testbed.overlay import Overlay
    with Overlay(hosts=0, engine=engine_kind, daemon_args=("--queues", "2")) as ov:
        a = ov.add_host(wait=False)
        b = ov.add_host(args=("--trace",), wait=False)
        for h in (a, b):
            ov.wait_ready(h)
        assert ov.reachable(a, ov.flannel_ip(b), 15), ov.daemon(a).log_text()
        r = ov.ping(a, ov.flannel_ip(b), count=5)
        assert r["received"] == 5, r
        ma, mb = ov.metrics(a), ov.metrics(b)
        assert ma["flannel_udp_queues"] == 2 and mb["flannel_udp_queues"] == 1, (ma, mb)
        assert _queues_of(ov.tb, a) == ["rx-0", "rx-1", "tx-0", "tx-1"]
        assert _queues_of(ov.tb, b) == ["rx-0", "tx-0"]
        assert "--trace: running 1 queue instead of 2" in ov.daemon(b).log_text()
        # the default, --offload auto: C probes and uses the kernel's offloads, Python has none
        log_a = ov.daemon(a).log_text()
        if engine_kind == "c":
            assert "Offloads (--offload auto): on:" in log_a, log_a
            assert ma['flannel_udp_offload_enabled{offload="tun_tso"}'] == 1, ma
        else:
            assert "Offloads: none (the python engine has no offloads" in log_a, log_a
            for m in (ma, mb):
                assert m['flannel_udp_offload_enabled{offload="tun_tso"}'] == 0, m
                assert m['flannel_udp_offload_ops_total{op="tun_rx_gso"}'] == 0, m
        # five echo requests out of A, and their replies into it, over both of its queues
        assert ma['flannel_udp_packets_total{path="udp_tx"}'] >= 5, ma
        assert ma['flannel_udp_packets_total{path="tun_tx"}'] >= 5, ma
        # the trace (B's single queue) saw the requests arrive
        kinds = [e["kind"] for e in ov.trace_events(b)]
        assert "udp_recv" in kinds and "tun_write" in kinds, kinds
