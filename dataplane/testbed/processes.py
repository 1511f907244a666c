"""The processes a testbed starts in its namespaces, tracked by PID so that none outlives it.

Each runs in its own session (its process group is its PID); :meth:`Processes.kill` signals the
group, waits, then SIGKILLs, and never signals a leader already reaped (its PID may be another
process's by then): strays it left inside a namespace die with the namespace
(netns.py ``delete`` kills by the namespace's PIDs).
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading

from . import netns as ns

log = logging.getLogger(__name__)


class Processes:
    """The processes started by :meth:`popen`, each with its namespace."""

    def __init__(self):
        self._procs: dict[int, tuple[subprocess.Popen, str]] = {}  # pid -> (proc, netns)
        self._lock = threading.Lock()

    def popen(self, netns: str, argv, *, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
              env=None, text: bool = True, wrap=None, **kw) -> subprocess.Popen:
        """Start ``argv`` in ``netns`` in its own session, tracked by PID. ``wrap``: a function
        of the whole command line, entering the namespace included (cpu_weight.py's
        ``CpuGroup.wrap``: the namespace's own /sys shows no cgroups)."""
        argv = ns.exec_argv(netns, list(argv))
        proc = subprocess.Popen(wrap(argv) if wrap else argv, stdout=stdout, stderr=stderr,
                                env=env, text=text, start_new_session=True, **kw)
        with self._lock:
            self._procs[proc.pid] = (proc, netns)
        return proc

    def kill(self, proc: subprocess.Popen, *, sig: int = signal.SIGTERM,
             timeout: float = 5.0) -> int | None:
        """Send ``sig`` to a process started by :meth:`popen` (its process
        group), wait up to ``timeout``, then SIGKILL. Returns its exit code."""
        if proc.poll() is None:
            _signal_group(proc.pid, sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    log.warning("pid %d did not die after SIGKILL", proc.pid)
        with self._lock:
            self._procs.pop(proc.pid, None)
        for f in (proc.stdout, proc.stderr, proc.stdin):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        return proc.returncode

    def kill_in(self, netns: str | None) -> None:
        """Kill the processes started in ``netns`` (None: in any)."""
        with self._lock:
            procs = [p for p, n in self._procs.values() if netns is None or n == netns]
        for p in procs:
            self.kill(p, timeout=3.0)


def read_log(path: str) -> str:
    """The log a process writes to ``path`` so far; "" while there is none (not started, or
    its directory gone): a test's message about the process shows what there is."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _signal_group(pid: int, sig: int) -> None:
    """Signal the process group led by ``pid`` (popen starts a new session,
    so pgid == pid), falling back to the PID alone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
