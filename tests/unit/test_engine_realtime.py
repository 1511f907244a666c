"""--realtime-priority: the engines' loop threads run SCHED_FIFO when asked (both engines), the
caller's thread does not, and a refused request is a clear error (host/sched.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import pytest

from dataplane.engine import ipv4
from dataplane.host import sched
from tests.conftest import require, require_root
from tests.engine_harness import Harness, assert_forwarded

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def started_and_forwarding(h: Harness) -> None:
    """Start the engine, then check that it forwards one packet."""
    h.engine.start()
    p = h.add_peer()
    h.set_routes([h.route("10.5.2.0/24", p)])
    pkt = ipv4.build("10.5.1.2", "10.5.2.3", ipv4.udp_payload(1, 2, b"rt"))
    h.inject_tun(pkt)
    h.wait_for(lambda st: len(p.received) == 1, what="the packet")
    assert_forwarded(pkt, p.received[0])


def test_loop_thread_is_fifo_and_forwards(engine_kind):
    require_root()
    tids = []
    init = sched.thread_init(3)

    def recording():
        tids.append(threading.get_native_id())
        init()

    with Harness(engine_kind, start=False) as h:
        h.engine.thread_init = recording
        started_and_forwarding(h)
        assert len(tids) == 1 and tids[0] != threading.get_native_id()
        assert os.sched_getscheduler(tids[0]) == os.SCHED_FIFO
        assert os.sched_getparam(tids[0]).sched_priority == 3
    assert os.sched_getscheduler(0) == os.SCHED_OTHER       # the caller's thread untouched


def test_a_failing_thread_init_leaves_the_loop_running(engine_kind):
    def refuse():
        raise sched.SchedError(1, "refused for the test")

    with Harness(engine_kind, start=False) as h:
        h.engine.thread_init = refuse
        started_and_forwarding(h)
        assert not h.engine.join(0)              # still running


def test_off_means_no_init_and_range_is_checked():
    assert sched.thread_init(0) is None
    for bad in (-1, 100):
        with pytest.raises(ValueError):
            sched.thread_init(bad)


def test_probe_leaves_the_caller_alone():
    require_root()
    sched.probe(1)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_refused_without_the_capability():
    """Without CAP_SYS_NICE (a child whose bounding set lacks it: root, but as under the shipped
    unit), the probe fails with a message that names the capability and the unit's setting."""
    require_root()
    require(shutil.which("setpriv") is not None, "needs setpriv (util-linux)")
    code = ("from dataplane.host import sched\n"
            "try:\n    sched.probe(1)\n    print('no error')\n"
            "except sched.SchedError as e:\n    print(e)\n")
    r = subprocess.run(["setpriv", "--bounding-set", "-sys_nice", "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=30, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr
    assert "CAP_SYS_NICE" in r.stdout and "RestrictRealtime" in r.stdout, r.stdout
