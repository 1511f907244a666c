"""Bench paths that run a real daemon over etcd on both hosts (the other paths run no etcd).

:class:`DaemonsOverEtcd` is the setup they share, with the daemon's command as a parameter:

* an etcd in the testbed's switch namespace, on the underlay (``http://192.168.77.254:<port>``),
  reachable from both hosts as a cluster's etcd is;
* the network config, and each host's lease put beforehand under flanneld's key
  (``<prefix>/subnets/10.5.X.0-24``) with the host's underlay address as PublicIP and no TTL (a
  reservation): a daemon reuses the lease that names its own PublicIP, so each host gets the /24
  every other path uses, and the flow 10.5.1.1 -> 10.5.2.1 is the same;
* one daemon per host, pinned to its forwarder core (the host's, or host B's with
  ``--forwarders-together``), with its log, subnet file and sockets in a
  directory of its own; ready once its log says so (``ready_log``) and, for a direct-routing
  path, once each host has the kernel route ``<peer /24> via <peer PublicIP>``;
* for a path whose packets go through flannel0, the cost is measured as the engines' is: the
  daemons' CPU time (their PIDs are the forwarders'), per packet counted by flannel0 itself.

Teardown leaves the hosts as the daemons found them: the daemons stopped by PID (SIGTERM, a
bounded wait, then SIGKILL), what a daemon leaves on purpose when it stops removed (the routes
of DirectRouting, proto 153; a flannel0; the firewall chains and subnet.env, by ``flannel-udp
cleanup``), etcd stopped and its data removed.

Paths:

* ``c-direct``: ``flannel-udp run --engine c`` on each host with ``"DirectRouting": true``: each
  daemon finds the peer on its link and routes to it with a plain kernel route, leaving flannel0
  idle; the data path is then the kernel's, as in ``direct`` (perf/README.md).
* ``kernel-flanneld``: the overlay of a host moving from flanneld to flannel-udp: host A runs
  ``flannel-udp run --engine kernel`` (the kernel path, the daemon's default where its programs
  load), host B the real flanneld (``--flanneld PATH``, skipped without it). Its figures are the
  two implementations speaking one wire, in both directions (A -> B, and B -> A in the reverse
  trials).
* ``flanneld``: the real flanneld, a binary the caller names (``bench --flanneld PATH``; the
  project neither ships nor needs it, and without it the path is skipped), with its udp backend:
  the packets go through its flannel0 and its C proxy. It reuses the lease naming its PublicIP
  (docs/flannel-compat.md#lease-acquisition) and, both leases being there before either daemon
  starts, learns its peer from its first snapshot: v0.20.2 misses leases created after it
  (docs/flannel-compat.md#peer-watch).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from ipaddress import IPv4Address

from dataplane.control.lease import LeaseAttrs
from dataplane.control.registry import DEFAULT_PREFIX
from dataplane.host import direct_routes
from dataplane.host.child import cli_argv
from dataplane.testbed.etcd import ETCD_BIN, EtcdServer

from .paths import (DAEMON_PATHS, ENCAP_UDP, READY_TIMEOUT, TUN_DEV, Path, PathSkipped, _tail,
                    wait_ready)
from .topo import NETWORK, BenchTopo, Side, TopoError

log = logging.getLogger(__name__)

STOP_TIMEOUT = 10.0         # SIGTERM to SIGKILL


class DaemonsOverEtcd(Path):
    """A daemon over one etcd on both bench hosts.

    :param command: ``command(path, side) -> argv`` of the daemon on ``side``; it reads the
        path's ``etcd_url``, ``prefix`` and ``subnet_file(side)``, ``sockets(side)``.
    :param config: the network config put at ``<prefix>/config``.
    :param ready_log: the daemon's log line (a substring) that says it forwards, or
        ``ready_log(path, side) -> lines``, every one of which the host's log must show.
    :param direct: whether the daemons route to each other directly (DirectRouting): the
        leases say so, and setup waits for the direct routes.
    :param cleanup: ``cleanup(path, side) -> argv`` run on each host after its daemon
        stopped, to remove what it leaves on purpose (None: nothing but the generic part).
    """

    def __init__(self, topo: BenchTopo, name: str, command, *, config: dict, ready_log: str,
                 direct: bool = False, cleanup=None, prefix: str = DEFAULT_PREFIX):
        super().__init__(topo)
        self.name = name
        self.command = command
        self.config = config
        self.ready_log = ready_log
        self.direct = direct
        self.cleanup = cleanup
        self.prefix = prefix
        self.kernel = direct        # the kernel carries the packets: no forwarder's cost to count
        self.etcd: EtcdServer | None = None
        self.procs: dict[str, object] = {}
        self.tmp = tempfile.mkdtemp(prefix=f"fubench-{name}-")

    # -- what a command reads ---------------------------------------------------------------
    @property
    def etcd_url(self) -> str:
        return self.etcd.client_url

    def dir(self, side: Side) -> str:
        return os.path.join(self.tmp, side.name)

    def subnet_file(self, side: Side) -> str:
        return os.path.join(self.dir(side), "subnet.env")

    def log_file(self, side: Side) -> str:
        return os.path.join(self.dir(side), "daemon.log")

    def sockets(self, side: Side) -> tuple[str, str]:
        """The host's status and handover sockets (the defaults are one per machine)."""
        return (os.path.join(self.dir(side), "status.sock"),
                os.path.join(self.dir(side), "handover.sock"))

    def lease_value(self, side: Side) -> str:
        return LeaseAttrs(IPv4Address(side.ip), direct_routing=self.direct).to_json().decode()

    def lease_key(self, side: Side) -> str:
        return f"{self.prefix}/subnets/{side.subnet.network_address}-{side.subnet.prefixlen}"

    def mtu(self) -> int:
        return self.topo.a.host.mtu - (0 if self.direct else ENCAP_UDP)

    # -- setup ----------------------------------------------------------------------------
    def setup(self) -> None:
        tb = self.topo.tb
        if shutil.which(ETCD_BIN) is None:
            raise TopoError(f"the {self.name} path needs the etcd binary (apt-get install etcd-server)")
        try:
            self.etcd = EtcdServer(host=tb.switch_ip, netns=tb.switch, name=f"fu-etcd-{tb.tag}")
            self.etcd.start()
            self.etcd.etcdctl("put", f"{self.prefix}/config", json.dumps(self.config))
            for side in self.topo.sides:
                self.etcd.etcdctl("put", self.lease_key(side), self.lease_value(side))
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith("FLANNELD_") and k not in ("NOTIFY_SOCKET",
                                                                  "DATAPLANE_ENGINE")}
            env["PYTHONUNBUFFERED"] = "1"
            for side in self.topo.sides:
                os.makedirs(self.dir(side), exist_ok=True)
                with open(self.log_file(side), "w") as lf:
                    self.procs[side.name] = side.popen(self.command(self, side), stdout=lf,
                                                       stderr=lf, env=env,
                                                       cpu=side.forwarder_cpu)
            deadline = time.monotonic() + READY_TIMEOUT
            for side in self.topo.sides:
                for line in self.ready_lines(side):
                    self._wait(side, deadline, f"log line {line!r}",
                               lambda s=side, ln=line: ln in _tail(self.log_file(s), 1 << 20))
            if self.direct:
                for side in self.topo.sides:
                    peer = self.topo.peer(side)
                    self._wait(side, deadline, f"route {peer.subnet} via {peer.ip}",
                               lambda s=side: self.direct_route(s) is not None)
            for side in self.topo.sides:
                if side.run(["test", "-e", f"/sys/class/net/{TUN_DEV}"], check=False).returncode == 0:
                    side.steer(TUN_DEV)
        except BaseException:
            self.teardown()
            raise

    def ready_lines(self, side: Side) -> tuple[str, ...]:
        lines = self.ready_log(self, side) if callable(self.ready_log) else self.ready_log
        return (lines,) if isinstance(lines, str) else tuple(lines)

    def _wait(self, side: Side, deadline: float, what: str, done) -> None:
        wait_ready(self.procs[side.name], done, deadline, f"{self.name} daemon on {side.name}",
                   what, lambda: self.log_tail(side))

    def direct_route(self, side: Side) -> str | None:
        """The host's route to its peer's /24 via the peer's PublicIP on the underlay
        (``ip -o route`` line), or None."""
        peer = self.topo.peer(side)
        out = side.run(["ip", "-o", "route", "show", "exact", str(peer.subnet)], check=False).stdout
        for line in out.splitlines():
            if f"via {peer.ip} dev {side.iface}" in line:
                return line.strip()
        return None

    # -- teardown -------------------------------------------------------------------------
    def teardown(self) -> None:
        for name, proc in list(self.procs.items()):
            self.topo.kill(proc, timeout=STOP_TIMEOUT)
        started = bool(self.procs)
        self.procs.clear()
        for side in self.topo.sides if started else ():
            if self.cleanup is not None:
                r = side.run(self.cleanup(self, side), check=False, timeout=60)
                if r.returncode != 0:
                    log.warning("%s cleanup on %s (%d): %s", self.name, side.name, r.returncode,
                                (r.stderr or r.stdout).strip()[-600:])
            # What a daemon leaves in any case: its direct routes and their nexthop objects (as
            # flanneld leaves its rules), and a flannel0 that outlived it.
            side.run(["ip", "route", "flush", "proto", str(direct_routes.PROTO)], check=False)
            side.run(["ip", "nexthop", "flush", "proto", str(direct_routes.PROTO)], check=False)
            side.run(["ip", "link", "del", TUN_DEV], check=False)
        if self.etcd is not None:
            try:
                self.etcd.close()
            except Exception as e:      # a teardown goes on: the next path needs the hosts
                log.warning("%s: stopping etcd: %s", self.name, e)
            self.etcd = None
        shutil.rmtree(self.tmp, ignore_errors=True)

    def daemon_pids(self) -> dict:
        return {name: p.pid for name, p in self.procs.items() if p.poll() is None}

    def forwarder_pids(self) -> dict:
        return {} if self.kernel else self.daemon_pids()

    def counters(self, after: float | None = None) -> dict:
        """Per host, flannel0's packet counters as the kernel keeps them (whoever holds the TUN),
        under the names of the engine counters the cost is divided by (measure.CostWindow):
        ``udp_tx_packets``, what the daemon read from flannel0 to send (the TUN counts a packet
        transmitted when the holder reads it), and ``tun_tx_packets``, what it wrote into
        flannel0 (counted received). No ``syscalls``: a daemon of another project counts none.
        The counters are live, so ``after`` (for the engines' stats files) changes nothing."""
        if self.kernel:
            return {}
        out = {}
        for side in self.topo.sides:
            stats = f"/sys/class/net/{TUN_DEV}/statistics"
            r = side.run(["cat", f"{stats}/tx_packets", f"{stats}/rx_packets"], check=False)
            try:
                tx, rx = (int(v) for v in r.stdout.split())
            except ValueError:
                continue            # no flannel0 on this host (any more)
            out[side.name] = {"udp_tx_packets": tx, "tun_tx_packets": rx}
        return out

    def log_tail(self, side: Side) -> str:
        return _tail(self.log_file(side))


