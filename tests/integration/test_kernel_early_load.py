"""A fresh daemon loads the kernel path's programs while its start talks to etcd
(daemon/early_load.py, docs/kernel-path.md#maps-at-scale).

A real etcd without the network config keeps a `--engine kernel` daemon waiting for it: its
programs are loaded already meanwhile (the process holds their fds), and once the config is
there the programs it attaches are those (the same kernel program ids), not a second load.
A daemon stopped while it waits exits 0, as before.
"""
from __future__ import annotations

import os
import signal

import pytest

from dataplane.testbed.wait import wait_for
from tests.conftest import require_bpf, require_engine, require_overlay

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.68.0.0/16", "Backend": {"Type": "udp"}}
WAITING = "flannel config not found in etcd"
SAYS_KERNEL = "kernel path: the tc programs forward on flannel0"


def prog_ids(pid: int) -> set:
    """The ids of the BPF programs process ``pid`` holds an fd of."""
    ids = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                ids |= {int(line.split()[1]) for line in f if line.startswith("prog_id:")}
        except OSError:                 # closed meanwhile
            continue
    return ids


@pytest.fixture
def ov():
    require_bpf()
    require_engine("c")
    require_overlay()
    from dataplane.testbed.overlay import Overlay
    overlay = Overlay(hosts=0, engine="kernel", config=CONFIG, put_config=False)
    try:
        yield overlay
    finally:
        overlay.close()


def test_programs_load_while_the_start_waits_for_etcd(ov):
    h = ov.add_host(start=False)
    d = ov.start_daemon(h, wait=False)
    assert wait_for(lambda: WAITING in d.log_text() or not d.running(), 30), d.log_text()[-3000:]
    assert wait_for(lambda: len(prog_ids(d.pid)) == 2, 20), d.log_text()[-3000:]
    early = prog_ids(d.pid)
    ov.put_config(CONFIG)
    ov.wait_ready(h)
    log = d.log_text()
    assert SAYS_KERNEL in log, log[-3000:]
    assert prog_ids(d.pid) == early, log[-3000:]


def test_stopped_while_waiting_exits_cleanly(ov):
    h = ov.add_host(start=False)
    d = ov.start_daemon(h, wait=False)
    assert wait_for(lambda: WAITING in d.log_text() or not d.running(), 30), d.log_text()[-3000:]
    assert ov.stop_daemon(h, sig=signal.SIGTERM, timeout=20) == 0
    assert "Stopped before startup completed" in d.log_text()
