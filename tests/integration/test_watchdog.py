"""Liveness under a real systemd (root, namespaces, real etcd and TUN; the unit in packaging/ run by
tests/integration/systemd_box.py): a daemon whose engine loop thread hangs answers /healthz with
503 naming that loop, stops sending WATCHDOG=1, and systemd's watchdog (WatchdogSec=) kills it;
Restart= starts it again and the new process takes flannel0 and the sockets over from the fd
store, so what is lost is what the kernel's queues could not hold meanwhile, as for any crash
(tests/integration/test_systemd_restart_fallbacks.py).

The hang is the daemon's test hook ($FLANNEL_UDP_TEST_STALL=1: queue 1's loop thread is held
from its start; daemon/liveness.py), set in the environment file for one start only. The
drop-in's WatchdogSec is small so that the whole runs in seconds: the daemon sees the stall after
STALL_AFTER_MIN_S, systemd WATCHDOG_S after the last WATCHDOG=1.
"""
from __future__ import annotations

import time

import pytest

from dataplane.daemon.liveness import TEST_STALL_ENV
from tests.conftest import wait_until
from tests.integration.systemd_unit import QUEUES, UNIT, across, ifindex, unit_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]

WATCHDOG_S = 3


@pytest.fixture
def unit(engine_kind):
    yield from unit_of(engine_kind)


def _healthz(u, port):
    return u.ov.healthz(u.host, "/healthz", port=port)


def test_a_stalled_loop_fails_healthz_and_the_watchdog_restarts_the_daemon(unit, figure):
    u = unit
    port = u.ov.healthz_port
    u.dropin("watchdog", f"WatchdogSec={WATCHDOG_S}\nRestartSec=1\n")

    def env(stall: bool):
        u.options(QUEUES)
        with open(u.env_file, "a") as f:
            f.write(f"FLANNELD_HEALTHZ_PORT={port}\n" + (f"{TEST_STALL_ENV}=1\n" if stall else ""))

    env(stall=False)
    u.systemctl("restart")              # with the drop-in and /healthz
    assert _healthz(u, port) == (200, "flanneld is running")
    before = ifindex(u)
    seen = {}

    def stall_and_watchdog():
        env(stall=True)
        u.systemctl("restart")          # takes over from the fd store, queue 1 held
        stalled = u.main_pid()
        env(stall=False)                # the watchdog's restart runs without the hook
        seen["healthz"] = wait_until(lambda: (lambda r: r[0] == 503 and r)(_healthz(u, port)),
                                     15, 0.1, "/healthz to fail")
        wait_until(lambda: u.main_pid() not in (0, stalled), 30, 0.1,
                   "systemd's watchdog to restart the daemon")
        wait_until(lambda: u.log().count("Took over from pid") >= 3, 30, 0.1, "the takeover")

    out = across(u, stall_and_watchdog)
    status, body = seen["healthz"]
    assert f"{u.engine} engine's loop of queue 1 has not progressed for" in body, body
    assert "queue 0" not in body and "main loop" not in body, body
    assert "held (a test's stall)" in u.log()
    # one restart of systemd's own, and it came with SIGABRT, the watchdog's signal:
    # faulthandler's dump of the hung daemon's threads
    assert u.box.show(UNIT, "NRestarts")["NRestarts"] == "1"
    assert "Fatal Python error: Aborted" in u.log(), u.log()[-3000:]
    # the restarted daemon is healthy and forwards on the same flannel0
    assert ifindex(u) == before
    wait_until(lambda: _healthz(u, port) == (200, "flanneld is running"), 10, 0.1,
               "/healthz to answer 200 again")
    a = out.counters["a"]
    figure(f"{u.engine}: queue 1 hung, restarted by systemd's watchdog (WatchdogSec="
           f"{WATCHDOG_S}, RestartSec=1), 2 queues",
           f"{out.summary()}; on h1 the kernel dropped {a.get('flannel0_tx_dropped')} packet(s) at "
           f"flannel0's full queues and {a.get('udp_RcvbufErrors')} datagram(s) at full socket "
           "buffers")
    assert out.tcp_problems() == [], out.details()
    for direction, r in out.udp.items():
        assert r["ended"] and r["distinct"] > 0, f"UDP {direction}: {out.details()}"
    out.assert_lost_only_what_the_kernel_dropped()


@pytest.fixture
def c_unit():
    """One engine is enough: what is checked is who notifies systemd, not the forwarding."""
    yield from unit_of("c")


def test_the_daemon_a_reload_starts_keeps_the_watchdog_fed(c_unit):
    """systemctl reload makes the new process the unit's main one (MAINPID=): it inherits the
    watchdog's variables from the old one and notifies in its place."""
    u = c_unit
    u.dropin("watchdog", f"WatchdogSec={WATCHDOG_S}\n")
    u.systemctl("restart")
    old = u.main_pid()
    u.systemctl("reload")
    new = wait_until(lambda: u.main_pid() not in (0, old) and u.main_pid(), 10, 0.05,
                     "the new daemon to be the main process")
    # longer than the watchdog's limit twice over: a main process that did not notify would
    # have been killed and restarted by now
    wait_until(lambda: "Exiting: pid" in u.log(), 10, 0.1, "the old daemon to exit")
    time.sleep(2.5 * WATCHDOG_S)
    assert u.main_pid() == new
    assert u.box.show(UNIT, "NRestarts")["NRestarts"] == "0"
    assert "Fatal Python error" not in u.log(), u.log()[-3000:]
