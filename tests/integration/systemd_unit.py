"""flannel-udp.service (packaging/) for one testbed host, run by a real systemd
(tests/integration/systemd_box.py): the unit as shipped, ExecStart pointed at this checkout, and a
drop-in with what the testbed decides (NetworkNamespacePath=<the host's>, the env file with the
overlay's etcd and the host's veth, the log file). Used by the tests of restarts under systemd.
A dual-stack unit (``unit_of(..., dual_stack=True)``) runs on a network config with EnableIPv6,
both hosts with an IPv6 underlay address (docs/operating.md#ipv6-underlay).
"""
from __future__ import annotations

import ipaddress
import json
import os
import shlex
import sys

from dataplane.host.child import cli_argv
from dataplane.testbed.processes import read_log
from tests.conftest import require
from tests.integration import restart_traffic, systemd_box
from tests.integration.conftest import overlay_of

UNIT = "flannel-udp.service"
UNIT_FILE = os.path.join(os.path.dirname(__file__), "..", "..", "packaging", UNIT)
QUEUES = "--queues 2"
DUAL_STACK = {"Network": "10.67.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:67::/56",
              "Backend": {"Type": "udp"}}
# A Python, a venv or a checkout (the editable install's sources) under a home directory: the
# unit's ProtectHome=yes would hide it from the daemon (pyenv here, /root/main/.venv on a newcomer's).
HOME_PYTHON = any(os.path.realpath(p).startswith(("/root/", "/home/")) for p in (
    sys.executable, sys.prefix, os.path.dirname(UNIT_FILE)))


class Unit:
    """flannel-udp.service for host h0 of ``ov`` inside ``box``."""

    def __init__(self, ov, host, box, engine: str):
        self.ov, self.host, self.box, self.engine = ov, host, box, engine
        self.dir = box.dir
        wrapper = os.path.join(self.dir, "flannel-udp")
        with open(wrapper, "w") as f:
            f.write(f"#!/bin/sh\nexec {shlex.join(cli_argv())} \"$@\"\n")
        os.chmod(wrapper, 0o755)
        with open(UNIT_FILE) as f:
            text = f.read().replace("/opt/flannel-udp/bin/flannel-udp", wrapper)
        self.options(QUEUES)
        box.install(UNIT, text, dropin=(
            "[Service]\n"
            f"NetworkNamespacePath=/run/netns/{host.netns}\n"
            "EnvironmentFile=\n"
            f"EnvironmentFile={self.env_file}\n"
            f"StandardOutput=append:{self.log_path}\n"
            "StandardError=inherit\n"
            # the box's files live in its directory under /run, not in /run/flannel
            "RuntimeDirectory=\n"
            # nor its cache in /var/cache/flannel-udp: the box's root is read-only, and systemd
            # fails the start (239/CACHE_DIRECTORY) where that directory is not there yet
            "CacheDirectory=\n"
            f"Environment=XDG_CACHE_HOME={self.dir}/cache\n"
            # a Python or checkout under a home directory must stay readable
            + ("ProtectHome=read-only\n" if HOME_PYTHON else "")))

    @property
    def env_file(self) -> str:
        return os.path.join(self.dir, "flannel-udp.env")

    @property
    def log_path(self) -> str:
        return os.path.join(self.dir, "daemon.log")

    def options(self, extra: str) -> None:
        """The env file: the overlay's etcd, h0's veth, this box's paths, ``extra`` flags."""
        with open(self.env_file, "w") as f:
            f.write(f"FLANNELD_ETCD_ENDPOINTS={self.ov.etcd_url}\n"
                    f"FLANNELD_ETCD_PREFIX={self.ov.prefix}\n"
                    f"FLANNELD_IFACE={self.host.iface}\n"
                    f"FLANNELD_SUBNET_FILE={self.dir}/subnet.env\n"
                    f"FLANNELD_HANDOVER_SOCKET={self.dir}/handover.sock\n"
                    f"FLANNELD_STATUS_SOCKET={self.dir}/status.sock\n"
                    # a kernel path's pins of this box's own, never the machine's
                    f"FLANNELD_BPF_PINS=/sys/fs/bpf/{os.path.basename(self.dir)}\n"
                    "PYTHONUNBUFFERED=1\n"
                    f"FLANNEL_UDP_OPTIONS=--engine {self.engine} {extra}\n")

    def dropin(self, name: str, service: str) -> None:
        """One more drop-in, ``service`` its [Service] lines (a test's WatchdogSec=), then
        daemon-reload: systemd applies it from the next start."""
        with open(os.path.join(self.box.units, f"{UNIT}.d", f"{name}.conf"), "w") as f:
            f.write(f"[Service]\n{service}")
        self.box.systemctl("daemon-reload")

    def log(self) -> str:
        return read_log(self.log_path)

    def systemctl(self, *args, check: bool = True):
        """``systemctl ARGS flannel-udp.service``; a failure carries the unit's status and log."""
        r = self.box.systemctl(*args, UNIT, check=False)
        if check and r.returncode != 0:
            status = self.box.systemctl("status", UNIT, check=False).stdout
            raise AssertionError(f"systemctl {' '.join(args)} failed: {r.stdout}{r.stderr}\n"
                                 f"{status}\n--- log ---\n{self.log()[-3000:]}")
        return r

    def main_pid(self) -> int:
        return self.box.main_pid(UNIT)

    def stored_fds(self) -> int:
        return int(self.box.show(UNIT, "NFileDescriptorStore")["NFileDescriptorStore"])

    def subnet_env(self) -> dict:
        with open(os.path.join(self.dir, "subnet.env")) as f:
            return dict(line.strip().split("=", 1) for line in f if "=" in line)

    def flannel_ip(self) -> str:
        return self.subnet_env()["FLANNEL_SUBNET"].rsplit(".", 1)[0] + ".0"

    def flannel_ip6(self) -> str:
        return flannel_ip6(self.subnet_env())


