"""TX offloads on real TUN devices: TSO super-packets in, UDP_SEGMENT trains out.

::

    h0 (netns)                                        h1 (netns)
    TCP source -> flannel0 (IFF_VNET_HDR, TSO4)       flannel0 (plain) -> TCP sink
                  engine: OFF_TUN_VNET|OFF_UDP_GSO     engine: no offloads
                  fu..h0 192.168.77.1 -- bridge --    fu..h1 192.168.77.2
                                                       + packet socket on flannel0

h0's kernel hands its TUN 64 KB TCP super-packets; the C engine cuts them
and sends trains of datagrams in one UDP_SEGMENT message each. Where to look
at "the wire": a capture on the veth would see the GSO trains as one frame
(packet sockets see skbs before segmentation), and a UDP socket of the test
in h1 would leave the TCP stream without ACKs. So h1 runs a plain engine,
which writes every datagram it receives into its TUN as one packet (it
checks tot_len == datagram length, drops nothing here), and a packet socket
on h1's flannel0 records those packets: each is one datagram's payload with
TTL - 1. Every one must be a valid IPv4 packet <= mtu with correct IP and TCP
checksums, and together they must carry the stream that was sent. The same
runs with the Python engine in h0 (no offloads: the kernel segments), the
reference for what the wire must look like.
"""
from __future__ import annotations

import json
import os
import struct
import sys
import time

import pytest

from dataplane.engine.api import OFF_TUN_VNET, OFF_UDP_GSO
from tests import gso_packets as gp
from tests.streams import HASH_SINK, HASH_SOURCE
from tests.conftest import require, require_engine

pytestmark = [pytest.mark.root, pytest.mark.slow]

NETWORK = "10.5.0.0/16"
A_TUN, B_TUN = "10.5.1.0", "10.5.2.0"
PORT = 8285
SINK_PORT = 5300
TRANSFER = 4 << 20
OFF_VNET_GSO = OFF_TUN_VNET | OFF_UDP_GSO



# Records the packets the engine writes into flannel0 (not those the stack
# sends out of it) for one TCP port, until the FIN has been seen and the
# device has been quiet for a moment, or the time is up.
_CAPTURE = r"""
import select, socket, struct, sys, time
ifname, port, out, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(3))
s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)           # SO_RCVBUFFORCE
s.bind((ifname, 0))
print("capturing", flush=True)
pkts, fin_at, end = [], None, time.monotonic() + limit
while time.monotonic() < end and not (fin_at and time.monotonic() - fin_at > 1.0):
    if not select.select([s], [], [], 0.2)[0]:
        continue
    data, addr = s.recvfrom(1 << 16)
    if addr[2] == socket.PACKET_OUTGOING or len(data) < 40 or data[9] != 6:
        continue
    ihl = (data[0] & 15) * 4
    if struct.unpack("!H", data[ihl + 2:ihl + 4])[0] != port:
        continue
    pkts.append(data)
    if data[ihl + 13] & 1:
        fin_at = time.monotonic()
with open(out, "wb") as f:
    for p in pkts:
        f.write(struct.pack("!I", len(p)) + p)
print("captured", len(pkts), flush=True)
"""


class Fwd:
    """tests/integration/offload_fwd.py in a host, with its stats file."""

    def __init__(self, tb, host, peer, engine: str, offloads: int, tun_addr: str,
                 peer_lease: str):
        from dataplane.testbed.forwarder import child_env
        self.tb = tb
        self.stats_file = os.path.join(tb.workdir, f"off-{host.name}.json")
        self.proc = tb.popen(host, [sys.executable, "-m", "tests.integration.offload_fwd",
                                    "--engine", engine, "--offloads", str(offloads),
                                    "--tun-addr", f"{tun_addr}/32", "--network", NETWORK,
                                    "--listen", f"{host.ip}:{PORT}",
                                    "--route", f"{peer_lease}={peer.ip}:{PORT}",
                                    "--stats", self.stats_file], env=child_env())
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            tb.kill(self.proc)
            raise AssertionError(f"forwarder in {host.name} did not start: {line!r} "
                                 f"{self.proc.stderr.read() if self.proc.stderr else ''}")
        self.tun_offload = int(line.split()[1])

    def stop(self) -> dict:
        rc = self.tb.kill(self.proc)
        with open(self.stats_file) as f:
            info = json.load(f)
        assert rc == 0 and info["final"], (rc, info)
        return info


