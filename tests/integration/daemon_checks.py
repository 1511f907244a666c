"""What the daemon tests read off a running daemon: its log, its metrics, a ping in the background
(not tests: helpers that test modules import)."""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading


class Pinger:
    """A ping from a to b every 0.1 s for at most `seconds`, in the background: `result()` waits
    for all of them, `stop()` ends it as soon as the test's work is done."""

    def __init__(self, ov, a, b, seconds: float):
        self.ov, self.count = ov, int(seconds / 0.1)
        self.proc = ov.tb.popen(a, ["ping", "-n", "-c", str(self.count), "-i", "0.1",
                                    "-W", "1", ov.flannel_ip(b)], text=True)
        # one line per reply: read as they come, so that stop() knows which requests were answered
        self._lines: list[str] = []
        self._new_line = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        try:
            for line in self.proc.stdout:
                with self._new_line:
                    self._lines.append(line)
                    self._new_line.notify_all()
        except ValueError:      # kill() closed the pipe under the reader: the ping has ended
            pass

    def _out(self) -> str:
        with self._new_line:
            return "".join(self._lines)

    def replying(self, timeout: float = 5.0) -> bool:
        """True once a reply has come (the path works before the test disturbs anything)."""
        with self._new_line:
            return self._new_line.wait_for(lambda: any(map(_REPLY.search, self._lines)) or
                                           self.proc.poll() is not None, timeout) and \
                any(map(_REPLY.search, self._lines))

    def result(self) -> dict:
        from dataplane.testbed.overlay import parse_ping
        try:
            self.proc.wait(timeout=self.count * 0.1 + 30)
            self._reader.join(10)
        finally:
            self.ov.tb.kill(self.proc)
        out = self._out()
        return {**parse_ping(out), "out": out}

    def stop(self) -> dict:
        """The ping until now, as ``result()`` gives it for a whole run. It is ended (SIGINT)
        just after a reply: a request that left after that reply and had no answer yet when the
        signal came counts neither as sent nor as lost (if no reply comes within 3 s, nothing is
        discounted). "stopped" says whether it was still running (if it already sent all
        ``seconds`` of it, or ended on its own, this is ``result()``)."""
        if self.proc.poll() is not None:
            return {**self.result(), "stopped": False}
        with self._new_line:
            seen = len(self._lines)
            fresh = self._new_line.wait_for(
                lambda: any(map(_REPLY.search, self._lines[seen:])), timeout=3)
            last = max((int(m.group(1)) for m in map(_REPLY.search, self._lines) if m), default=0)
        self.ov.tb.kill(self.proc, sig=signal.SIGINT)
        r = self.result()
        if fresh:
            replied = {int(m.group(1)) for m in map(_REPLY.search, r["out"].splitlines()) if m}
            r["sent"] -= sum(1 for seq in range(last + 1, r["sent"] + 1) if seq not in replied)
        return {**r, "stopped": True}

    def kill(self):
        self.ov.tb.kill(self.proc)


_REPLY = re.compile(r"bytes from .*icmp_seq=(\d+)")


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