# -- flannel-udp as the daemon --------------------------------------------------------------

def flannel_udp_run(engine: str):
    """The command of ``flannel-udp run --engine ENGINE`` on a host of a DaemonsOverEtcd."""
    def command(path: DaemonsOverEtcd, side: Side) -> list[str]:
        return cli_argv("run", *_flannel_udp_flags(path, side), "--engine", engine)
    return command


def flannel_udp_cleanup(path: DaemonsOverEtcd, side: Side) -> list[str]:
    """``flannel-udp cleanup`` with the daemon's flags: its firewall chains, subnet.env, sockets."""
    return cli_argv("cleanup", *_flannel_udp_flags(path, side))


def _flannel_udp_flags(path: DaemonsOverEtcd, side: Side) -> list[str]:
    status, handover = path.sockets(side)
    return ["--etcd-endpoints", path.etcd_url, "--etcd-prefix", path.prefix,
            "--iface", side.iface, "--subnet-file", path.subnet_file(side),
            "--status-socket", status, "--handover-socket", handover]


# -- flanneld as the daemon -------------------------------------------------------------------

FLANNELD_SKIP = "no flanneld binary given (bench --flanneld PATH)"


def flanneld_problem(binary: str) -> str | None:
    """Why ``binary`` cannot be run as flanneld (None when it can)."""
    if not os.path.exists(binary):
        return f"{binary}: no such file"
    if not os.path.isfile(binary):
        return f"{binary}: not a file"
    if not os.access(binary, os.X_OK):
        return f"{binary}: not executable"
    return None