def _start_pair(tb, engine: str, offloads: int):
    a, b = tb["h0"], tb["h1"]
    # the receiver first, so that nothing from h0 is lost while it starts
    fb = Fwd(tb, b, a, engine, 0, B_TUN, "10.5.1.0/24")
    fa = Fwd(tb, a, b, engine, offloads, A_TUN, "10.5.2.0/24")
    return fa, fb


def _transfer(tb, capture_file: str, seed: int):
    a, b = tb["h0"], tb["h1"]
    cap = tb.popen(b, [sys.executable, "-c", _CAPTURE, "flannel0", str(SINK_PORT), capture_file,
                       "30"])
    sink = None
    try:
        assert cap.stdout.readline().startswith("capturing"), cap.stderr.read()
        sink = tb.popen(b, [sys.executable, "-c", HASH_SINK, B_TUN, str(SINK_PORT)])
        assert sink.stdout.readline().startswith("listening"), sink.stderr.read()
        t0 = time.monotonic()
        r = tb.exec(a, [sys.executable, "-c", HASH_SOURCE, B_TUN, str(SINK_PORT), str(TRANSFER),
                        str(seed)], timeout=40)
        secs = time.monotonic() - t0
        assert r.returncode == 0, f"source failed: {r.stderr}"
        out, err = sink.communicate(timeout=30)
        assert out.split() == r.stdout.split(), f"sent {r.stdout!r}, received {out!r} {err}"
        cap_out, cap_err = cap.communicate(timeout=40)
        assert "captured" in cap_out, cap_err
    finally:
        for p in (sink, cap):
            if p is not None:
                tb.kill(p)
    with open(capture_file, "rb") as f:
        raw = f.read()
    pkts, i = [], 0
    while i < len(raw):
        (n,) = struct.unpack("!I", raw[i:i + 4])
        pkts.append(raw[i + 4:i + 4 + n])
        i += 4 + n
    return pkts, secs


@pytest.mark.timeout(150)
def test_tcp_stream_through_tx_offloads(testbed, engine_kind):
    """(a) a few MB of TCP from h0 to h1 arrive intact; (b) with the C engine
    the offloads were really used; (c) every datagram on the wire is one
    valid IPv4/TCP packet <= mtu and the datagrams carry exactly the stream,
    for the offloading C engine as for the Python engine."""
    import random
    if engine_kind == "c":
        require_engine("c")
    offloads = OFF_VNET_GSO if engine_kind == "c" else 0
    fa, fb = _start_pair(testbed, engine_kind, offloads)
    try:
        pkts, secs = _transfer(testbed, os.path.join(testbed.workdir, "cap.bin"), seed=11)
    finally:
        sa, sb = fa.stop()["stats"], fb.stop()["stats"]
    mtu = json.load(open(fb.stats_file))["mtu"]
    assert mtu == 1500 - 28

    data = random.Random(11).randbytes(TRANSFER)
    assert len(pkts) >= TRANSFER // mtu, len(pkts)
    for p in pkts:
        gp.check_wire_packet(p, mtu)
        assert p[9] == gp.PROTO_TCP
    assert gp.reassemble(pkts, dport=SINK_PORT) == data

    for s in (sa, sb):
        for k in ("drop_malformed", "drop_not_ipv4", "drop_truncated", "drop_send_error",
                  "drop_no_route", "drop_ttl", "drop_bad_source", "drop_tun_error"):
            assert s[k] == 0, (k, s)
    # every datagram h0 sent was one packet that h1 wrote into its TUN
    assert sb["udp_rx_packets"] == sb["tun_tx_packets"] <= sa["udp_tx_packets"], (sa, sb)
    assert sa["udp_tx_packets"] == sa["tun_rx_packets"], sa
    if engine_kind == "c":
        assert fa.tun_offload & 0x03 == 0x03, fa.tun_offload      # TUN_F_CSUM|TUN_F_TSO4
        assert sa["tun_rx_gso"] > 0 and sa["udp_tx_gso"] > 0, sa
        # far fewer reads and sends than packets: the point of the offloads
        assert sa["tun_reads"] < sa["tun_rx_packets"] // 2, sa
        assert sa["udp_sends"] < sa["udp_tx_packets"] // 2, sa
    else:
        assert sa["tun_rx_gso"] == sa["udp_tx_gso"] == 0, sa
    print(f"{engine_kind} h0->h1: {len(pkts)} packets, {TRANSFER * 8 / secs / 1e9:.2f} Gbit/s "
          f"(incl. start-up); h0 reads {sa['tun_reads']} sends {sa['udp_sends']} "
          f"tun_rx_gso {sa['tun_rx_gso']} udp_tx_gso {sa['udp_tx_gso']}")


