"""dataplane/testbed/netns.py dead_run_names: what a dead run left behind, and only that."""
from __future__ import annotations

import os
import subprocess
import sys

from dataplane.testbed.netns import dead_run_names


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_only_names_of_dead_creators_of_that_kind():
    dead, me, parent = _dead_pid(), os.getpid(), os.getppid()
    names = [f"fu-tb-{dead}-abc", f"fu-tb-{me}-abc", f"fu-tb-{parent}-x", f"fu-sd-{dead}-1",
             f"fu-tb-{dead}", "fu-tb-x-1-2", f"other-tb-{dead}-1", "flannel0", f"fu-tb-{dead}-a-b"]
    assert dead_run_names(names, "tb") == [f"fu-tb-{dead}-abc", f"fu-tb-{dead}-a-b"]
    assert dead_run_names(names, "sd") == [f"fu-sd-{dead}-1"]
