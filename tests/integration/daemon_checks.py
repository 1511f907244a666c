"""What the daemon tests read off a running daemon: its log, its metrics, a ping in the background
(not tests: helpers that test modules import)."""
from __future__ import annotations

import json
import os
import sys


class Pinger:
    """A ping from a to b every 0.1 s for `seconds`, in the background."""

    def __init__(self, ov, a, b, seconds: float):
        self.ov, self.count = ov, int(seconds / 0.1)
        self.proc = ov.tb.popen(a, ["ping", "-n", "-q", "-c", str(self.count), "-i", "0.1",
                                    "-W", "1", ov.flannel_ip(b)], text=True)

    def result(self) -> dict:
        from dataplane.testbed.overlay import parse_ping
        try:
            out, _ = self.proc.communicate(timeout=self.count * 0.1 + 30)
        finally:
            self.ov.tb.kill(self.proc)
        return {**parse_ping(out), "out": out}

    def kill(self):
        self.ov.tb.kill(self.proc)


def logged(ov, host, *parts) -> bool:
    """True once one line of the host's log contains every part."""
    return any(all(p in line for p in parts) for line in ov.daemon(host).log_text().splitlines())


def longest_log_line(ov, host) -> int:
    return max((len(line) for line in ov.daemon(host).log_text().splitlines()), default=0)


def metric(ov, host, name) -> float:
    return ov.metrics(host).get(name, -1)


def lease_json(ip: str, **extra) -> str:
    """A lease value as flanneld writes it, with ``extra`` fields after."""
    return json.dumps({"PublicIP": ip, "PublicIPv6": None, **extra}, separators=(",", ":"))


class PortHolder:
    """Another process in ``host`` bound to its UDP port 8285 (the daemon's), for ``seconds``."""

    def __init__(self, ov, host, seconds: float = 60):
        self.ov = ov
        self.proc = ov.tb.popen(host, [sys.executable, "-c",
                                       "import socket,sys,time; s=socket.socket(socket.AF_INET,"
                                       "socket.SOCK_DGRAM); s.bind((sys.argv[1],8285)); "
                                       "print('bound',flush=True); time.sleep(float(sys.argv[2]))",
                                       host.ip, str(seconds)], text=True)

    def __enter__(self) -> "PortHolder":
        assert self.proc.stdout.readline().strip() == "bound"
        return self

    def __exit__(self, *exc) -> None:
        self.ov.tb.kill(self.proc)


def log_mark(ov, host) -> int:
    """Where the next lines begin in the host's log (it keeps the earlier daemons')."""
    path = os.path.join(os.path.dirname(ov.subnet_file(host)), "daemon.log")
    try:
        with open(path, errors="replace") as f:
            return len(f.read())
    except OSError:
        return 0
