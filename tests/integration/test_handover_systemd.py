"""`systemctl restart` with the unit in packaging/: systemd's fd store keeps flannel0's queues,
the UDP sockets and the daemon's state across the restart (root, namespaces, real etcd and TUN,
and a real systemd: tests/integration/systemd_box.py, since the machine's PID 1 need not be one).

::

      h1: systemd box -> flannel-udp.service (tests/integration/systemd_unit.py: packaging/'s
          unit, ExecStart pointed at this checkout, NetworkNamespacePath=h1, the env file with
          the overlay's etcd and h1's veth)
       ||  paced UDP both ways, TCP both ways (tests/integration/restart_traffic.py)
      h0: flannel-udp (the testbed's)

Both hosts run the engine under test with two queues and, for the C engine, the offloads on.
`systemctl restart` must lose no datagram, never reset the TCP streams nor leave them silent
for longer than the restart itself took, as the daemons logged it (SIGTERM to the old one, to
"Took over" by the new one: systemd starts the new process once the old one has exited, so the
silence is the new one's start, mostly its interpreter and imports, which differ between
machines of one kind by 3x) plus RESTART_MARGIN_MS, and never longer than RESTART_STALL_CAP_MS;
keep flannel0 (the same device) and the lease (no write to etcd). `systemctl reload` (the unit's
upgrade in place: the old daemon starts the new one, which takes over through the handover
socket) must do the same within RELOAD_STALL_BOUND_MS, and leave the new daemon as the unit's
main process; and it applies the environment file as edited since the start (a bad flag there
fails the reload and leaves the daemon as it is). (A crash and a changed config:
tests/integration/test_systemd_restart_fallbacks.py.)

Dual stack (EnableIPv6, both hosts with an IPv6 underlay): the fd store holds the IPv6 sockets
too, and `systemctl restart` hands the new daemon those very sockets: the streams, over flannel0's
IPv6 addresses and so over the IPv6 underlay, lose nothing either.
"""
from __future__ import annotations

import os
import re
from datetime import datetime

import pytest

from tests.conftest import wait_until
from tests.integration.test_dual_stack_netns import udp_out
from tests.integration.systemd_unit import (QUEUES, UNIT, across, ifindex, lease_revision,
                                            unit_of)

pytestmark = [pytest.mark.root, pytest.mark.etcd]

RESTART_MARGIN_MS = 250
RESTART_STALL_CAP_MS = 3000
RELOAD_STALL_BOUND_MS = 100


@pytest.fixture
def unit(engine_kind):
    yield from unit_of(engine_kind)


def _logged_at(log: str, text: str) -> datetime:
    """When the daemon's log line holding ``text`` was written (the last such line)."""
    stamps = re.findall(r"^(\S+ \S+) \S+ [\w.]+: .*" + re.escape(text), log, re.M)
    assert stamps, f"no log line with {text!r}: {log[-3000:]}"
    return datetime.fromisoformat(stamps[-1])


def _restart_window_ms(log: str) -> float:
    """From the old daemon's SIGTERM to the new one forwarding, by their own log lines."""
    stop = _logged_at(log, "Received SIGTERM")
    took_over = _logged_at(log, "Took over from pid")
    return (took_over - stop).total_seconds() * 1000


def _takes_over_without_loss(u, figure, what: str, action, bound_ms, way: str,
                             ipv6: bool = False):
    """``ipv6``: a dual-stack unit, the streams over IPv6 (a third socket per queue stored)."""
    stored = 2 * (3 if ipv6 else 2) + 1
    assert u.stored_fds() == stored, u.log()[-3000:]
    before = (ifindex(u), u.flannel_ip(), lease_revision(u), u.main_pid())
    if u.engine == "c":
        assert "tun_tso" in u.log() and "udp_gro" in u.log()
    out = across(u, lambda: action(before[3]), ipv6=ipv6)
    log = u.log()
    if callable(bound_ms):
        bound_ms = bound_ms(log)
    figure(f"{u.engine}: {what}, 2 queues{', IPv6' if ipv6 else ''}",
           f"{out.summary()}; allowed {bound_ms:.0f} ms")
    assert f"through {way}" in log, log[-3000:]
    assert out.tcp_problems() == [], out.details()
    assert out.udp_lost() == {"a->b": 0, "b->a": 0}, out.details()
    for direction, gap in out.tcp_max_gap_ms().items():
        assert gap <= bound_ms, f"TCP {direction} silent {gap} ms: {out.details()}"
    after = (ifindex(u), u.flannel_ip(), lease_revision(u), u.main_pid())
    assert after[:3] == before[:3] and after[3] not in (0, before[3])
    assert "nothing written to etcd" in log
    assert u.stored_fds() == stored             # the same fds, not a second copy
    return out


