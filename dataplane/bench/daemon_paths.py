"""Bench paths that run a real daemon over etcd on both hosts (the other paths run no etcd).

:class:`DaemonsOverEtcd` is the setup they share, with the daemon's command as a parameter:

* an etcd in the testbed's switch namespace, on the underlay (``http://192.168.77.254:<port>``),
  reachable from both hosts as a cluster's etcd is;
* the network config, and each host's lease put beforehand under flanneld's key
  (``<prefix>/subnets/10.5.X.0-24``) with the host's underlay address as PublicIP and no TTL (a
  reservation): a daemon reuses the lease that names its own PublicIP, so each host gets the /24
  every other path uses, and the flow 10.5.1.1 -> 10.5.2.1 is the same;
* one daemon per host, pinned to the host's core, with its log, subnet file and sockets in a
  directory of its own; ready once its log says so (``ready_log``) and, for a direct-routing
  path, once each host has the kernel route ``<peer /24> via <peer PublicIP>``.

Teardown leaves the hosts as the daemons found them: the daemons stopped by PID (SIGTERM, a
bounded wait, then SIGKILL), what a daemon leaves on purpose when it stops removed (the routes
of DirectRouting, proto 153; a flannel0; the firewall chains and subnet.env, by ``flannel-udp
cleanup``), etcd stopped and its data removed.

Paths:

* ``c-direct``: ``flannel-udp run --engine c`` on each host with ``"DirectRouting": true``: each
  daemon finds the peer on its link and routes to it with a plain kernel route, leaving flannel0
  idle; the data path is then the kernel's, as in ``direct`` (perf/README.md).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time

from dataplane.control.registry import DEFAULT_PREFIX
from dataplane.host.child import cli_argv
from dataplane.testbed.etcd import ETCD_BIN, EtcdServer

from .paths import DAEMON_PATHS, ENCAP_UDP, READY_TIMEOUT, TUN_DEV, Path, _tail
from .topo import NETWORK, BenchTopo, Side, TopoError

log = logging.getLogger(__name__)

DIRECT_PROTO = 153          # the protocol number of the daemon's direct routes (host/direct_routes.py)
STOP_TIMEOUT = 10.0         # SIGTERM to SIGKILL


class DaemonsOverEtcd(Path):
    """A daemon over one etcd on both bench hosts.

    :param command: ``command(path, side) -> argv`` of the daemon on ``side``; it reads the
        path's ``etcd_url``, ``prefix`` and ``subnet_file(side)``, ``sockets(side)``.
    :param config: the network config put at ``<prefix>/config``.
    :param ready_log: the daemon's log line (a substring) that says it forwards.
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
        doc = {"PublicIP": side.ip, "PublicIPv6": None}
        if self.direct:
            doc["DirectRouting"] = True
        return json.dumps(doc, separators=(",", ":"))

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
                                                       stderr=lf, env=env)
            deadline = time.monotonic() + READY_TIMEOUT
            for side in self.topo.sides:
                self._wait(side, deadline, f"log line {self.ready_log!r}",
                           lambda s=side: self.ready_log in _tail(self.log_file(s), 1 << 20))
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

    def _wait(self, side: Side, deadline: float, what: str, done) -> None:
        proc = self.procs[side.name]
        while not done():
            if proc.poll() is not None:
                raise TopoError(f"{self.name} daemon on {side.name} exited ({proc.returncode}) "
                                f"before {what}: {self.log_tail(side)}")
            if time.monotonic() > deadline:
                raise TopoError(f"{self.name} daemon on {side.name}: no {what} after "
                                f"{READY_TIMEOUT:.0f}s: {self.log_tail(side)}")
            time.sleep(0.05)

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
            # What a daemon leaves in any case: its direct routes (as flanneld leaves its rules)
            # and a flannel0 that outlived it.
            side.run(["ip", "route", "flush", "proto", str(DIRECT_PROTO)], check=False)
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


def make_daemon_path(topo: BenchTopo, name: str) -> DaemonsOverEtcd:
    if name == "c-direct":
        return DaemonsOverEtcd(
            topo, name, flannel_udp_run("c"), ready_log="Running:", direct=True,
            cleanup=flannel_udp_cleanup,
            config={"Network": str(NETWORK), "Backend": {"Type": "udp", "DirectRouting": True}})
    raise ValueError(f"unknown daemon path {name!r}: use {', '.join(DAEMON_PATHS)}")
