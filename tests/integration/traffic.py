"""Traffic that integration tests send between testbed hosts: ping, iperf3, a hashed TCP
stream, a UDP probe. Shared here so that test modules never import each other.

Every server is waited for until it listens (bounded in time), never for a fixed sleep,
and killed by PID when the caller is done, also when the test fails.
"""
from __future__ import annotations

import contextlib
import json
import sys

from tests.conftest import wait_until
from tests.streams import HASH_SINK, HASH_SOURCE

IPERF_BYTES = 20 << 20       # iperf3 bytes of one transfer
HASHED_BYTES = 4 << 20       # bytes of the python stream whose hash is checked at both ends
IPERF_PORT = 5201
READY_TIMEOUT = 10.0         # s for a server to start listening


def ping(tb, host, dst, *extra, count=5):
    return tb.exec(host, ["ping", "-n", "-c", str(count), "-i", "0.2", "-W", "2", "-w", "10",
                          *extra, dst], timeout=20)


def tcp_listening(tb, host, port: int) -> bool:
    r = tb.exec(host, ["ss", "-Hltn", f"sport = :{port}"], timeout=10)
    return bool(r.stdout.strip())


@contextlib.contextmanager
def iperf3_server(tb, host, bind: str, port: int = IPERF_PORT):
    """A one-shot iperf3 server in `host` on bind:port, yielded once it listens."""
    srv = tb.popen(host, ["iperf3", "-s", "-1", "-B", bind, "-p", str(port)], text=True)
    try:
        wait_until(lambda: tcp_listening(tb, host, port) or srv.poll() is not None,
                   READY_TIMEOUT, 0.05, f"the iperf3 server to listen on {bind}:{port}")
        assert srv.poll() is None, f"iperf3 server exited: {srv.communicate()}"
        yield srv
    finally:
        tb.kill(srv)


def iperf_transfer(tb, client, server, dst, nbytes: int = IPERF_BYTES):
    """`nbytes` client -> server over iperf3; returns (receiver bit/s, bytes the sender sent)."""
    with iperf3_server(tb, server, dst):
        r = tb.exec(client, ["iperf3", "-c", dst, "-p", str(IPERF_PORT), "-n", str(nbytes), "-J",
                             "--connect-timeout", "3000"], timeout=40)
    # iperf3 -J may exit 0 on errors: the JSON's "error" says so
    res = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {"error": r.stderr}
    assert r.returncode == 0 and "error" not in res and "sum_received" in res.get("end", {}), \
        f"iperf3 failed ({r.returncode}): {res.get('error')} {r.stderr}"
    # with -n the receiver's summary may close before the last bytes: use the sender's count
    return res["end"]["sum_received"]["bits_per_second"], res["end"]["sum_sent"]["bytes"]


def hashed_transfer(tb, src_host, dst_host, dst_ip, nbytes: int = HASHED_BYTES):
    """`nbytes` over TCP src -> dst; fails unless both ends saw the same length and hash."""
    sink = tb.popen(dst_host, [sys.executable, "-c", HASH_SINK, dst_ip, "5300"])
    try:
        line = sink.stdout.readline()
        assert line.startswith("listening"), f"sink did not start: {line!r} {sink.stderr.read()}"
        r = tb.exec(src_host, [sys.executable, "-c", HASH_SOURCE, dst_ip, "5300", str(nbytes)],
                    timeout=40)
        assert r.returncode == 0, f"source failed: {r.stderr}"
        out, err = sink.communicate(timeout=30)
        assert out.split() == r.stdout.split(), f"sent {r.stdout!r}, received {out!r} {err}"
    finally:
        tb.kill(sink)


# One datagram to port 9 of `dst`; prints what came back: "data", "timeout" or the errno name
# (IP_RECVERR turns an ICMP net unreachable into ENETUNREACH on the socket).
UDP_PROBE = r"""
import errno, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 11, 1)          # IP_RECVERR: report ICMP net unreachable
s.settimeout(float(sys.argv[2]))
s.connect((sys.argv[1], 9))
s.send(b"probe")
try:
    s.recv(100)
    print("data")
except TimeoutError:
    print("timeout")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
"""


def udp_probe(ov, host, dst, timeout=3.0) -> str:
    r = ov.exec(host, [sys.executable, "-c", UDP_PROBE, dst, str(timeout)], timeout=timeout + 15)
    return r.stdout.strip()


# A paced, bounded stream from a workload: every datagram from a new socket (a new source
# port, so a new conntrack entry that the NAT rules must see afresh; an old entry would keep
# its NAT after the rules went), each waiting for its echo. One JSON line per datagram.
STREAM = r"""
import json, os, socket, sys, time
dst, port, gap, stop, max_n, max_s = (sys.argv[1], int(sys.argv[2]), float(sys.argv[3]),
                                      sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
end = time.monotonic() + max_s
seq = 0
while seq < max_n and time.monotonic() < end and not os.path.exists(stop):
    t = time.monotonic()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(gap * 4)
    s.sendto(b"%d" % seq, (dst, port))
    try:
        ok = s.recv(64) == b"%d" % seq
    except OSError:
        ok = False
    s.close()
    print(json.dumps({"seq": seq, "at": time.time(), "ok": ok}), flush=True)
    seq += 1
    time.sleep(max(0.0, t + gap - time.monotonic()))
"""
