"""Static overlays: `flannel-udp forward` in testbed hosts, with routes given on its command line
(no etcd, no daemon); its log, stats and ready files in the testbed's workdir.
"""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess

from ..control.config import DEFAULT_UDP_PORT
from ..host.child import cli_argv
from .hosts import Host, Testbed
from .processes import read_log
from .wait import wait_for


def lease_of(host: Host, network: str = "10.5.0.0/16", prefixlen: int = 24) -> ipaddress.IPv4Network:
    """A deterministic lease for a host: the (index+1)-th /24 of ``network``
    (h0 -> 10.5.1.0/24, h1 -> 10.5.2.0/24, ...)."""
    net = ipaddress.IPv4Network(network)
    return list(net.subnets(new_prefix=prefixlen))[host.index + 1]


def child_env(extra: dict | None = None) -> dict:
    """The environment for a forwarder child: the caller's, less its engine
    choice (the child's --engine decides), plus ``extra``."""
    env = dict(os.environ)
    env.pop("DATAPLANE_ENGINE", None)
    env.update(extra or {})
    return env


class Forwarder:
    """One `flannel-udp forward` process inside a host, with its log, stats
    and ready files in the testbed's workdir.

    :param routes: ``["10.5.2.0/24=192.168.77.2", ...]`` (SUBNET=PEER_IP[:PORT]).
    :param extra: more command-line arguments (e.g. ``["--batch", "1"]``).
    """

    def __init__(self, testbed: Testbed, host: Host | str, *, tun_addr, routes=(),
                 network: str | None = "10.5.0.0/16", engine: str = "auto", port: int = DEFAULT_UDP_PORT,
                 accept_from: str = "any", extra=(), env: dict | None = None):
        self.testbed = testbed
        self.host = testbed.host(host)
        self.engine = engine
        self.tun_addr = ipaddress.IPv4Interface(tun_addr)
        base = os.path.join(testbed.workdir, f"fwd-{self.host.name}-{id(self):x}")
        self.log_file, self.stats_file, self.ready_file = (base + ".log", base + ".json",
                                                           base + ".ready")
        self.argv = cli_argv("forward", "--tun-addr", self.tun_addr.with_prefixlen,
                             "--listen", f"{self.host.ip}:{port}", "--engine", engine,
                             "--accept-from", accept_from,
                             "--stats-file", self.stats_file, "--ready-file", self.ready_file)
        if network:
            self.argv += ["--network", str(network)]
        for r in routes:
            self.argv += ["--route", str(r)]
        self.argv += [str(a) for a in extra]
        with open(self.log_file, "w") as log_f:
            self.proc = testbed.popen(self.host, self.argv, stdout=log_f,
                                      stderr=subprocess.STDOUT, env=child_env(env))
        self.returncode: int | None = None

    def log(self) -> str:
        return read_log(self.log_file)

    def wait_ready(self, timeout: float = 15.0) -> "Forwarder":
        """Wait (bounded) until forwarding has started; raise RuntimeError with
        the child's output if it exited or did not get there in time."""
        ok = wait_for(lambda: os.path.exists(self.ready_file) or self.proc.poll() is not None,
                      timeout)
        if not ok or not os.path.exists(self.ready_file):
            state = (f"exited with {self.proc.returncode}" if self.proc.poll() is not None
                     else f"not ready after {timeout:.0f} s")
            raise RuntimeError(f"forward in {self.host.name} ({self.engine}) {state}; "
                               f"argv: {' '.join(self.argv)}\n--- output ---\n{self.log()}")
        return self

    def info(self) -> dict:
        """The last stats-file document: engine, tun, pid, time, final, stats."""
        with open(self.stats_file) as f:
            return json.load(f)

    def stats(self) -> dict:
        return self.info()["stats"]

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait (then SIGKILL); returns the exit code (0 expected)."""
        if self.returncode is None:
            self.returncode = self.testbed.kill(self.proc, timeout=timeout)
        return self.returncode


def start_static_overlay(testbed: Testbed, engines=None, *, network: str = "10.5.0.0/16",
                         port: int = DEFAULT_UDP_PORT, hosts=None, ready_timeout: float = 15.0,
                         **kw) -> dict:
    """Start a forwarder on each host (default: all) with a full mesh of static
    routes (leases from :func:`lease_of`). ``engines`` is one kind for all or a
    list, one per host. Returns {host name: Forwarder}, all ready."""
    hosts = [testbed.host(h) for h in (hosts if hosts is not None else testbed.hosts)]
    if engines is None or isinstance(engines, str):
        engines = [engines or "auto"] * len(hosts)
    fwds = {}
    try:
        for h, eng in zip(hosts, engines):
            lease = lease_of(h, network)
            routes = [f"{lease_of(p, network)}={p.ip}:{port}" for p in hosts if p is not h]
            fwds[h.name] = Forwarder(testbed, h, tun_addr=f"{lease.network_address}/32",
                                     routes=routes, network=network, engine=eng, port=port, **kw)
        for f in fwds.values():
            f.wait_ready(ready_timeout)
    except BaseException:
        for f in fwds.values():
            f.stop()
        raise
    return fwds
