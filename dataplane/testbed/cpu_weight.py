"""A process's share of the CPUs against everything else on the machine, as systemd gives a
service: a cgroup of its own with a CPU weight (``CPUWeight=`` of a unit).

Why the testbed needs it: on a host, the daemon runs as packaging/flannel-udp.service, in the
service's cgroup with the unit's ``CPUWeight=``; every other service and session has a group of
its own at the default weight (100), and the kernel shares a busy machine between the groups by
weight, whatever runs inside each. The testbed starts each program in a session of its own,
which the kernel's autogroups treat the same way at weight 100 (``kernel.sched_autogroup_enabled``):
so a daemon the testbed starts gets the host's share only if it is given the unit's weight too.
A measuring child (perf's askers) gets a high weight the same way, so that its own wait for a
core is not counted as the daemon's answer time.

How: a directory ``fu-cpu-<pid>-<n>`` under the cpu controller (cgroup v1's ``cpu`` hierarchy,
``cpu.shares`` = weight * 1024 / 100, systemd's own conversion; or cgroup v2's ``cpu.weight``),
and the program joins it before it is executed (:meth:`CpuGroup.wrap`: a shell that writes its
own PID into the group, then execs the program, so the whole process and every thread and child
it makes are in it from its first instruction). :meth:`CpuGroup.close` moves out any process
still inside and removes the directory; :func:`sweep_stale` removes the empty groups of dead runs.
"""
from __future__ import annotations

import itertools
import logging
import os
import re

log = logging.getLogger(__name__)

DEFAULT_WEIGHT = 100            # systemd's (and an autogroup's: nice 0)
WEIGHT_MIN, WEIGHT_MAX = 1, 10000
V1_ROOT = "/sys/fs/cgroup/cpu"
V2_ROOT = "/sys/fs/cgroup"
PREFIX = "fu-cpu"
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-\d+$")
_seq = itertools.count(1)
# joins the group given as $0, then becomes the program
_JOIN = 'echo $$ > "$0/cgroup.procs" && exec "$@"'


class CpuWeightError(OSError):
    """No cpu controller to make a group in, or the kernel refused it; the message says which."""


def unit_weight(unit_text: str) -> int:
    """The ``CPUWeight=`` of a systemd unit's text (its last setting, as systemd reads it);
    DEFAULT_WEIGHT when it sets none. ValueError for a value that is not a weight."""
    weight = DEFAULT_WEIGHT
    for line in unit_text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.strip() == "CPUWeight":
            weight = check_weight(value.strip())
    return weight


def check_weight(value) -> int:
    try:
        weight = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"CPU weight {value!r}: expected a whole number "
                         f"{WEIGHT_MIN}..{WEIGHT_MAX}") from None
    if not WEIGHT_MIN <= weight <= WEIGHT_MAX:
        raise ValueError(f"CPU weight {weight}: expected {WEIGHT_MIN}..{WEIGHT_MAX}")
    return weight


def _controller() -> tuple[str, str]:
    """(root, "v1" | "v2") of the cpu controller this machine has."""
    if os.path.exists(os.path.join(V1_ROOT, "cpu.shares")):
        return V1_ROOT, "v1"
    try:
        with open(os.path.join(V2_ROOT, "cgroup.subtree_control")) as f:
            if "cpu" in f.read().split():
                return V2_ROOT, "v2"
    except OSError:
        pass
    raise CpuWeightError(f"no cpu controller: neither {V1_ROOT}/cpu.shares (cgroup v1) nor "
                         f"'cpu' in {V2_ROOT}/cgroup.subtree_control (cgroup v2)")


class CpuGroup:
    """One cgroup at ``weight``; programs join it through :meth:`wrap`."""

    def __init__(self, weight: int):
        self.weight = check_weight(weight)
        root, self.version = _controller()
        sweep_stale(root)
        self.path = os.path.join(root, f"{PREFIX}-{os.getpid()}-{next(_seq)}")
        try:
            os.mkdir(self.path)
            if self.version == "v1":
                self._write("cpu.shares", str(self.weight * 1024 // DEFAULT_WEIGHT))
            else:
                self._write("cpu.weight", str(self.weight))
        except OSError as e:
            self.close()
            raise CpuWeightError(e.errno, f"cgroup {self.path} at weight {self.weight}: "
                                          f"{e.strerror}") from None

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def wrap(self, argv) -> list[str]:
        """``argv`` run inside this group from its start (the same PID: the shell execs it)."""
        return ["sh", "-c", _JOIN, self.path, *argv]

    def pids(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(p) for p in f.read().split()]
        except FileNotFoundError:
            return []

    def close(self) -> None:
        """Move out whatever still runs inside (to the root group) and remove the group."""
        _remove(self.path, os.path.dirname(self.path))

    def __enter__(self) -> "CpuGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _remove(path: str, root: str) -> None:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            left = f.read().split()
    except FileNotFoundError:
        return
    for pid in left:
        try:
            with open(os.path.join(root, "cgroup.procs"), "w") as f:
                f.write(pid)
        except OSError:                     # exited meanwhile
            pass
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("could not remove cgroup %s: %s", path, e)


def sweep_stale(root: str | None = None) -> list[str]:
    """Remove the groups of dead runs (their creator's PID gone); a live run's are kept."""
    if root is None:
        try:
            root = _controller()[0]
        except CpuWeightError:
            return []
    gone = []
    for name in os.listdir(root):
        m = _NAME_RE.match(name)
        if not m or int(m.group(1)) == os.getpid() or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        _remove(os.path.join(root, name), root)
        gone.append(name)
    if gone:
        log.info("removed %d stale cpu group(s): %s", len(gone), " ".join(gone))
    return gone