def flanneld_run(binary: str):
    """The command of flanneld on a host of a DaemonsOverEtcd: its own flags
    (docs/flannel-compat.md#flags), everything else at flanneld's defaults (the udp backend's
    port 8285, the FORWARD rules on, no masquerade, no healthz)."""
    def command(path: DaemonsOverEtcd, side: Side) -> list[str]:
        return [binary, f"-etcd-endpoints={path.etcd_url}", f"-etcd-prefix={path.prefix}",
                f"-iface={side.iface}", f"-subnet-file={path.subnet_file(side)}"]
    return command


def flanneld_ready(path: DaemonsOverEtcd, side: Side) -> tuple[str, ...]:
    """flanneld's log lines (klog, INFO) once it forwards: its backend runs, its lease watch
    runs, and its C proxy has the route to the peer's /24 (the udp backend logs each peer it
    adds, docs/flannel-compat.md#peer-watch)."""
    peer = path.topo.peer(side)
    return ("Running backend.", "Watching for new subnet leases", f"Subnet added: {peer.subnet}")


def mixed_run(flanneld: str):
    """Host A's command ``flannel-udp run --engine kernel`` (pinned under the testbed's own
    bpffs, so that nothing outside it is adopted or left), host B's flanneld's."""
    def command(path: DaemonsOverEtcd, side: Side) -> list[str]:
        if side is path.topo.a:
            return flannel_udp_run("kernel")(path, side) + [
                f"--bpf-pins={path.topo.tb.bpf_pins(side.host)}"]
        return flanneld_run(flanneld)(path, side)
    return command


