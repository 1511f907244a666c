"""`systemctl restart` with the unit in packaging/: systemd's fd store keeps flannel0's queues,
the UDP sockets and the daemon's state across the restart (root, namespaces, real etcd and TUN,
and a real systemd: tests/integration/systemd_box.py, since the machine's PID 1 need not be one).

::

      h0: systemd box -> flannel-udp.service (packaging/, ExecStart pointed at this checkout,
          NetworkNamespacePath=h0, the env file with the overlay's etcd and h0's veth)
       ||  paced UDP both ways, TCP both ways (tests/integration/restart_traffic.py)
      h1: flannel-udp (the testbed's)

Both hosts run the engine under test with two queues and, for the C engine, the offloads on.
`systemctl restart` must lose no datagram, never reset the TCP streams nor leave them silent
for longer than RESTART_STALL_BOUND_MS (systemd starts the new process once the old one has
exited: the silence is the new one's start, less what it takes over), keep flannel0 (the same
device) and the lease (no write to etcd). `systemctl reload` (the unit's upgrade in place: the
old daemon starts the new one, which takes over through the handover socket) must do the same
within RELOAD_STALL_BOUND_MS, and leave the new daemon as the unit's main process. A crash
(SIGKILL, Restart=on-failure after RestartSec) is measured too.
"""
from __future__ import annotations

import json
import os
import shlex
import sys

import pytest

from dataplane.cli.child import cli_argv
from dataplane.engine.api import DEFAULT_BATCH
from tests.conftest import require
from tests.integration import restart_traffic, systemd_box
from tests.integration.conftest import overlay_of, wait_until

pytestmark = [pytest.mark.root, pytest.mark.etcd]

UNIT = "flannel-udp.service"
UNIT_FILE = os.path.join(os.path.dirname(__file__), "..", "..", "packaging", UNIT)
QUEUES = "--queues 2"
RESTART_STALL_BOUND_MS = 1000
RELOAD_STALL_BOUND_MS = 100
HOME_PYTHON = os.path.realpath(sys.executable).startswith(("/root/", "/home/"))


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
            # a Python installed under a home directory (pyenv) must stay readable
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
                    "PYTHONUNBUFFERED=1\n"
                    f"FLANNEL_UDP_OPTIONS=--engine {self.engine} {extra}\n")

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

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

    def flannel_ip(self) -> str:
        with open(os.path.join(self.dir, "subnet.env")) as f:
            env = dict(line.strip().split("=", 1) for line in f if "=" in line)
        return env["FLANNEL_SUBNET"].rsplit(".", 1)[0] + ".0"


@pytest.fixture
def unit(engine_kind):
    require(systemd_box.missing() is None, f"a systemd box: {systemd_box.missing()}")
    for ov in overlay_of(engine_kind, ()):
        ov.add_host(engine=engine_kind, args=QUEUES.split())
        h0 = ov.add_host(start=False)
        with systemd_box.SystemdBox() as box:
            u = Unit(ov, h0, box, engine_kind)
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
    net = u.flannel_ip().rsplit(".", 1)[0] + ".0-24"
    r = u.ov.etcdctl("get", f"{u.ov.prefix}/subnets/{net}", "-w", "json")
    return int(json.loads(r.stdout)["kvs"][0]["mod_revision"])


def _across(u, action, seconds: float = 6.0):
    peer = u.ov.hosts[0]
    return restart_traffic.across(u.ov.tb, u.host, peer, u.flannel_ip(), u.ov.flannel_ip(peer),
                                  action, seconds)


def _takes_over_without_loss(u, figure, what: str, action, bound_ms: int, way: str):
    assert u.stored_fds() == 2 * 2 + 1, u.log()[-3000:]
    before = (ifindex(u), u.flannel_ip(), lease_revision(u), u.main_pid())
    if u.engine == "c":
        assert "tun_tso" in u.log() and "udp_gro" in u.log()
    out = _across(u, lambda: action(before[3]))
    figure(f"{u.engine}: {what}, 2 queues", out.summary())
    log = u.log()
    assert f"through {way}" in log, log[-3000:]
    assert out.tcp_problems() == [], out.details()
    assert out.udp_lost() == {"a->b": 0, "b->a": 0}, out.details()
    for direction, gap in out.tcp_max_gap_ms().items():
        assert gap <= bound_ms, f"TCP {direction} silent {gap} ms: {out.details()}"
    after = (ifindex(u), u.flannel_ip(), lease_revision(u), u.main_pid())
    assert after[:3] == before[:3] and after[3] not in (0, before[3])
    assert "nothing written to etcd" in log
    assert u.stored_fds() == 2 * 2 + 1          # the same fds, not a second copy
    return u