def test_systemctl_restart_loses_nothing(unit, figure):
    _takes_over_without_loss(unit, figure, "systemctl restart (fd store)",
                             lambda _pid: unit.systemctl("restart"), _restart_bound_ms,
                             "systemd's fd store")


@pytest.fixture
def unit6(engine_kind):
    yield from unit_of(engine_kind, dual_stack=True)


def test_systemctl_restart_keeps_the_ipv6_underlay(unit6, figure):
    u = unit6
    held = udp6_sockets(u, u.main_pid())
    assert len(held) == 2, (held, u.log()[-3000:])
    v4, v6 = udp_out(u.ov, u.host)
    out = _takes_over_without_loss(u, figure, "systemctl restart (fd store)",
                                   lambda _pid: u.systemctl("restart"), _restart_bound_ms,
                                   "systemd's fd store", ipv6=True)
    log = u.log()
    assert "through systemd's fd store: forwarding on flannel0 (2 queue(s), the IPv6 " \
           "underlay's 2 socket(s))" in log, log[-3000:]
    assert "No IPv6 underlay" not in log, log[-3000:]
    assert udp6_sockets(u, u.main_pid()) == held    # the very sockets, not new ones
    # the streams went over the IPv6 underlay: IPv6 datagrams out of h1, next to no IPv4 ones
    v4_after, v6_after = udp_out(u.ov, u.host)
    assert v6_after - v6 >= out.udp["a->b"]["sent"] // 64 and v4_after - v4 < 50, \
        (v4, v4_after, v6, v6_after, out.udp["a->b"]["sent"])


def udp6_sockets(u, pid: int) -> set:
    """The inodes of the IPv6 UDP sockets of the unit's host that ``pid`` holds."""
    table = u.ov.exec(u.host, ["cat", "/proc/net/udp6"]).stdout.splitlines()[1:]
    bound = {row.split()[9] for row in table}
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in bound:
            held.add(link[8:-1])
    return held


def _restart_bound_ms(log: str) -> float:
    window = _restart_window_ms(log)
    assert window < RESTART_STALL_CAP_MS, f"the restart took {window:.0f} ms: {log[-3000:]}"
    return window + RESTART_MARGIN_MS


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


@pytest.fixture
def c_unit():
    """One engine is enough for what the reload runs with (the forwarding is the test above's)."""
    yield from unit_of("c")


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")


def _environ(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(v.split("=", 1) for v in f.read().decode().split("\0") if "=" in v)


def test_systemctl_reload_applies_the_edited_environment_file(c_unit):
    u = c_unit
    old_pid = u.main_pid()
    new_port = u.ov.healthz_port + 1
    # a flag the daemon cannot start with: the reload fails and changes nothing
    u.options(f"{QUEUES} --queues=lots")
    r = u.systemctl("reload", check=False)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "flannel-udp reload: error" in u.log() and "--queues" in u.log(), u.log()[-3000:]
    assert u.main_pid() == old_pid and "Reload asked" not in u.log()
    # the edit an operator makes: more logging, and /healthz on a port
    u.options(f"{QUEUES} -v=2")
    with open(u.env_file, "a") as f:
        f.write(f"FLANNELD_HEALTHZ_PORT={new_port}\n")
    u.systemctl("reload")           # returns once the new process forwards
    new_pid = wait_until(lambda: u.main_pid() not in (0, old_pid) and u.main_pid(), 10, 0.05,
                         "the new daemon to be the main process")
    log = u.log()
    assert "Reload asked by pid" in log and "FLANNELD_HEALTHZ_PORT" in log, log[-3000:]
    assert "through the handover socket" in log and "nothing written to etcd" in log
    assert "-v=2" in _cmdline(new_pid) and "--handover" in _cmdline(new_pid)
    assert _environ(new_pid).get("FLANNELD_HEALTHZ_PORT") == str(new_port)
    # and it runs with them: /healthz answers on the port the file names now
    status, body = wait_until(lambda: (lambda r: r[0] == 200 and r)(
        u.ov.healthz(u.host, "/healthz", port=new_port)), 10, 0.1, "/healthz on the new port")
    assert "running" in body
    assert u.box.show(UNIT, "ActiveState")["ActiveState"] == "active"
