"""What a running daemon's log says while etcd is away: one line when it goes (with the cause), a
reminder at a slow pace (how long, how many peers it still forwards to), one line when it is back;
not a line per watch per second.

Two hosts running one engine (both engines in turn), each daemon given two etcd endpoints: the real
one and one where nothing listens, so that the endpoint switches are in the outage too. The reminder's
pace is shortened through the environment (control/recurring.py) so that a short outage shows it.
"""
from __future__ import annotations

import re
import time

import pytest

from dataplane.control.recurring import REMIND_ENV
from tests.conftest import require_overlay, wait_until
from tests.integration.daemon_checks import log_mark

pytestmark = [pytest.mark.root, pytest.mark.etcd]

# The watches retry every second: a 5 s outage is five failures of each, enough for the line a
# second this test guards against to show (well over the handful allowed below), and with a
# reminder every 2 s it leaves room for at least one reminder after the first line.
OUTAGE_S = 5.0
REMIND_S = 2.0
LEVEL = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ", re.M)


@pytest.fixture(scope="module")
def ov():
    require_overlay()
    from dataplane.testbed.overlay import Overlay
    overlay = Overlay(hosts=0)
    try:
        for _ in range(2):
            h = overlay.add_host(start=False)
            # a host that forwards: the daemon's reminders of forwarding off would be said
            # during the outage too (docs/operating.md#host-forwarding)
            h.exec(["sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
        yield overlay
    finally:
        overlay.close()


def test_an_outage_is_said_once_reminded_slowly_and_said_over(ov, engine_kind):
    a, b = ov.hosts
    dead = f"http://{ov.tb.switch_ip}:1"            # nothing listens there
    args = ("--etcd-endpoints", f"{ov.etcd_url},{dead}")
    try:
        for h in (a, b):
            ov.start_daemon(h, engine=engine_kind, args=args, wait=False,
                            env={REMIND_ENV: str(REMIND_S)})
        for h in (a, b):
            ov.wait_ready(h)
        assert ov.reachable(a, ov.flannel_ip(b))
        marks = {h.name: log_mark(ov, h) for h in (a, b)}
        ov.stop_etcd()
        try:
            time.sleep(OUTAGE_S / 2)
            # forwarding goes on with the routes known
            assert ov.ping(a, ov.flannel_ip(b), count=3)["received"] == 3
            assert ov.ping(b, ov.flannel_ip(a), count=3)["received"] == 3
            time.sleep(OUTAGE_S / 2)
        finally:
            ov.start_etcd()
        for h in (a, b):
            wait_until(lambda h=h: "etcd unreachable: recovered after" in
                       ov.daemon(h).log_text()[marks[h.name]:],
                       timeout=20, what=f"{h.name} to say etcd is back")
        time.sleep(0.5)                              # the other registry's line, if any
        for h in (a, b):
            check_outage_lines(ov.daemon(h).log_text()[marks[h.name]:], engine_kind)
        assert ov.ping(a, ov.flannel_ip(b), count=1)["received"] == 1
    finally:
        for h in (a, b):
            ov.stop_daemon(h)


def check_outage_lines(log: str, engine_kind: str) -> None:
    # The Python engine's peer watch runs in a process of its own, with its own etcd client.
    clients = 2 if engine_kind == "python" else 1
    said = [line for line in log.splitlines()
            if (m := LEVEL.match(line)) and m.group(1) != "DEBUG"]
    first = [s for s in said if " WARNING " in s and "etcd unreachable: " in s
             and "still failing" not in s]
    reminders = [s for s in said if "etcd unreachable: still failing after" in s]
    back = [s for s in said if "etcd unreachable: recovered after" in s]
    switches = [s for s in said if " WARNING " in s and "switching to" in s]
    assert 1 <= len(first) <= clients, said
    assert "is etcd running and are --etcd-endpoints right?" in first[0]
    assert "Connection refused" in log or "Socket closed" in log, said   # the cause
    # a reminder every REMIND_S, saying how long and what the host forwards to meanwhile
    assert 1 <= len(reminders) <= clients * (OUTAGE_S / REMIND_S + 2), said
    assert any("peer(s) known" in s and "1 peer" in s for s in reminders), reminders
    assert 1 <= len(back) <= clients, said
    assert len(switches) <= 2 * clients, said        # once per endpoint, not per attempt
    # Everything else said meanwhile is a handful of lines, however long the outage: before,
    # every watch and the endpoint switcher said a line a second (about 3 a second here).
    others = [s for s in said if s not in first + reminders + back + switches]
    assert len(others) <= 3, others
    print(f"{engine_kind}: {len(said)} lines in a {OUTAGE_S:.0f} s outage, "
          f"{len(reminders)} of them reminders:\n" + "\n".join(said))
