"""A lease move that fails on the real host is retried, not fatal (root, real etcd and netlink).

::

      h0 (engine E)                 h1 (engine E)
      flannel0 10.5.a.0 -> 10.5.c.0 flannel0 10.5.b.0

Another node (192.168.77.99, not a host here) takes h0's subnet while h0's daemon may open no
more file descriptors (its RLIMIT_NOFILE lowered to what it holds, with prlimit): the netlink
socket that would move flannel0's address cannot be opened, as on a host out of descriptors.
The daemon must log it with what to do, count it and keep running on its old engine; once the
limit is back, the next try completes the move. Unit tests with fakes cover each step
(tests/unit/test_lease_move_failures.py).
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import time

import pytest

from dataplane.control.lease import LeaseAttrs
from tests.conftest import require, wait_until
from tests.integration.conftest import overlay_of
from tests.integration.daemon_checks import logged

pytestmark = [pytest.mark.root, pytest.mark.etcd]

TAKER = "192.168.77.99"


@pytest.fixture
def ov(engine_kind):
    yield from overlay_of(engine_kind, (engine_kind, engine_kind))


def _soft_nofile(pid: int, limit=None) -> int:
    """Set the soft RLIMIT_NOFILE of `pid` to `limit` (if given); returns the one it had."""
    with open(f"/proc/{pid}/limits") as f:
        soft = int(next(l for l in f if l.startswith("Max open files")).split()[3])
    if limit is not None:
        subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={limit}:"], check=True, timeout=10)
    return soft


def test_lease_move_with_netlink_failing_is_retried_until_it_works(ov, figure):
    require(shutil.which("prlimit") is not None, "needs prlimit (util-linux)")
    h, peer = ov.hosts
    d = ov.daemon(h)
    old = ov.subnet(h)
    # no new descriptor for the daemon from here on
    soft = _soft_nofile(d.pid, len(os.listdir(f"/proc/{d.pid}/fd")))
    try:
        ov.put(f"subnets/{old.network_address}-{old.prefixlen}",
               LeaseAttrs(ipaddress.IPv4Address(TAKER)).to_json())
        assert ov.wait_log(h, "Moving to the new lease: ", 20), d.log_text()[-3000:]
        time.sleep(2.5)                                    # two more monitor ticks, failing
        assert d.running(), d.log_text()[-3000:]
        assert ov.subnet(h) == old                         # subnet.env moves with the host only
    finally:
        if d.running():
            _soft_nofile(d.pid, soft)
    new = wait_until(lambda: ov.subnet(h) != old and ov.subnet(h), 10, 0.2, "the move to finish")
    # no traceback through our code (pyroute2's half-made event loops print "Exception ignored"
    # ones from the garbage collector while descriptors are short; they end nothing)
    assert d.running() and "/dataplane/" not in d.log_text(), d.log_text()[-3000:]
    assert ov.reachable(peer, str(new.network_address), 10)
    m = ov.metrics(h)
    figure(f"{ov.kind}: failed move attempts before the limit was lifted",
           m["flannel_udp_lease_move_failures_total"])
    assert m["flannel_udp_lease_move_failures_total"] >= 2
    assert logged(ov, h, "Moving to the new lease: recovered after", "failed attempts",
                  f"the host is on {new}")
