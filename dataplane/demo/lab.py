"""The demo's bench-top: workloads, a wire tap and small probes, on an :class:`Overlay`.

A flannel host is not where the applications live: they live in containers
whose bridge takes ``FLANNEL_SUBNET`` from subnet.env (``dockerd --bip``). We
do the same with one extra network namespace per host, the *workload*::

    workload ns (fu-<pid>-<seq>-wa)        host A ns (the testbed's h0)
    eth0 10.5.a.2/24  ---- veth ----  fu<tag>wa 10.5.a.1/24  (= FLANNEL_SUBNET)
    default via 10.5.a.1                   ip_forward=1, flannel0, the daemon

so a packet from the workload crosses A's kernel as *forwarded* traffic, as a
container's would, and the kernel route ``<Network> dev flannel0`` is what
hands it to the daemon. With a dual-stack lease (``demo --ipv6``: subnet.env has
FLANNEL_IPV6_SUBNET, ``<part>::1/64``) the workload has IPv6 on and gets
``<part>::2/64`` too, its host's end ``<part>::1`` and IPv6 forwarding, as the
flannel CNI plugin gives a pod both families.

Everything here is started by this module and stopped by PID; the workload
namespaces carry the testbed's run id, so a killed demo's leftovers are swept
by the next testbed (``netns.sweep_stale``). Probes are short Python scripts
run inside a namespace, each bounded in packets and time.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from ..testbed import netns as ns

PY = sys.executable
ECHO_PORT = 7777        # the UDP echo service in B's workload
SINK_PORT = 7778        # the burst sink in B's workload
WORKLOAD_HOST = 2       # workload = <subnet>.2; <subnet>.1 is the bridge side (FLANNEL_SUBNET)


@dataclass
class Workload:
    """A container stand-in: a namespace with one veth into its host."""
    name: str            # "wa" / "wb"
    netns: str
    host: object         # testbed Host
    ip: str              # the workload's address, e.g. 10.5.40.2
    gateway: str         # the host side, FLANNEL_SUBNET's address, e.g. 10.5.40.1
    host_iface: str      # the veth end inside the host namespace
    mtu: int
    ip6: str | None = None       # with a dual-stack lease: <IPv6 part>::2
    procs: list = field(default_factory=list, repr=False)

    def argv(self, argv) -> list[str]:
        return ns.exec_argv(self.netns, list(argv))

    def run(self, argv, timeout: float = 20, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(argv), capture_output=True, text=True,
                              timeout=timeout, **kw)

    def popen(self, argv, out_path: str) -> subprocess.Popen:
        # Own session, output to a file (read after the process is stopped), tracked by PID.
        with open(out_path, "w") as out:
            p = subprocess.Popen(self.argv(argv), stdout=out, stderr=subprocess.STDOUT,
                                 text=True, start_new_session=True)
        self.procs.append(p)
        return p


def add_workload(ov, host, role: str, subnet_env: dict) -> Workload:
    """Create the workload namespace of ``host`` from its subnet.env (as Docker would)."""
    import ipaddress
    bridge = ipaddress.IPv4Interface(subnet_env["FLANNEL_SUBNET"])     # 10.5.a.1/24
    mtu = int(subnet_env["FLANNEL_MTU"])
    ip = str(bridge.network.network_address + WORKLOAD_HOST)
    netns = ns.ns_name(ov.tb.run_id, role)
    host_iface = f"{ns.PREFIX}{ov.tb.tag}{role}"
    bridge6 = subnet_env.get("FLANNEL_IPV6_SUBNET")
    ns.create(netns, disable_ipv6=bridge6 is None)
    w = Workload(role, netns, host, ip, str(bridge.ip), host_iface, mtu)
    try:
        ns.add_veth(host.netns, host_iface, netns, "eth0", mtu=mtu, cidr=bridge.with_prefixlen,
                    peer_cidr=f"{ip}/{bridge.network.prefixlen}", gateway=str(bridge.ip))
        # The host forwards between its workloads and flannel0, like any container host.
        keys = ["net.ipv4.ip_forward=1"]
        if bridge6 is not None:
            w.ip6 = _add_ipv6(host, w, ipaddress.IPv6Interface(bridge6))
            keys.append("net.ipv6.conf.all.forwarding=1")
        for key in keys:
            r = ov.exec(host, ["sysctl", "-qw", key])
            if r.returncode != 0:
                raise RuntimeError(f"{key} on {host.name}: {r.stderr.strip()}")
    except BaseException:
        remove_workload(w)
        raise
    return w


def _add_ipv6(host, w: Workload, bridge6) -> str:
    """The workload's IPv6 address (<part>::2) and default route via its host's end (<part>::1),
    without duplicate address detection (the two ends are alone on the link)."""
    ip6 = str(bridge6.network.network_address + WORKLOAD_HOST)
    plen = bridge6.network.prefixlen
    ns.run_ip(["addr", "add", f"{bridge6.ip}/{plen}", "dev", w.host_iface, "nodad"],
              netns=host.netns)
    ns.run_ip(["-batch", "-"], netns=w.netns, input=(
        f"addr add {ip6}/{plen} dev eth0 nodad\n"
        f"route add default via {bridge6.ip} dev eth0\n"))
    return ip6


def stop_procs(w: Workload) -> None:
    for p in w.procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(3)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(3)
    w.procs.clear()


def remove_workload(w: Workload) -> None:
    """Stop its processes (by PID) and delete its namespace (the veth pair goes with it)."""
    stop_procs(w)
    if ns.exists(w.netns):
        ns.delete(w.netns)


# -- probes (run inside a namespace; each bounded in packets and time) -----------------------

UDP_ECHO = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
s.settimeout(0.5)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    try:
        data, peer = s.recvfrom(65535)
    except TimeoutError:
        continue
    s.sendto(data, peer)                       # echo: same bytes back
    print("echo", peer[0], peer[1], len(data), flush=True)
"""

