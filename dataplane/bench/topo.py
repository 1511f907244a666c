"""The bench's two hosts on the project's testbed, pinned and steered.

::

    host A (testbed h0, CPU0)                      host B (testbed h1, CPU1)
    lo 10.5.1.1/32  <- generator, rr client,       lo 10.5.2.1/32  <- sink, echo,
                       iperf3 client                                  iperf3 server
    <path: direct route | flannel.1 | flannel0>    <path ...>
    veth 192.168.77.1  --- bridge (switch ns) ---  veth 192.168.77.2

Each host's application address lives on its loopback, so that the same
source and destination (10.5.1.1 -> 10.5.2.1) cross every path; only the
route to the peer's /24 changes (see paths.py). A run with an inner-IPv6 path
(``c6``, ``python6``, ``vxlan6``) gives each host an IPv6 one too, on its lo alone
(fc00:5:0:1::1 -> fc00:5:0:2::1, in the hosts' IPv6 subnets as a dual-stack
lease gives them): the other devices keep IPv6 off, as the testbed leaves them,
so that no router or neighbour solicitation crosses a path being measured.
Host A's processes run on CPU0, host B's on CPU1, and receive packet steering (RPS) sends each
host's veth (and overlay device) to the same core, so that each simulated
host has a core of its own. The switch-side end of each veth - where the
bridge forwards what the host sent - is steered to the *receiving* host's
core: that keeps the bridge (the wire) off the sender's core, where it would
cost one cross-CPU interrupt per packet (perf/README.md#pinning).
With ``forwarders_together`` (``flannel-udp bench --forwarders-together``) both hosts' forwarder
processes run on host B's core instead, so that host A's core is the generator's and its
kernel's alone: where host A's core is the limit of the default layout (every rate a lower
bound), the forwarders become it (perf/README.md#forwarders-together).

Nothing here touches the caller's namespace: the testbed keeps the underlay
inside its namespaces, and every process is started through it (tracked by
PID, killed on close).
"""
from __future__ import annotations

import ipaddress
import logging
import os
import subprocess

from dataplane.control.config import DEFAULT_UDP_PORT
from dataplane.testbed.hosts import Testbed

log = logging.getLogger(__name__)

NETWORK = ipaddress.IPv4Network("10.5.0.0/16")
# The IPv6Network of a dual-stack config; each host's IPv6 part is a /64 of it, as flannel's
# default IPv6 SubnetLen.
NETWORK6 = ipaddress.IPv6Network("fc00:5::/56")
SINK_PORT = 9000
ECHO_PORT = 9001
IPERF_PORT = 5201
FLANNEL_PORT = DEFAULT_UDP_PORT


class TopoError(RuntimeError):
    pass


def subnet(index: int) -> ipaddress.IPv4Network:
    """Host i's overlay subnet: 10.5.(i+1).0/24, as a flannel lease."""
    return ipaddress.IPv4Network(f"10.5.{index + 1}.0/24")


def subnet6(index: int) -> ipaddress.IPv6Network:
    """Host i's IPv6 part of a dual-stack lease: fc00:5:0:(i+1)::/64."""
    return ipaddress.IPv6Network(f"fc00:5:0:{index + 1:x}::/64")