def flannel_ip6(subnet_env: dict) -> str:
    """flannel0's IPv6 address: the network address of the lease's IPv6 part."""
    return str(ipaddress.IPv6Interface(subnet_env["FLANNEL_IPV6_SUBNET"]).network.network_address)


def unit_of(engine: str, dual_stack: bool = False, service: str = ""):
    """For a fixture: yields a started Unit on h1 of a new overlay whose h0 (the peer) runs the
    testbed's daemon; both with ``engine`` and QUEUES (``dual_stack``: on DUAL_STACK, both with
    an IPv6 underlay; ``service``: [Service] lines of a drop-in, applied from the start).
    Everything is removed after, also when the test fails."""
    require(systemd_box.missing() is None, f"a systemd box: {systemd_box.missing()}")
    kw = {"config": DUAL_STACK, "ipv6": True} if dual_stack else {}
    for ov in overlay_of(engine, (), **kw):
        ov.add_host(engine=engine, args=QUEUES.split(), underlay6=dual_stack)
        h = ov.add_host(start=False, underlay6=dual_stack)
        with systemd_box.SystemdBox() as box:
            u = Unit(ov, h, box, engine)
            if service:
                u.dropin("test", service.replace("{dir}", u.dir))
            try:
                u.systemctl("start")
                yield u
            finally:
                u.systemctl("stop", check=False)


def ifindex(u) -> int:
    r = u.ov.exec(u.host, ["ip", "-j", "link", "show", "flannel0"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]["ifindex"]


def lease_revision(u) -> int:
    """Of the lease's key, of either shape (a dual-stack one names the IPv6 part after "&")."""
    net = u.flannel_ip().rsplit(".", 1)[0] + ".0-24"
    r = u.ov.etcdctl("get", "--prefix", f"{u.ov.prefix}/subnets/{net}", "-w", "json")
    kv, = json.loads(r.stdout)["kvs"]
    return int(kv["mod_revision"])


def across(u, action, ipv6: bool = False):
    """restart_traffic.across between the unit's host and h0, over flannel0's IPv4 or IPv6."""
    peer = u.ov.hosts[0]
    if ipv6:
        ips = u.flannel_ip6(), flannel_ip6(u.ov.subnet_env(peer))
    else:
        ips = u.flannel_ip(), u.ov.flannel_ip(peer)
    return restart_traffic.across(u.ov.tb, u.host, peer, *ips, action)