UDP_CLIENT = r"""
import json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 0))
s.settimeout(2.0)
data = sys.argv[3].encode()
t0 = time.monotonic()
s.sendto(data, (sys.argv[1], int(sys.argv[2])))
out = {"sent": len(data), "sport": s.getsockname()[1]}
try:
    reply, peer = s.recvfrom(65535)
    out.update(received=len(reply), rtt_ms=(time.monotonic() - t0) * 1e3, same=reply == data)
except TimeoutError:
    out.update(received=0)
print(json.dumps(out))
"""

SINK = r"""
import json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind(("0.0.0.0", int(sys.argv[1])))
print(json.dumps({"ready": True}), flush=True)
n = nbytes = 0
end = time.monotonic() + float(sys.argv[2])
s.settimeout(0.2)
while time.monotonic() < end:
    try:
        data = s.recv(65535)
    except TimeoutError:
        continue
    n += 1; nbytes += len(data)
    print(json.dumps({"received": n, "bytes": nbytes}), flush=True)
"""

BURST = r"""
import json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
dst = (sys.argv[1], int(sys.argv[2])); count = int(sys.argv[3]); size = int(sys.argv[4])
burst = int(sys.argv[5]); gap = float(sys.argv[6])
data = bytes(size)
t0 = time.monotonic(); sent = 0
while sent < count and time.monotonic() - t0 < 10:
    for _ in range(min(burst, count - sent)):
        s.sendto(data, dst); sent += 1
    time.sleep(gap)
print(json.dumps({"sent": sent, "seconds": time.monotonic() - t0}))
"""

# The wire tap: an AF_PACKET socket on a veth sees every frame that leaves or
# enters it, as the kernel hands it to the driver - the outer datagram as it
# really is, not as we think it should be.
SNIFFER = r"""
import json, select, socket, struct, sys, time
iface, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
# With a 4th argument (addresses, comma-separated): any IPv4 packet between two of them instead
# of UDP to/from the port (the direct path: the workloads' own packets, not wrapped in UDP).
hosts = set(sys.argv[4].split(",")) if len(sys.argv) > 4 else None
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL: outgoing too
s.bind((iface, 0))
print(json.dumps({"ready": True}), flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    if not select.select([s], [], [], 0.2)[0]:
        continue
    frame, addr = s.recvfrom(65535)
    ip = frame[14:] if addr[1] == 0x0800 and len(frame) > 14 else b""
    ihl = (ip[0] & 15) * 4 if ip else 0
    if hosts is not None:
        if len(ip) < 20 or socket.inet_ntoa(ip[12:16]) not in hosts \
                or socket.inet_ntoa(ip[16:20]) not in hosts:
            continue
    else:
        if len(ip) < 28 or ip[9] != 17:
            continue
        sport, dport = struct.unpack("!HH", ip[ihl:ihl + 4])
        if port not in (sport, dport):
            continue
    print(json.dumps({"t": time.monotonic(), "pkttype": addr[2], "frame_len": len(frame),
                      "hex": frame[:14 + ihl + 8 + 64].hex()}), flush=True)
"""


def wait_file_line(path: str, text: str, timeout: float = 5.0, proc=None) -> bool:
    """True once ``path`` holds a line containing ``text`` (a probe said it is ready)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(path) as f:
                if text in f.read():
                    return True
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def json_lines(path: str) -> list:
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


class Tap:
    """The SNIFFER running in a host namespace on its underlay veth; output to a file."""

    def __init__(self, ov, host, port: int, path: str, seconds: float = 60.0, between=()):
        """``between``: addresses; if given, the tap keeps any IPv4 packet between two of them
        (the workloads' own packets, on the direct path) instead of UDP on ``port``."""
        self.ov, self.path = ov, path
        out = open(path, "w")
        argv = [PY, "-c", SNIFFER, host.iface, str(port), str(seconds)]
        if between:
            argv.append(",".join(between))
        try:
            self.proc = ov.tb.popen(host, argv, stdout=out, stderr=subprocess.STDOUT)
        finally:
            out.close()
        if not wait_file_line(path, '"ready"', proc=self.proc):
            raise RuntimeError(f"wire tap on {host.iface} did not start: {self.text()[-500:]}")

    def text(self) -> str:
        try:
            with open(self.path) as f:
                return f.read()
        except OSError:
            return ""

    def frames(self) -> list:
        return json_lines(self.path)

    def stop(self) -> list:
        self.ov.tb.kill(self.proc, timeout=3)
        return [f for f in self.frames() if "hex" in f]
