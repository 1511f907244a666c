"""Scripts the integration tests run inside namespaces to move a TCP stream
and prove it arrived intact (length and sha256 on both ends).

Run as ``python -c HASH_SINK IP PORT [TIMEOUT]``: prints ``listening``, then,
after one connection closed, ``<bytes> <sha256>``.
``python -c HASH_SOURCE IP PORT NBYTES [SEED] [TIMEOUT]``: sends NBYTES of
seeded random data and prints the same line for what it sent. IP is IPv4 or IPv6.
``python -c NO_TX_OFFLOADS DEV``: turns off DEV's transmit checksum and segmentation
offloads, so that the kernel segments and checksums in software what it sends through DEV
(a GSO packet of ours with a wrong header or pseudo-header sum then loses data); prints
what is left on.
``hashed_transfer`` runs the two between namespaces and checks the lines agree.
``udp_stream`` sends numbered datagrams, each with its CRC, from one namespace to a sink in
another that checks every payload and says what came, in which order.
"""
import subprocess
import sys

from dataplane.testbed import netns as ns

HASH_SINK = r"""
import hashlib, socket, sys
timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 20
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(timeout)
print("listening", flush=True)
c, _ = s.accept(); c.settimeout(timeout)
h = hashlib.sha256(); n = 0
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    h.update(b); n += len(b)
print(n, h.hexdigest(), flush=True)
"""

HASH_SOURCE = r"""
import hashlib, random, socket, sys
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 7
timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 20
data = random.Random(seed).randbytes(int(sys.argv[3]))
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=timeout)
s.sendall(data); s.close()
print(len(data), hashlib.sha256(data).hexdigest(), flush=True)
"""

NO_TX_OFFLOADS = r"""
import sys
from pyroute2 import Ethtool
e = Ethtool(); f = e.get_features(sys.argv[1])
for k in ("tx-checksum-ip-generic", "tx-tcp-segmentation", "tx-tcp6-segmentation",
          "tx-generic-segmentation"):
    if k in f.features:
        f.features[k].enable = False
e.set_features(sys.argv[1], f)
f = e.get_features(sys.argv[1])
print({k: f.features[k].enable for k in ("tx-checksum-ip-generic", "tx-tcp-segmentation",
                                         "tx-tcp6-segmentation") if k in f.features})
"""


def hashed_transfer(src_netns: str, dst_netns: str, dst_ip: str, nbytes: int,
                    port: int = 5300) -> None:
    """nbytes over one TCP connection from src_netns to dst_ip:port in dst_netns; the length
    and sha256 on both ends must agree."""
    sink = subprocess.Popen(ns.exec_argv(dst_netns, [sys.executable, "-c", HASH_SINK, dst_ip,
                                                     str(port), "30"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert sink.stdout.readline().startswith("listening"), sink.stderr.read()
        r = subprocess.run(ns.exec_argv(src_netns, [sys.executable, "-c", HASH_SOURCE, dst_ip,
                                                    str(port), str(nbytes), "7", "30"]),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"source failed: {r.stderr}"
        out, err = sink.communicate(timeout=30)
        assert out.split() == r.stdout.split(), f"sent {r.stdout!r}, received {out!r} {err}"
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait(5)


UDP_SOURCE = r"""
import socket, sys, time, zlib
n, size, burst = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET, socket.SOCK_DGRAM)
for i in range(n):
    body = bytes([i % 251]) * (size - 16)
    s.sendto(b"%08d%08x" % (i, zlib.crc32(body)) + body, (sys.argv[1], int(sys.argv[2])))
    if i % burst == burst - 1:
        time.sleep(0.003)
print(n, flush=True)
"""
UDP_SINK = r"""
import socket, sys, zlib
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)          # SO_RCVBUFFORCE
s.bind((sys.argv[1], int(sys.argv[2]))); s.settimeout(3)
print("listening", flush=True)
seqs, bad = [], 0
try:
    while True:
        b = s.recv(65535)
        s.settimeout(float(sys.argv[3]))
        seq, crc, body = int(b[:8]), int(b[8:16], 16), b[16:]
        ok = zlib.crc32(body) == crc and body == bytes([seq % 251]) * len(body)
        bad += not ok
        seqs.append(seq)
except socket.timeout:
    pass
print(len(seqs), bad, int(seqs == sorted(seqs)), len(set(seqs)), flush=True)
"""


def udp_stream(src_netns: str, dst_netns: str, dst_ip: str, n: int, size: int, burst: int,
               port: int = 5400, idle: float = 1.0) -> tuple[int, int, int, int]:
    """n datagrams of size bytes from src_netns to dst_ip:port in dst_netns, a pause of 3 ms
    after each burst; the sink stops once nothing came for idle seconds. Returns (received,
    bad payloads, 1 if in order, distinct)."""
    sink = subprocess.Popen(ns.exec_argv(dst_netns, [sys.executable, "-c", UDP_SINK, dst_ip,
                                                     str(port), str(idle)]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert sink.stdout.readline().startswith("listening"), sink.stderr.read()
        r = subprocess.run(ns.exec_argv(src_netns, [sys.executable, "-c", UDP_SOURCE, dst_ip,
                                                    str(port), str(n), str(size), str(burst)]),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"source failed: {r.stderr}"
        out, err = sink.communicate(timeout=30)
        assert len(out.split()) == 4, f"sink said {out!r} {err}"
        return tuple(map(int, out.split()))
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait(5)