@pytest.mark.timeout(120)
def test_uso_super_packets_from_a_udp_sender(testbed):
    """UDP_SEGMENT on a socket in h0 sending over flannel0: with TUN_F_USO4
    the TUN gets USO super-packets, which the engine cuts; h1 gets every
    datagram with its own length and checksum."""
    require_engine("c")
    fa, fb = _start_pair(testbed, "c", OFF_VNET_GSO)
    try:
        require(fa.tun_offload & 0x20, "kernel without TUN_F_USO4 (Linux >= 6.2)")
        recv = testbed.popen("h1", [sys.executable, "-c", _UDP_SINK, B_TUN, "5400", "40"])
        assert recv.stdout.readline().startswith("listening")
        r = testbed.exec("h0", [sys.executable, "-c", _UDP_GSO_SOURCE, B_TUN, "5400", "40"],
                         timeout=20)
        assert r.returncode == 0, r.stderr
        out, err = recv.communicate(timeout=20)
    finally:
        sa, sb = fa.stop()["stats"], fb.stop()["stats"]
    got = out.split()
    assert got[0] == "40", (out, err)             # 40 trains of 10 datagrams, all there
    assert got[1] == "ok", out
    assert sa["tun_rx_gso"] >= 1 and sa["drop_malformed"] == 0, sa
    assert sa["udp_tx_packets"] >= 400 and sb["tun_tx_packets"] == sb["udp_rx_packets"], (sa, sb)


# 40 sends of 10 x 1000 bytes with UDP_SEGMENT 1000; each datagram names its
# train and index, and the sink checks that each arrived once, whole.
_UDP_GSO_SOURCE = r"""
import socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(17, 103, 1000)                          # SOL_UDP, UDP_SEGMENT
for t in range(int(sys.argv[3])):
    buf = b"".join(struct.pack("!HH", t, i) + bytes([i]) * 996 for i in range(10))
    s.sendto(buf, (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.005)
"""

_UDP_SINK = r"""
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)
s.bind((sys.argv[1], int(sys.argv[2]))); s.settimeout(5)
print("listening", flush=True)
seen, ok, n = set(), True, int(sys.argv[3])
try:
    while len(seen) < n * 10:
        d = s.recv(65536)
        t, i = struct.unpack("!HH", d[:4])
        ok &= len(d) == 1000 and d[4:] == bytes([i]) * 996 and (t, i) not in seen
        seen.add((t, i))
except socket.timeout:
    pass
print(len({t for t, _ in seen if sum(1 for x in seen if x[0] == t) == 10}), "ok" if ok else "bad",
      flush=True)
"""


