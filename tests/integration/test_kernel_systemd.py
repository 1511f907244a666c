"""The kernel path under a real systemd (tests/integration/systemd_unit.py: packaging/'s unit,
whose bounding set has CAP_BPF and CAP_PERFMON; the box's root is read-only, so the programs
are compiled in the box's directory rather than the unit's CacheDirectory): the daemon attaches
them; `systemctl restart` loses nothing under
restart_traffic's streams, the new daemon adopting the pinned path and taking flannel0 and the
sockets from the fd store; after `systemctl stop` the path forwards with no process, and
`flannel-udp cleanup --kernel-path --env-file=<the unit's>` (what the package's removal runs)
finds it where only that file says (FLANNELD_BPF_PINS) and leaves no filter and no pin.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from dataplane.host.child import cli_argv
from tests.conftest import require_bpf, require_engine
from tests.integration.systemd_unit import across, ifindex, unit_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]


@pytest.fixture
def unit():
    require_bpf()
    require_engine("c")
    pins = None
    try:
        for u in unit_of("kernel", service="Environment=XDG_CACHE_HOME={dir}/cache\n"):
            pins = f"/sys/fs/bpf/{os.path.basename(u.dir)}"     # the unit's FLANNELD_BPF_PINS
            yield u
    finally:
        if pins is not None:            # a test that failed before its cleanup: no pin left
            shutil.rmtree(pins, ignore_errors=True)


def filters(u) -> str:
    return u.ov.exec(u.host, ["tc", "filter", "show", "dev", u.host.iface, "ingress"]).stdout


@pytest.mark.timeout(90)
def test_systemctl_restart_on_the_kernel_path(unit, figure):
    u = unit
    pins = f"/sys/fs/bpf/{os.path.basename(u.dir)}/flannel0"
    assert "fu_ingress" in filters(u), u.log()[-3000:]
    assert os.path.exists(f"{pins}/fu_ingress")
    before = (ifindex(u), u.main_pid())
    out = across(u, lambda: u.systemctl("restart"))
    figure("kernel: systemctl restart (fd store, the pinned path adopted), 2 queues",
           out.summary())
    log = u.log()
    assert "through systemd's fd store" in log and \
        f"kernel path: adopted the one pinned at {pins}" in log, log[-3000:]
    assert out.tcp_problems() == [], out.details()
    assert out.udp_lost() == {"a->b": 0, "b->a": 0}, out.details()
    assert ifindex(u) == before[0] and u.main_pid() not in (0, before[1])

    # stopped: the path forwards on; the removal finds it through the unit's env file
    u.systemctl("stop")
    peer = u.ov.hosts[0]
    assert u.ov.ping(peer, u.flannel_ip())["received"] == 3
    # in h1's network namespace only (`ip netns exec` would mount another /sys, without the
    # machine's bpffs where the unit's daemon pinned the path; so this /sys/class/net is the
    # machine's, and h1's persistent flannel0 goes with its namespace, not with this cleanup)
    r = subprocess.run(["nsenter", f"--net=/run/netns/{u.host.netns}", *cli_argv(
        "cleanup", "--kernel-path", f"--env-file={u.env_file}")], capture_output=True,
        text=True, timeout=60)
    assert r.returncode == 0 and f"pinned at {pins}" in r.stdout, r.stdout + r.stderr
    assert "fu_" not in filters(u)
    assert not os.path.exists(pins)