class Side:
    """One simulated host of the bench, with the core it is pinned to."""

    def __init__(self, topo: "BenchTopo", host, cpu: int):
        self.topo = topo
        self.host = host
        self.cpu = cpu
        self.subnet = subnet(host.index)
        self.app_ip = str(self.subnet.network_address + 1)   # on lo
        self.tun_ip = str(self.subnet.network_address)       # flannel0 / flannel.1 address
        self.subnet6 = subnet6(host.index)
        self.app_ip6 = str(self.subnet6.network_address + 1)
        self.tun_ip6 = str(self.subnet6.network_address)     # as the daemon's, a /128

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def ip(self) -> str:
        return self.host.ip

    @property
    def iface(self) -> str:
        return self.host.iface

    @property
    def forwarder_cpu(self) -> int:
        """The core this host's forwarder process runs on."""
        return self.topo.b.cpu if self.topo.forwarders_together else self.cpu

    def pinned(self, argv, cpu: int | None = None) -> list[str]:
        return ["taskset", "-c", str(self.cpu if cpu is None else cpu)] + [str(a) for a in argv]

    def run(self, argv, *, timeout: float = 30, check: bool = True, pin: bool = False):
        argv = self.pinned(argv) if pin else [str(a) for a in argv]
        r = self.topo.tb.exec(self.host, argv, timeout=timeout)
        if check and r.returncode != 0:
            raise TopoError(f"{self.name}: {' '.join(argv)} failed ({r.returncode}): "
                            f"{(r.stderr or r.stdout).strip()}")
        return r

    def ip_batch(self, lines: list[str]) -> None:
        """Several ``ip`` commands at once (``ip -batch -``)."""
        r = self.topo.tb.exec(self.host, ["ip", "-batch", "-"], input="\n".join(lines) + "\n",
                              timeout=30)
        if r.returncode != 0:
            raise TopoError(f"{self.name}: ip -batch failed: {r.stderr.strip()}\n" + "\n".join(lines))

    def popen(self, argv, *, pin: bool = True, cpu: int | None = None,
              **kw) -> subprocess.Popen:
        return self.topo.tb.popen(self.host, self.pinned(argv, cpu) if pin else list(argv), **kw)

    def steer(self, dev: str, where=None) -> None:
        """RPS: process packets received on ``dev`` on this host's core."""
        mask = format(1 << self.cpu, "x")
        where = where if where is not None else self.host
        script = (f"for q in /sys/class/net/{dev}/queues/rx-*; do "
                  f"echo {mask} > $q/rps_cpus; done")
        r = self.topo.tb.exec(where, ["sh", "-c", script], timeout=10)
        if r.returncode != 0:
            log.warning("RPS on %s failed: %s", dev, r.stderr.strip())


class BenchTopo:
    """Two testbed hosts prepared for the bench, with IPv6 application addresses when
    ``ipv6``; both forwarders on host B's core when ``forwarders_together``. A context
    manager."""

    def __init__(self, ipv6: bool = False, forwarders_together: bool = False):
        self.forwarders_together = forwarders_together
        ncpu = os.cpu_count() or 1
        self.cpus = (0, 1) if ncpu >= 2 else (0, 0)
        if ncpu < 2:
            log.warning("one CPU only: both hosts share CPU0; ratios still compare, rates do not")
        self.tb = Testbed(2)
        try:
            self.a = Side(self, self.tb[0], self.cpus[0])
            self.b = Side(self, self.tb[1], self.cpus[1])
            for side in (self.a, self.b):
                side.ip_batch([f"addr add {side.app_ip}/32 dev lo"])
                if ipv6:
                    side.run(["sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=0"])
                    side.ip_batch([f"addr add {side.app_ip6}/128 dev lo nodad"])
                for key in ("all", "default", "lo", side.iface):
                    side.run(["sysctl", "-qw", f"net.ipv4.conf.{key}.rp_filter=0"], check=False)
                side.steer(side.iface)
                # The bridge's work for a packet from this host runs on the
                # receiving host's core, as a NIC's receive interrupt would;
                # on the sender's core it costs one IPI per packet and the
                # generator, not the path, becomes the limit.
                self.peer(side).steer(self._switch_port(side), where="switch")
        except BaseException:
            self.close()
            raise

    def _switch_port(self, side: Side) -> str:
        """The bridge-side end of the host's veth (its peer, by ifindex)."""
        r = side.run(["cat", f"/sys/class/net/{side.iface}/iflink"])
        peer = int(r.stdout.strip())
        out = self.tb.exec("switch", ["ip", "-o", "link", "show"], timeout=10).stdout
        for line in out.splitlines():
            idx, name = line.split(":", 2)[:2]
            if int(idx) == peer:
                return name.strip().split("@")[0]
        raise TopoError(f"no switch port for {side.iface} (peer ifindex {peer})")

    @property
    def sides(self) -> tuple[Side, Side]:
        return (self.a, self.b)

    def peer(self, side: Side) -> Side:
        return self.b if side is self.a else self.a

    def kill(self, proc: subprocess.Popen, **kw):
        return self.tb.kill(proc, **kw)

    def close(self) -> None:
        self.tb.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
