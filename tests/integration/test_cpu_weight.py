"""A testbed process in a cgroup of its own at a CPU weight (dataplane/testbed/cpu_weight.py), as
systemd runs the shipped unit: in the group from its start (its threads and children too), at
the weight systemd's conversion gives, and nothing left behind: a group is removed with what
still runs in it moved out, and a dead run's groups are swept, a live run's kept."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dataplane.testbed import cpu_weight
from dataplane.testbed import hosts
from tests.conftest import require, require_etcd, require_root

pytestmark = [pytest.mark.root]

# prints its cgroup line of the cpu controller, and a child's: both in the group from the start
CHILD = r"""
import subprocess, sys, threading
def cpu_line(pid="self"):
    lines = open(f"/proc/{pid}/cgroup").read().splitlines()
    return next(l for l in lines if l.split(":")[1] in ("cpu", "cpu,cpuacct", ""))
got = []
t = threading.Thread(target=lambda: got.append(cpu_line(f"self/task/{threading.get_native_id()}")))
t.start(); t.join()
child = subprocess.run(["cat", "/proc/self/cgroup"], capture_output=True, text=True).stdout
print(cpu_line(), got[0], [l for l in child.splitlines() if l == cpu_line()] != [], sep="\n")
sys.stdout.flush()
sys.stdin.read()
"""


@pytest.fixture
def controller():
    require_root()
    try:
        root, version = cpu_weight._controller()
    except cpu_weight.CpuWeightError as e:
        require(False, str(e))
    return root, version


def _weight_of(group: cpu_weight.CpuGroup) -> int:
    if group.version == "v1":
        with open(os.path.join(group.path, "cpu.shares")) as f:
            return int(f.read()) * cpu_weight.DEFAULT_WEIGHT // 1024
    with open(os.path.join(group.path, "cpu.weight")) as f:
        return int(f.read())


def test_a_process_is_in_its_group_from_its_start(controller):
    with hosts.Testbed(hosts=1) as tb, cpu_weight.CpuGroup(300) as group:
        assert _weight_of(group) == 300
        proc = tb.popen(tb.hosts[0], [sys.executable, "-c", CHILD], wrap=group.wrap,
                        stdin=subprocess.PIPE)
        try:
            lines = [proc.stdout.readline().strip() for _ in range(3)]
            name = os.path.basename(group.path)
            assert lines[0].endswith("/" + name), lines         # the process, before any thread
            assert lines[1].endswith("/" + name), lines         # a thread it made
            assert lines[2] == "True", lines                    # a child it started
            assert group.pids() == [proc.pid]                   # the same PID: the shell exec'd it
        finally:
            tb.kill(proc)
    assert not os.path.exists(group.path)


def test_close_moves_a_live_process_out_and_removes_the_group(controller):
    group = cpu_weight.CpuGroup(150)
    proc = subprocess.Popen(group.wrap(["sleep", "30"]))
    try:
        deadline = time.monotonic() + 5
        while group.pids() != [proc.pid] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert group.pids() == [proc.pid]
        group.close()
        assert not os.path.exists(group.path)
        assert proc.poll() is None                              # moved out, not killed
    finally:
        proc.kill()
        proc.wait()
        group.close()


def test_a_dead_runs_groups_are_swept_a_live_runs_kept(controller):
    root, _ = controller
    dead = subprocess.Popen(["true"])
    dead.wait()                                                 # its PID is free now
    stale = os.path.join(root, f"{cpu_weight.PREFIX}-{dead.pid}-1")
    live = os.path.join(root, f"{cpu_weight.PREFIX}-{os.getppid()}-999999")
    os.mkdir(stale)
    os.makedirs(live, exist_ok=True)
    try:
        gone = cpu_weight.sweep_stale(root)
        assert os.path.basename(stale) in gone and not os.path.exists(stale)
        assert os.path.exists(live)
    finally:
        for path in (stale, live):
            if os.path.exists(path):
                os.rmdir(path)


def test_an_overlay_runs_each_daemon_at_its_weight(controller):
    require_etcd()
    from dataplane.testbed.overlay import Overlay
    with Overlay(hosts=1, engine="python", cpu_weight=300) as ov:
        d = ov.daemon(ov.hosts[0])
        (group,) = ov._cpu_groups
        assert d.pid in group.pids() and _weight_of(group) == 300
    assert not os.path.exists(group.path)
