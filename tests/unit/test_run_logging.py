"""`flannel-udp run -v=2` turns on the daemon's debug lines, not its libraries' (pyroute2 would dump
every netlink message)."""
from __future__ import annotations

import logging

from dataplane import cli


def test_v2_is_the_daemons_debug_not_pyroute2s(monkeypatch):
    import dataplane.daemon.main as daemon_main

    class Daemon:                      # the flags as the daemon gets them, nothing started
        def __init__(self, opts):
            self.opts = opts

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