def mixed_ready(path: DaemonsOverEtcd, side: Side) -> tuple[str, ...]:
    return ("Running:",) if side is path.topo.a else flanneld_ready(path, side)


def mixed_cleanup(path: DaemonsOverEtcd, side: Side) -> list[str]:
    """A kernel path outlives its daemon's stop (pinned): host A's cleanup removes it too."""
    argv = flannel_udp_cleanup(path, side)
    if side is path.topo.a:
        argv += ["--kernel-path", f"--bpf-pins={path.topo.tb.bpf_pins(side.host)}"]
    return argv


def make_daemon_path(topo: BenchTopo, name: str, flanneld: str | None = None) -> DaemonsOverEtcd:
    """``flanneld``: the binary of the ``flanneld`` and ``kernel-flanneld`` paths (None: they
    are skipped)."""
    if name in ("flanneld", "kernel-flanneld"):
        if not flanneld:
            raise PathSkipped(FLANNELD_SKIP)
        problem = flanneld_problem(flanneld)
        if problem:
            raise TopoError(f"--flanneld {problem}")
    if name == "kernel-flanneld":
        return DaemonsOverEtcd(
            topo, name, mixed_run(flanneld), ready_log=mixed_ready, cleanup=mixed_cleanup,
            config={"Network": str(NETWORK), "Backend": {"Type": "udp"}})
    if name == "flanneld":
        # flanneld leaves its FORWARD rules at exit (docs/flannel-compat.md#iptables), as
        # flannel-udp does: `flannel-udp cleanup` removes flanneld's as its own.
        return DaemonsOverEtcd(
            topo, name, flanneld_run(flanneld), ready_log=flanneld_ready,
            cleanup=flannel_udp_cleanup,
            config={"Network": str(NETWORK), "Backend": {"Type": "udp"}})
    if name == "c-direct":
        return DaemonsOverEtcd(
            topo, name, flannel_udp_run("c"), ready_log="Running:", direct=True,
            cleanup=flannel_udp_cleanup,
            config={"Network": str(NETWORK), "Backend": {"Type": "udp", "DirectRouting": True}})
    raise ValueError(f"unknown daemon path {name!r}: use {', '.join(DAEMON_PATHS)}")
