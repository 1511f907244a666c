"""`flannel-udp run -v=2` turns on the daemon's debug lines, not its libraries' (pyroute2 would dump
every netlink message)."""
from __future__ import annotations

import logging

from dataplane import cli


def test_v2_is_the_daemons_debug_not_pyroute2s(monkeypatch):
    import dataplane.daemon.main as daemon_main
    from dataplane.daemon import early_load

    class Daemon:                      # the flags as the daemon gets them, nothing started
        def __init__(self, opts, early=None):
            self.opts = opts
            early_load.discard(early)  # the kernel path's load, begun by run.py (auto)

        def run(self):
            return 0
    monkeypatch.setattr(daemon_main, "Daemon", Daemon)
    root, netlink = logging.getLogger(), logging.getLogger("pyroute2")
    saved = root.level, netlink.level
    try:
        assert cli.main(["run", "-v=2", "--etcd-endpoints", "http://127.0.0.1:9"]) == 0
        assert logging.getLogger("dataplane.daemon.peer_log").isEnabledFor(logging.DEBUG)
        assert not logging.getLogger("pyroute2.netlink.nlsocket").isEnabledFor(logging.DEBUG)
        assert logging.getLogger("pyroute2.netlink.nlsocket").isEnabledFor(logging.INFO)
    finally:
        root.setLevel(saved[0])
        netlink.setLevel(saved[1])


def test_v2_keeps_pyroute2_quiet_when_the_daemon_imports_it_later():
    """In a fresh process, as the daemon runs: pyroute2 is imported after the flags are read
    (its import used to reset its logger's level, and every netlink message was logged)."""
    import subprocess
    import sys
    code = (
        "import logging\n"
        "from dataplane import cli\n"
        "import dataplane.daemon.main as m\n"
        "class D:\n"
        "    def __init__(self, opts, early=None): pass\n"
        "    def run(self):\n"
        "        from pyroute2 import IPRoute  # noqa\n"
        "        print(logging.getLogger('pyroute2.netlink.core').isEnabledFor(logging.DEBUG),\n"
        "              logging.getLogger('dataplane.daemon').isEnabledFor(logging.DEBUG))\n"
        "        return 0\n"
        "m.Daemon = D\n"
        "cli.main(['run', '-v=2', '--etcd-endpoints', 'http://127.0.0.1:9'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]