def test_systemctl_restart_loses_nothing(unit, figure):
    _takes_over_without_loss(unit, figure, "systemctl restart (fd store)",
                             lambda _pid: unit.systemctl("restart"), RESTART_STALL_BOUND_MS,
                             "systemd's fd store")


def test_systemctl_reload_loses_nothing(unit, figure):
    u = unit

    def reload(old_pid):
        u.systemctl("reload")
        wait_until(lambda: u.main_pid() not in (0, old_pid) and "Exiting: pid" in u.log(), 30,
                   0.05, "the new daemon to take over and be the main process")

    _takes_over_without_loss(u, figure, "systemctl reload (handover socket)", reload,
                             RELOAD_STALL_BOUND_MS, "the handover socket")
    assert u.box.show(UNIT, "ActiveState")["ActiveState"] == "active"
    # the new main process is a complete daemon: systemd's restart takes over from it
    u.systemctl("restart")
    assert u.log().count("through systemd's fd store") == 1


def test_crash_keeps_flannel0(unit, figure):
    """SIGKILL hands nothing over, but systemd still holds the fds: flannel0 and its route stay,
    the kernel queues what fits, and the restarted daemon (RestartSec later) takes over."""
    u = unit
    before = (ifindex(u), u.main_pid())

    def crash():
        u.systemctl("kill", "--signal=KILL")
        wait_until(lambda: u.main_pid() not in (0, before[1]), 30, 0.1,
                   "systemd to restart the daemon")
        wait_until(lambda: u.log().count("Took over from pid") >= 1, 30, 0.1, "the takeover")

    out = _across(u, crash, seconds=12.0)
    a = out.counters["a"]
    figure(f"{u.engine}: SIGKILL under systemd (Restart=on-failure), 2 queues",
           f"{out.summary()}; on h0 the kernel dropped {a.get('flannel0_tx_dropped')} packet(s) "
           f"at flannel0's full queues and {a.get('udp_RcvbufErrors')} datagram(s) at full "
           "socket buffers")
    assert ifindex(u) == before[0]
    assert out.tcp_problems() == [], out.details()
    for direction, r in out.udp.items():
        assert r["ended"] and r["distinct"] > 0, f"UDP {direction}: {out.details()}"
    # what was lost is what did not fit in the kernel's queues, or was in the killed engine's
    # hands (a batch per queue)
    in_hands = 2 * DEFAULT_BATCH
    assert out.udp_lost()["a->b"] <= a["flannel0_tx_dropped"] + in_hands, out.details()
    assert out.udp_lost()["b->a"] <= a["udp_RcvbufErrors"] + in_hands, out.details()


def test_restart_with_another_config_starts_afresh(unit):
    """--queues changed in the env file: the new process says why it does not take over, drops
    the old fds from the store and makes flannel0 again (under the same name)."""
    u = unit
    before = ifindex(u)
    u.options("--queues 1")
    u.systemctl("restart")
    log = u.log()
    assert "Not taking over flannel0 and the UDP sockets from systemd's fd store: flannel0 has " \
           "2 queue(s)" in log, log[-3000:]
    assert ifindex(u) != before
    assert u.stored_fds() == 2 * 1 + 1
    peer = u.ov.hosts[0]
    wait_until(lambda: u.ov.ping(u.host, u.ov.flannel_ip(peer), count=1)["received"] == 1, 10,
               what="traffic through the new flannel0")
    # and `systemctl stop` lets flannel0 go: the store is closed with the unit
    u.systemctl("stop")
    wait_until(lambda: u.ov.exec(u.host, ["ip", "link", "show", "flannel0"]).returncode != 0, 10,
               what="flannel0 to go with systemctl stop")
