"""The four paths the bench compares, each set up on the same two hosts.

* ``direct``: flannel's host-gw shape, no encapsulation - a route to the
  peer's /24 via the peer's underlay address. The kernel's limit.
* ``vxlan``: what flanneld's vxlan backend programs, statically: a
  ``flannel.1`` VXLAN device (VNI 1, local = underlay address, dstport 8472,
  nolearning, MTU = veth MTU - 50) with address ``<subnet>.0/32``, and per
  peer a permanent neighbour entry (peer's ``.0`` -> peer's VTEP MAC), a
  permanent FDB entry (VTEP MAC -> peer's underlay IP) and the route
  ``<peer subnet> via <peer .0> dev flannel.1 onlink``.
* ``c`` and ``python``: this project's engines, one ``flannel-udp forward``
  process per host with a static route to the peer (the daemon's etcd path is
  not involved; see perf/README.md). They run the daemon's data path: the
  daemon's non-blocking sockets and its default source check (``--accept-from
  leases``); with ``routes`` > 0 (``bench --routes N``), N more routes to
  peers that never send fill the table, as N peers of a big cluster would.

* ``c6``, ``python6`` and ``vxlan6``: ``c``, ``python`` and ``vxlan`` with a dual-stack config
  (the overlay device's IPv6 address, ``<IPv6 subnet>/128``, and the routes of the peer's IPv6
  /64 too), measured with inner IPv6 between the hosts' IPv6 addresses (families.py). The
  engines' flannel0 then offers no TSO6 (as the daemon's with a dual-stack lease), so the
  kernel segments IPv6 TCP before the engine sees it.

A path's ``setup()`` and ``teardown()`` leave the hosts as they found them,
so the paths run one after another on one testbed. The paths that run real
daemons over an etcd (``c-direct``, ``flanneld``) are in daemon_paths.py.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import os
import shutil
import tempfile
import time

from ..host.child import cli_argv
from .families import IPV6_TWINS
from .topo import FLANNEL_PORT, NETWORK, NETWORK6, BenchTopo, Side, TopoError

log = logging.getLogger(__name__)

PATHS = ("direct", "vxlan", "c", "python")
# Engine paths with fixed settings, to measure one step at a time (`--paths
# c-base,c,...`): before offloads and queues, with 20 us coalescing, with
# real-time loop threads (host/sched.py), and real-time with 20-100 us coalescing (the latency
# trade-off, perf/README.md#latency-under-load); `c` and
# `python` themselves run `forward`'s defaults.
ENGINE_VARIANTS = {
    "c-base": ("c", ("--queues", "1", "--offload", "off", "--coalesce-usecs", "0")),
    "c-offload": ("c", ("--queues", "1", "--offload", "auto", "--coalesce-usecs", "0")),
    "c-coalesce20": ("c", ("--coalesce-usecs", "20")),
    "python-coalesce20": ("python", ("--coalesce-usecs", "20")),
    "c-rt": ("c", ("--realtime-priority", "1")),
    "python-rt": ("python", ("--realtime-priority", "1")),
    "c-rt-coalesce20": ("c", ("--realtime-priority", "1", "--coalesce-usecs", "20")),
    "c-rt-coalesce30": ("c", ("--realtime-priority", "1", "--coalesce-usecs", "30")),
    "c-rt-coalesce50": ("c", ("--realtime-priority", "1", "--coalesce-usecs", "50")),
    "c-rt-coalesce100": ("c", ("--realtime-priority", "1", "--coalesce-usecs", "100")),
}
# Real daemons over an etcd on both hosts (daemon_paths.py): `c-direct`, the C engine's daemon
# with DirectRouting on; `flanneld`, the real flanneld's udp backend (a binary the caller names,
# `bench --flanneld PATH`: the project does not ship it, and without it the path is skipped);
# `kernel-flanneld`, the kernel path's daemon on host A beside that flanneld on host B.
DAEMON_PATHS = ("c-direct", "flanneld", "kernel-flanneld")
# The kernel path (kernel_paths.py): the C engine as the slow path plus the tc programs of
# csrc/bpf/ on each host; the value is the inner family measured.
KERNEL_PATHS = {"kernel": 4, "kernel6": 6}
ALL_PATHS = PATHS + tuple(IPV6_TWINS) + tuple(ENGINE_VARIANTS) + DAEMON_PATHS + ("kernel",)
VXLAN_DEV = "flannel.1"
VXLAN_PORT = 8472
TUN_DEV = "flannel0"
ENCAP_UDP = 28      # flannel udp: IPv4 + UDP header
ENCAP_VXLAN = 50    # flannel vxlan: outer IPv4 + UDP + VXLAN + inner Ethernet
READY_TIMEOUT = 30.0
# Filler routes: /24s of a network that is not the bench's, to peers in a range that is not the
# underlay's (no packet is ever sent to them).
FILLER_NETWORK = ipaddress.IPv4Network("10.128.0.0/9")
FILLER_PEERS = ipaddress.IPv4Network("172.16.0.0/12")
FILLER_MAX = 2 ** (24 - FILLER_NETWORK.prefixlen)


def filler_routes(n: int) -> list[str]:
    """``n`` route lines (SUBNET=PEER_IP) for ``forward --route-file``."""
    if not 0 <= n <= FILLER_MAX:
        raise ValueError(f"{n} filler routes: expected 0..{FILLER_MAX}")
    net, peers = int(FILLER_NETWORK.network_address), int(FILLER_PEERS.network_address)
    return [f"{ipaddress.IPv4Address(net + (i << 8))}/24={ipaddress.IPv4Address(peers + i + 1)}"
            for i in range(n)]


class PathSkipped(Exception):
    """A path that cannot run here for a reason that is no failure (what it needs was not
    given); the run goes on, and its rows say ``skipped`` with the reason."""


class Path:
    name = "?"
    kernel = True
    family = 4          # of the inner packets the measurements send

    def __init__(self, topo: BenchTopo):
        self.topo = topo

    def setup(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        raise NotImplementedError

    def mtu(self) -> int:
        """MTU of the overlay device (what the inner packet may be)."""
        return self.topo.a.host.mtu

    # Cost accounting (only the engines have forwarding processes).
    def forwarder_pids(self) -> dict:
        return {}

    def counters(self, after: float | None = None) -> dict:
        return {}


class DirectPath(Path):
    name = "direct"

    def _routes(self, verb: str) -> None:
        for side in self.topo.sides:
            peer = self.topo.peer(side)
            side.ip_batch([f"route {verb} {peer.subnet} via {peer.ip} dev {side.iface}"])

    def setup(self) -> None:
        self._routes("add")

    def teardown(self) -> None:
        try:
            self._routes("del")
        except TopoError as e:
            log.warning("direct teardown: %s", e)


class VxlanPath(Path):
    name = "vxlan"

    def __init__(self, topo: BenchTopo, family: int = 4):
        super().__init__(topo)
        self.family = family
        if family == 6:
            self.name = "vxlan6"

    def mtu(self) -> int:
        return self.topo.a.host.mtu - ENCAP_VXLAN

    def setup(self) -> None:
        macs = {}
        for side in self.topo.sides:
            side.ip_batch([
                f"link add {VXLAN_DEV} type vxlan id 1 local {side.ip} dev {side.iface} "
                f"dstport {VXLAN_PORT} nolearning"])
            if self.family == 6:
                # Before the link is up, as the daemon does for flannel0: no link-local
                # address, hence no solicitation or MLD report through the tunnel.
                side.run(["sh", "-c", f"cd /proc/sys/net/ipv6/conf/{VXLAN_DEV} && "
                          "echo 1 > addr_gen_mode && echo 0 > accept_dad && "
                          "echo 0 > disable_ipv6"])
            side.ip_batch([
                f"link set {VXLAN_DEV} mtu {self.mtu()} up",
                f"addr add {side.tun_ip}/32 dev {VXLAN_DEV}",
            ] + ([f"addr add {side.tun_ip6}/128 dev {VXLAN_DEV} nodad"]
                 if self.family == 6 else []))
            out = side.run(["cat", f"/sys/class/net/{VXLAN_DEV}/address"]).stdout.strip()
            macs[side.name] = out
            side.steer(VXLAN_DEV)
        for side in self.topo.sides:
            peer = self.topo.peer(side)
            mac = macs[peer.name]
            side.ip_batch([
                f"neigh replace {peer.tun_ip} lladdr {mac} dev {VXLAN_DEV} nud permanent",
                f"route replace {peer.subnet} via {peer.tun_ip} dev {VXLAN_DEV} onlink",
            ] + ([f"neigh replace {peer.tun_ip6} lladdr {mac} dev {VXLAN_DEV} nud permanent",
                  f"route replace {peer.subnet6} via {peer.tun_ip6} dev {VXLAN_DEV} onlink"]
                 if self.family == 6 else []))
            side.run(["bridge", "fdb", "replace", mac, "dev", VXLAN_DEV, "dst", peer.ip,
                      "self", "permanent"])

    def teardown(self) -> None:
        for side in self.topo.sides:
            side.run(["ip", "link", "del", VXLAN_DEV], check=False)


class EnginePath(Path):
    """``flannel-udp forward`` on each host, pinned to its forwarder core (``Side.forwarder_cpu``)."""
    kernel = False

    def __init__(self, topo: BenchTopo, kind: str, batch: int | None = None,
                 name: str | None = None, extra_args=(), routes: int = 0, family: int = 4):
        super().__init__(topo)
        self.name = name or kind
        self.kind = kind
        self.family = family
        self.batch = batch
        self.extra_args = list(extra_args)
        self.procs: dict[str, object] = {}
        self.tmp = tempfile.mkdtemp(prefix=f"fubench-{self.name}-")
        self.route_file = None
        if routes:
            self.route_file = os.path.join(self.tmp, "routes")
            with open(self.route_file, "w") as f:
                f.write("\n".join(filler_routes(routes)) + "\n")

    def mtu(self) -> int:
        return self.topo.a.host.mtu - ENCAP_UDP

    def _files(self, side: Side) -> tuple[str, str, str]:
        base = os.path.join(self.tmp, side.name)
        return base + ".stats.json", base + ".ready", base + ".log"

    def argv(self, side: Side) -> list[str]:
        peer = self.topo.peer(side)
        stats, ready, _ = self._files(side)
        argv = cli_argv("forward", "--tun-name", TUN_DEV, "--tun-addr", side.tun_ip,
                        "--network", str(NETWORK), "--mtu", str(self.mtu()),
                        "--listen", f"{side.ip}:{FLANNEL_PORT}",
                        "--route", f"{peer.subnet}={peer.ip}:{FLANNEL_PORT}",
                        "--engine", self.kind, "--accept-from", "leases",
                        "--stats-file", stats, "--ready-file", ready)
        if self.family == 6:
            # dual stack: the IPv4 route stays, as a dual-stack lease keeps both
            argv += ["--tun-addr6", f"{side.tun_ip6}/128", "--network6", str(NETWORK6),
                     "--route", f"{peer.subnet6}={peer.ip}:{FLANNEL_PORT}"]
        if self.route_file:
            argv += ["--route-file", self.route_file]
        if self.batch:
            argv += ["--batch", str(self.batch)]
        return argv + self.extra_args

    def setup(self) -> None:
        env = dict(os.environ, DATAPLANE_ENGINE=self.kind)
        try:
            for side in self.topo.sides:
                _, ready, logf = self._files(side)
                with open(logf, "w") as lf:
                    self.procs[side.name] = side.popen(self.argv(side), stdout=lf, stderr=lf,
                                                       env=env, cpu=side.forwarder_cpu)
            deadline = time.monotonic() + READY_TIMEOUT
            for side in self.topo.sides:
                _, ready, logf = self._files(side)
                wait_ready(self.procs[side.name], lambda: os.path.exists(ready), deadline,
                           f"{self.kind} forwarder on {side.name}", "its ready file",
                           lambda: _tail(logf))
                side.steer(TUN_DEV)
        except BaseException:
            self.teardown()
            raise

    def teardown(self) -> None:
        for name, proc in list(self.procs.items()):
            self.topo.kill(proc, timeout=5.0)
        self.procs.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def forwarder_pids(self) -> dict:
        return {name: p.pid for name, p in self.procs.items() if p.poll() is None}

    def log_tail(self, side: Side) -> str:
        return _tail(self._files(side)[2])

    def counters(self, after: float | None = None, timeout: float = 3.0) -> dict:
        """Engine counters per host from the stats files; with ``after`` (a
        time.time()), wait until each file was written after that moment."""
        out = {}
        for side in self.topo.sides:
            stats, _, _ = self._files(side)
            deadline = time.monotonic() + timeout
            while True:
                data = None
                try:
                    fresh = after is None or os.stat(stats).st_mtime > after
                    if fresh:
                        with open(stats) as f:
                            data = _find_counters(json.load(f))
                except (OSError, ValueError):
                    data = None
                if data is not None:
                    out[side.name] = data
                    break
                if time.monotonic() > deadline:
                    log.warning("no fresh stats from %s's %s forwarder", side.name, self.kind)
                    break
                time.sleep(0.02)
        return out


def _find_counters(obj):
    """The dict holding the engine counters in a stats file, wherever the
    forward command nests it (top level, or under a key like "stats")."""
    if isinstance(obj, dict):
        if "syscalls" in obj and "udp_tx_packets" in obj:
            return {k: v for k, v in obj.items() if isinstance(v, (int, float))}
        for v in obj.values():
            found = _find_counters(v)
            if found is not None:
                return found
    return None


def wait_ready(proc, done, deadline: float, who: str, what: str, tail) -> None:
    """Poll ``done()`` until it holds; a TopoError naming ``who`` with ``tail()`` (its log's end)
    when ``proc`` exits first or ``deadline`` passes."""
    while not done():
        if proc.poll() is not None:
            raise TopoError(f"{who} exited ({proc.returncode}) before {what}: {tail()}")
        if time.monotonic() > deadline:
            raise TopoError(f"{who}: still no {what} after {READY_TIMEOUT:.0f}s: {tail()}")
        time.sleep(0.02)


def _tail(path: str, n: int = 600) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:].strip()
    except OSError:
        return ""


def cpu_ns(pid: int) -> int | None:
    """utime + stime of a process (all its threads) in ns, from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = int(fields[11]) + int(fields[12])   # fields 14 and 15 of proc(5)
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
