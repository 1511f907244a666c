"""What `systemctl restart` cannot hand over, with the unit in packaging/ under a real systemd
(root, namespaces, real etcd and TUN; tests/integration/systemd_unit.py):

* a crash (SIGKILL): nothing is handed over, but systemd still holds flannel0's queues and the
  sockets; the kernel keeps what fits while the daemon is restarted (RestartSec=5), and the new
  daemon takes over: what is lost is exactly what did not fit (a figure of the run);
* a changed config (--queues): the new daemon says why it does not take over, drops the old fds
  from the store and makes flannel0 again, under the same name; `systemctl stop` lets it go.
"""
from __future__ import annotations

import pytest

from tests.conftest import wait_until
from tests.integration.systemd_unit import across, ifindex, unit_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]


@pytest.fixture
def unit(engine_kind):
    yield from unit_of(engine_kind)


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

    out = across(u, crash)
    a = out.counters["a"]
    figure(f"{u.engine}: SIGKILL under systemd (Restart=on-failure), 2 queues",
           f"{out.summary()}; on h0 the kernel dropped {a.get('flannel0_tx_dropped')} packet(s) "
           f"at flannel0's full queues and {a.get('udp_RcvbufErrors')} datagram(s) at full "
           "socket buffers")
    assert ifindex(u) == before[0]
    assert out.tcp_problems() == [], out.details()
    for direction, r in out.udp.items():
        assert r["ended"] and r["distinct"] > 0, f"UDP {direction}: {out.details()}"
    out.assert_lost_only_what_the_kernel_dropped()


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
