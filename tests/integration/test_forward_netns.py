"""Two hosts, a real TUN each, static routes: ping and TCP across, per engine.

::

    h0 (netns)                                   h1 (netns)
    flannel0 10.5.1.0/32  <-- UDP 8285 -->       flannel0 10.5.2.0/32
    fu..h0 192.168.77.1 ---- bridge (switch netns) ---- fu..h1 192.168.77.2

`flannel-udp forward` runs inside each namespace (so the TUN is created
there) with the route 10.5.0.0/16 dev flannel0 and one static peer route.
Every ping and transfer is bounded in count and time; the testbed (and with
it every process, namespace and TUN) goes away in teardown, also on failure.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest

from tests.conftest import require, require_engine, require_path, require_root
from tests.integration.conftest import require_iperf3
from tests.integration.traffic import (HASHED_BYTES, IPERF_BYTES, hashed_transfer,
                                       iperf_transfer, ping)

pytestmark = [pytest.mark.root, pytest.mark.slow]

NETWORK = "10.5.0.0/16"
A_TUN, B_TUN = "10.5.1.0", "10.5.2.0"



def _require_python_engine():
    require(importlib.util.find_spec("dataplane.engine.pyengine") is not None,
            "the Python engine (dataplane/engine/pyengine.py) is not there yet")


def _require(kind: str) -> None:
    if kind == "python":
        _require_python_engine()
    else:
        require_engine(kind)


@pytest.fixture
def testbed(testbed):
    """The two-host testbed (conftest.py), for tests that also run iperf3."""
    require_iperf3()
    return testbed


def _rtt_avg(out: str) -> float | None:
    m = re.search(r"= [\d.]+/([\d.]+)/", out)
    return float(m.group(1)) if m else None


def _run_pair(tb, engines, report):
    from dataplane.testbed.forwarder import start_static_overlay
    a, b = tb["h0"], tb["h1"]
    fwd = start_static_overlay(tb, engines, network=NETWORK)
    fa, fb = fwd["h0"], fwd["h1"]
    for f, kind in ((fa, engines[0]), (fb, engines[1])):
        assert f.info()["engine"] == ("c" if kind == "kernel" else kind), f.log()
        assert ("kernel" in f.info()) == (kind == "kernel"), f.info()
        link = json.loads(tb.exec(f.host, ["ip", "-j", "link", "show", "flannel0"]).stdout)[0]
        assert link["mtu"] == 1500 - 28, link
        assert "UP" in link["flags"], link

    # ping both ways; TTL 64 - 1 (sender) - 1 (receiver) on each of the two hops = 62
    for src, dst in ((a, B_TUN), (b, A_TUN)):
        r = ping(tb, src, dst)
        assert r.returncode == 0, f"ping {src.name} -> {dst}: {r.stdout}{r.stderr}\n" \
                                  f"h0 log:\n{fa.log()}\nh1 log:\n{fb.log()}"
        assert " 0% packet loss" in r.stdout, r.stdout
        assert "ttl=62" in r.stdout, r.stdout
        report[f"rtt_ms {src.name}->{dst}"] = _rtt_avg(r.stdout)
    # the largest packet that fits flannel0's MTU, don't-fragment
    r = ping(tb, a, B_TUN, "-M", "do", "-s", str(1472 - 28), count=2)
    assert r.returncode == 0, r.stdout + r.stderr

    bps, nbytes = iperf_transfer(tb, a, b, B_TUN)
    assert nbytes >= IPERF_BYTES * 0.95
    report["iperf3 h0->h1 Gbit/s"] = round(bps / 1e9, 3)
    hashed_transfer(tb, b, a, A_TUN)

    mid = fa.stats()
    assert fa.stop() == 0, fa.log()
    assert fb.stop() == 0, fb.log()
    sa, sb = fa.info(), fb.info()
    assert sa["final"] and sb["final"]
    if engines == ("kernel", "kernel"):
        _carried_by_the_programs(sa, sb)
        return report
    sa, sb = sa["stats"], sb["stats"]
    assert sa["udp_tx_packets"] >= mid["udp_tx_packets"]
    for s in (sa, sb):
        for k in ("drop_no_route", "drop_ttl", "drop_malformed", "drop_not_ipv4",
                  "drop_truncated", "drop_bad_source", "drop_tun_error"):
            assert s[k] == 0, (k, s)
        assert s["udp_tx_packets"] > 0 and s["tun_tx_packets"] > 0, s
        assert s["syscalls"] > 0, s
    # h0 -> h1 carried the iperf3 bytes (iperf3 -n counts bytes written to its socket and
    # may close the test with the last ones still queued, so not all of them), and what
    # h1 received came from h0
    assert sa["udp_tx_bytes"] >= IPERF_BYTES * 0.8, sa
    assert sb["udp_rx_bytes"] >= HASHED_BYTES // 2, (sa, sb)
    assert sa["udp_rx_bytes"] >= HASHED_BYTES, (sa, sb)
    assert sb["udp_rx_packets"] <= sa["udp_tx_packets"], (sa, sb)
    assert sa["udp_rx_packets"] <= sb["udp_tx_packets"], (sa, sb)
    # every packet read from the TUN was sent (no drops above), so tx == rx
    assert sa["udp_tx_packets"] + sa["drop_send_error"] == sa["tun_rx_packets"], sa
    # the TUN devices left with their processes
    for h in (a, b):
        r = tb.exec(h, ["ip", "link", "show", "flannel0"])
        assert r.returncode != 0, f"flannel0 still in {h.name}: {r.stdout}"
    return report


def _carried_by_the_programs(sa: dict, sb: dict) -> None:
    """The kernel path on both hosts: the programs sent and delivered it all (the pings, the
    largest packet, both transfers), dropping nothing; the engines behind them carried next
    to nothing (what the programs hand on: none of this traffic should be)."""
    ka, kb = sa["kernel"], sb["kernel"]
    for k, s in ((ka, sa["stats"]), (kb, sb["stats"])):
        assert k["udp_tx_packets"] > 0 and k["tun_tx_packets"] > 0, k
        assert k["drop_bad_source"] == k["drop_inner_local"] == k["tx_drop_helper"] == 0, k
        assert s["udp_tx_packets"] <= max(2, k["udp_tx_packets"] // 100), (k, s)
        assert s["tun_tx_packets"] <= max(2, k["tun_tx_packets"] // 100), (k, s)
    assert ka["udp_tx_bytes"] >= IPERF_BYTES * 0.8, ka
    assert kb["tun_tx_bytes"] >= IPERF_BYTES * 0.8, kb
    assert kb["udp_tx_bytes"] >= HASHED_BYTES and ka["tun_tx_bytes"] >= HASHED_BYTES, (ka, kb)


@pytest.mark.timeout(120)
def test_forward_both_ways(testbed, path_kind):
    require_path(path_kind)
    report = _run_pair(testbed, (path_kind, path_kind), {})
    print(f"{path_kind}<->{path_kind}: {report}")


@pytest.mark.timeout(120)
def test_forward_c_host_with_python_host(testbed):
    require_root()
    _require("c")
    _require("python")
    report = _run_pair(testbed, ("c", "python"), {})
    print(f"c<->python: {report}")


@pytest.mark.timeout(120)
def test_forward_kernel_host_with_engine_host(testbed, engine_kind):
    """The kernel path against an engine alone on the other host (as against flanneld): pings
    and TCP each way. The host's stack leaves TCP checksums to the device and TCP super-packets
    whole: the kernel path makes its veth finish and cut them (host/tunnel_gso.py), or the
    engine on h1 reads wrong checksums and truncated datagrams and no TCP connects."""
    from dataplane.testbed.forwarder import start_static_overlay
    _require(engine_kind)
    require_path("kernel")
    a, b = testbed["h0"], testbed["h1"]
    fwd = start_static_overlay(testbed, ["kernel", engine_kind], network=NETWORK)
    for src, dst in ((a, B_TUN), (b, A_TUN)):
        r = ping(testbed, src, dst)
        assert " 0% packet loss" in r.stdout, r.stdout + r.stderr
    hashed_transfer(testbed, a, b, B_TUN)
    hashed_transfer(testbed, b, a, A_TUN)
    for f in fwd.values():
        assert f.stop() == 0, f.log()
    k, s = fwd["h0"].info()["kernel"], fwd["h0"].info()["stats"]
    assert k["udp_tx_bytes"] >= HASHED_BYTES and k["tun_tx_packets"] > 0, k
    assert s["udp_tx_packets"] <= 2, s      # h0's engine sent nothing of it
    assert fwd["h1"].info()["stats"]["drop_truncated"] == 0


@pytest.mark.timeout(60)
def test_forward_bad_route_exits_nonzero_with_message(testbed):
    """A startup error surfaces: forward exits non-zero and says why."""
    from dataplane.testbed.forwarder import Forwarder
    f = Forwarder(testbed, "h0", tun_addr="10.5.1.0/32", routes=[],
                  engine="auto", extra=["--mtu", "20"])
    with pytest.raises(RuntimeError, match="exited with"):
        f.wait_ready(10)
    assert f.proc.returncode != 0
    assert "--mtu" in f.log() and "68..65535" in f.log(), f.log()


# A datagram from a host that is no route peer: h2 sends, as flanneld's wire
# format, an inner IPv4/UDP packet 10.5.3.7:4000 -> 10.5.1.0:5400 to h0:8285.
_INJECT = r"""
import socket, struct, sys
payload = b"fu-injected"
udp = struct.pack("!HHHH", 4000, 5400, 8 + len(payload), 0) + payload   # UDP checksum 0: none
hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                  socket.inet_aton("10.5.3.7"), socket.inet_aton(sys.argv[2]))
s = sum(struct.unpack("!10H", hdr)); s = (s & 0xffff) + (s >> 16); s = (s & 0xffff) + (s >> 16)
hdr = hdr[:10] + struct.pack("!H", ~s & 0xffff) + hdr[12:]
o = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[3])):
    o.sendto(hdr + udp, (sys.argv[1], 8285))