# The engine's UDP socket on loopback in h0 with two peers: A behind a route
# whose MTU is locked at 1000, B at 127.0.0.1 (MTU 64K). Runs of 1400-byte
# datagrams to each, all queued before the engine starts (full batches).
_PATH_MTU = r"""
import json, socket, subprocess, sys
from dataplane.engine import OFF_UDP_GSO, Route, create_engine
from tests import gso_packets as gp

A = "10.97.0.1"
for cmd in (["ip", "addr", "add", A + "/32", "dev", "lo"],
            ["ip", "route", "replace", "local", A, "dev", "lo", "table", "local", "mtu", "lock",
             "1000"]):
    subprocess.run(cmd, check=True)
tun_engine, tun_test = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
tun_test.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 0))
peers = {}
for name, ip in (("a", A), ("b", "127.0.0.1")):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)
    s.bind((ip, 0))
    s.settimeout(3)
    peers[name] = s
engine = create_engine(sys.argv[1], tun_fd=tun_engine.fileno(), udp_fd=udp.fileno(),
                       tun_addr="10.5.1.0", mtu=1472)
engine.set_offloads(OFF_UDP_GSO if sys.argv[1] == "c" else 0)
engine.set_routes([Route.make("10.5.2.0/24", *peers["a"].getsockname()),
                   Route.make("10.5.3.0/24", *peers["b"].getsockname())])
sent = {"a": [], "b": []}
for i in range(240):
    to = "a" if (i // 20) % 2 == 0 else "b"
    tun_test.send(gp.udp("10.5.1.9", "10.5.2.7" if to == "a" else "10.5.3.7",
                         bytes([i % 256]) * 1372, ident=i))
    sent[to].append([1400, i])
engine.start()
got = {}
for name, s in peers.items():
    got[name] = []
    try:
        while len(got[name]) < len(sent[name]):
            p = s.recv(2000)
            got[name].append([len(p), int.from_bytes(p[4:6], "big")])
    except socket.timeout:
        pass
# A batch's counters are published once its send returns, which can be after its datagrams
# arrived here (seen with the Python engine on a stock Debian: 192 of 240 counted): wait a
# bounded moment for the counts to catch up with what was read from the TUN.
import time
deadline = time.monotonic() + 2
st = engine.stats()
while st["udp_tx_packets"] + st["drop_send_error"] < st["tun_rx_packets"] \
        and time.monotonic() < deadline:
    time.sleep(0.01)
    st = engine.stats()
out = {"sent": sent, "got": got, "stats": st,
       "in_use": engine.offloads_in_use()}
engine.close()
print(json.dumps(out))
"""


@pytest.mark.timeout(60)
def test_one_peers_small_path_mtu_leaves_gso_on(testbed, engine_kind):
    """A train to a peer whose path MTU is below the segment size is refused
    (EMSGSIZE since Linux 6.x, EINVAL before): that train goes again one
    datagram at a time (fragmented by the kernel) and is counted, and the
    other peer keeps getting trains - GSO stays on. Every datagram arrives
    whole at both, with either engine; the Python engine counts nothing."""
    r = testbed.exec("h0", [sys.executable, "-c", _PATH_MTU, engine_kind], timeout=40)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    st, sent = out["stats"], out["sent"]
    assert out["got"] == sent, out["got"]                # [length, IP id], in order
    assert st["udp_tx_packets"] == 240 and st["drop_send_error"] == 0, st
    if engine_kind == "c":
        assert st["udp_gso_fallbacks"] >= 6, st          # A's six runs, each refused
        assert st["udp_tx_gso"] >= 6, st                 # B's six runs, as trains
        assert out["in_use"] == OFF_UDP_GSO
    else:
        assert st["udp_gso_fallbacks"] == st["udp_tx_gso"] == out["in_use"] == 0, st
