"""The testbed itself: hosts come and go, and nothing is left after close().

Root only (network namespaces). No etcd, no engine.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import require_root

pytestmark = [pytest.mark.root, pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def _root():
    require_root()


def _ours(tb_prefix: str) -> list[str]:
    from dataplane.testbed import netns
    return [n for n in netns.list_netns() if n.startswith(tb_prefix)]


def _ping(tb, host, ip) -> bool:
    return tb.exec(host, ["ping", "-n", "-c", "1", "-W", "1", ip], timeout=10).returncode == 0


def test_hosts_reach_each_other_and_close_removes_everything():
    from dataplane.testbed.hosts import Testbed
    with Testbed(3) as tb:
        prefix = tb.switch[:-2]                      # "fu-<pid>-<seq>-"
        assert len(_ours(prefix)) == 4               # switch + 3 hosts
        h0, h1, h2 = tb.hosts
        assert [h.ip for h in tb.hosts] == ["192.168.77.1", "192.168.77.2", "192.168.77.3"]
        assert all(len(h.iface) <= 15 and h.iface.startswith("fu") for h in tb.hosts)
        assert _ping(tb, h0, h2.ip) and _ping(tb, h2, h1.ip) and _ping(tb, h1, tb.switch_ip)
        # default route through the switch, so "the default-route interface" is the veth
        r = tb.exec(h0, ["ip", "route", "show", "default"])
        assert f"via {tb.switch_ip} dev {h0.iface}" in r.stdout
        # nothing of the underlay leaks into our own namespace
        assert "192.168.77." not in subprocess.run(["ip", "-4", "addr"], capture_output=True,
                                                   text=True).stdout
        sleeper = tb.popen(h1, ["sleep", "300"])
        workdir = tb.workdir
    assert tb.closed
    assert _ours(prefix) == []
    assert sleeper.poll() is not None
    assert not os.path.exists(workdir)


def test_add_and_remove_hosts():
    from dataplane.testbed.hosts import Testbed
    with Testbed(2) as tb:
        late = tb.add_host()
        assert late.name == "h2" and late.ip == "192.168.77.3"
        assert _ping(tb, late, tb["h0"].ip) and _ping(tb, "h0", late.ip)
        proc = tb.popen(late, ["sleep", "300"])
        tb.remove_host("h1")
        assert [h.name for h in tb] == ["h0", "h2"]
        assert not _ping(tb, "h0", "192.168.77.2")
        tb.remove_host(late)
        assert proc.poll() is not None, "a removed host's processes are killed"
        again = tb.add_host("extra")            # the lowest free index is reused
        assert again.index == 1 and again.ip == "192.168.77.2"
        assert _ping(tb, again, tb["h0"].ip)
        with pytest.raises(KeyError):
            tb.host("h1")


def test_switch_stays_reachable_when_a_host_with_a_low_mac_leaves():
    """The CI flake of test_ip_masq_rules_installed_and_removed: a bridge without an address of
    its own takes its lowest port MAC, so a host that joins with a lower MAC moves the switch's
    MAC and its removal moves it back; a host that resolved .254 meanwhile black-holed etcd."""
    from dataplane.testbed import netns as ns
    from dataplane.testbed.hosts import Testbed
    with Testbed(1) as tb:
        h0 = tb.hosts[0]
        late = tb.add_host()
        # the lowest possible unicast MAC on the late host's bridge port
        ns.run_ip(["link", "set", f"{ns.PREFIX}{tb.tag}s{late.index}", "address",
                   "02:00:00:00:00:01"], netns=tb.switch)
        tb.exec(h0, ["ip", "neigh", "flush", "all"], check=True)
        assert _ping(tb, h0, tb.switch_ip)             # h0 resolves .254 now
        tb.remove_host(late)
        assert _ping(tb, h0, tb.switch_ip), "the switch's MAC moved under h0's neighbour entry"


def test_cleanup_after_an_exception_in_the_block():
    from dataplane.testbed.hosts import Testbed
    with pytest.raises(ZeroDivisionError):
        with Testbed(2) as tb:
            prefix = tb.switch[:-2]
            p = tb.popen("h0", ["sleep", "300"])
            # a grandchild in the same namespace, not tracked by us: close() still gets it
            tb.exec("h1", ["sh", "-c", "sleep 300 >/dev/null 2>&1 &"])
            1 / 0
    assert _ours(prefix) == []
    assert p.poll() is not None


def test_exec_popen_and_kill():
    from dataplane.testbed.hosts import Testbed
    with Testbed(1) as tb:
        r = tb.exec("h0", ["ip", "-br", "-4", "addr", "show", "dev", tb["h0"].iface])
        assert "192.168.77.1/24" in r.stdout
        r = tb.exec("switch", ["ip", "-br", "-4", "addr", "show", "dev", tb.bridge])
        assert "192.168.77.254/24" in r.stdout
        p = tb.popen("h0", [sys.executable, "-c",
                            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                            "print('up', flush=True); time.sleep(300)"])
        assert p.stdout.readline().strip() == "up"
        t0 = time.monotonic()
        rc = tb.kill(p, timeout=0.5)                # ignores SIGTERM -> SIGKILL
        assert rc == -signal.SIGKILL and time.monotonic() - t0 < 5


def test_stale_sweep_deletes_only_dead_runs():
    from dataplane.testbed import netns
    # a pid that is not alive: a child that has exited and been reaped
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = netns.ns_name((dead.pid, 1), "h0")
    live = netns.ns_name((os.getpid(), 999999), "h0")
    foreign = f"fu-manual-{os.getpid()}"
    try:
        for n in (stale, live, foreign):
            netns.create(n)
        gone = netns.sweep_stale()
        assert stale in gone
        assert not netns.exists(stale)
        assert netns.exists(live) and netns.exists(foreign)
    finally:
        for n in (stale, live, foreign):
            netns.delete(n)
    assert not any(netns.exists(n) for n in (stale, live, foreign))


def test_stale_workdirs_of_dead_runs_are_removed(tmp_path):
    import tempfile

    from dataplane.testbed.hosts import Testbed
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tempfile.mkdtemp(prefix=f"fu-tb-{dead.pid}-")
    mine = tempfile.mkdtemp(prefix=f"fu-tb-{os.getpid()}-")
    try:
        with Testbed(0):
            pass
        assert not os.path.exists(stale)
        assert os.path.exists(mine)
    finally:
        for d in (stale, mine):
            if os.path.exists(d):
                os.rmdir(d)


def test_atexit_net_cleans_up_when_the_user_forgets_close(tmp_path):
    """A process that opens a testbed and exits without close() leaves nothing."""
    out = tmp_path / "names"
    code = (
        "from dataplane.testbed.hosts import Testbed\n"
        "tb = Testbed(2)\n"
        "tb.popen('h0', ['sleep', '300'])\n"
        f"open({str(out)!r}, 'w').write(tb.switch[:-2])\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert _ours(out.read_text()) == []


def test_etcd_in_the_switch_namespace_reachable_from_hosts():
    from tests.conftest import require_etcd
    require_etcd()
    from dataplane.testbed.hosts import Testbed
    with Testbed(1) as tb:
        prefix = tb.switch[:-2]
        etcd = tb.start_etcd()
        assert etcd.client_url.startswith(f"http://{tb.switch_ip}:")
        r = tb.exec("h0", ["etcdctl", "--endpoints", etcd.client_url, "put", "fu-key", "v"],
                    timeout=20)
        assert r.returncode == 0 and "OK" in r.stdout, r.stderr
        pid = etcd.pid
    assert _ours(prefix) == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