"""

_LISTEN = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 5400)); s.settimeout(3)
print("listening", flush=True)
try:
    data, src = s.recvfrom(2048); print(src[0], data.decode(), flush=True)
except socket.timeout:
    print("timeout", flush=True)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("accept_from", ["leases", "any"])
def test_accept_from(path_kind, accept_from):
    """The source rule: refused in the kernel on the kernel path (the engine sees nothing),
    by the engine alone otherwise; with any, delivered either way."""
    engine_kind = path_kind
    require_path(path_kind)
    require_root()
    from dataplane.testbed.forwarder import Forwarder
    from dataplane.testbed.hosts import Testbed
    with Testbed(3) as tb:
        h0, h1, h2 = tb.hosts
        f = Forwarder(tb, h0, tun_addr=f"{A_TUN}/32", routes=[f"10.5.2.0/24={h1.ip}"],
                      network=NETWORK, engine=engine_kind, accept_from=accept_from).wait_ready()
        sink = tb.popen(h0, [sys.executable, "-c", _LISTEN, A_TUN])
        assert sink.stdout.readline().startswith("listening")
        r = tb.exec(h2, [sys.executable, "-c", _INJECT, h0.ip, A_TUN, "3"], timeout=20)
        assert r.returncode == 0, r.stderr
        out, _ = sink.communicate(timeout=10)
        assert f.stop() == 0, f.log()
        s = f.stats()
        if path_kind == "kernel":       # the programs decided, the engine saw nothing
            k = f.info()["kernel"]
            assert s["udp_rx_packets"] == 0, s
            assert (k["drop_bad_source"], k["tun_tx_packets"]) == \
                ((3, 0) if accept_from == "leases" else (0, 3)), k
            assert out.split() == (["timeout"] if accept_from == "leases"
                                   else ["10.5.3.7", "fu-injected"]), out
            return
        if accept_from == "leases":
            assert out.strip() == "timeout"
            assert s["drop_bad_source"] == 3 and s["tun_tx_packets"] == 0, s
        else:
            assert out.split() == ["10.5.3.7", "fu-injected"], out
            assert s["drop_bad_source"] == 0 and s["tun_tx_packets"] == 3, s
        assert s["udp_rx_packets"] == 3, s
