"""A real systemd for the tests: PID 1 of its own pid, mount and cgroup namespaces, that runs only
the units a test gives it (the machine's PID 1 need not be systemd).

What keeps it from touching the machine:

* it sees only the units of this box (``$SYSTEMD_UNIT_PATH`` = the box's unit directory): a
  target of its own, empty stand-ins for the targets services depend on, and the units a test
  installs; nothing of sysinit.target (tmpfiles, udev, sysctl, mounts) exists for it;
* its mount namespace is a slave of the machine's: the root is read-only there, /tmp and
  /var/tmp are empty tmpfs, /run/systemd is a tmpfs of its own; /run itself is the machine's
  (network namespaces, the iptables lock), and the box's files live in ``/run/fu-sd-<pid>-<n>``;
* its cgroups are one sub-tree of the unified hierarchy, mounted as its /sys/fs/cgroup;
* it dies with the process that made it (``unshare --kill-child`` and the parent-death signal),
  and :meth:`close` kills it by PID (its pid namespace, every service with it) and removes the
  sub-tree and the directory; those of dead runs are swept when the next box starts.

``systemctl`` runs inside its namespaces (``nsenter``): :meth:`systemctl`.

``SystemdBox(host=NETNS)`` is a whole simulated host instead, for installing packages: systemd
runs in the network namespace NETNS, its root is an overlay of the machine's whose writes go to a
tmpfs of the box (so dpkg, /etc and /opt change only there), /run is its own (its
/run/flannel/subnet.env is the host's), /sys shows NETNS's devices, and its units are the box's,
then the overlay's /etc/systemd/system and /lib/systemd/system, as a host's are.
:meth:`run` runs a command in it; :meth:`path` names a file of it from the machine.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time

from dataplane.testbed import netns

SYSTEMD = "/lib/systemd/systemd"
PREFIX = "fu-sd"
TARGET = "fu-box.target"
# What a service's default dependencies and the project's unit name: empty here.
STUB_TARGETS = ("sysinit.target", "basic.target", "shutdown.target", "network-online.target")
START_TIMEOUT = 20.0
CLOSE_TIMEOUT = 30.0
_seq = itertools.count(1)

_BOX_SH = r"""
set -e
mount --make-rslave /
mount --rbind /run /run
mount -t tmpfs -o mode=0755 tmpfs /run/systemd
mount -t proc proc /proc
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
mount -o remount,bind,ro /
exec env -i container=flannel-udp-tests SYSTEMD_UNIT_PATH="$1" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    {systemd} --system --unit={target} --log-target=console --log-level=notice
"""

# The simulated host's variant: $1 the box's units, $2 a tmpfs for the overlay's layers, $3 the
# overlay's mount point. The units are bound into the box's own /run, where systemd reads them.
_HOST_BOX_SH = r"""
set -e
mount --make-rslave /
mkdir -p "$2"
mount -t tmpfs -o mode=0755 tmpfs "$2"
mkdir -p "$2/upper" "$2/work" "$3"
mount -t overlay overlay -o lowerdir=/,upperdir="$2/upper",workdir="$2/work" "$3"
mount -t proc proc "$3/proc"
mount -t sysfs sysfs "$3/sys"
mount -t cgroup2 cgroup2 "$3/sys/fs/cgroup"
mount --rbind /dev "$3/dev"
mount -t tmpfs -o mode=0755 tmpfs "$3/run"
mkdir -p "$3/run/lock" "$3/run/fu-box-units"
mount --bind "$1" "$3/run/fu-box-units"
mount -t tmpfs -o mode=1777 tmpfs "$3/tmp"
mount -t tmpfs -o mode=1777 tmpfs "$3/var/tmp"
exec chroot "$3" env -i container=flannel-udp-tests \
    SYSTEMD_UNIT_PATH=/run/fu-box-units:/etc/systemd/system:/lib/systemd/system \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    {systemd} --system --unit={target} --log-target=console --log-level=notice
"""


def unified_root() -> str | None:
    """Where the machine mounts the cgroup v2 hierarchy (alone or next to v1's)."""
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, where, kind = line.split()[:3]
            if kind == "cgroup2":
                return where
    return None


def missing() -> str | None:
    """Why no box can run here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"needs {tool} (util-linux)"
    if not os.access(SYSTEMD, os.X_OK):
        return f"needs systemd ({SYSTEMD}; Debian package systemd)"
    if unified_root() is None:
        return "needs a cgroup v2 hierarchy mounted"
    # the box's /tmp and /var/tmp are empty tmpfs: a project there is not in the box
    for where in (sys.prefix, os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))):
        if any(os.path.realpath(where).startswith(t + "/") for t in ("/tmp", "/var/tmp")):
            return (f"the box's /tmp and /var/tmp are empty: {where} is not in it (check the "
                    "project out elsewhere than /tmp or /var/tmp)")
    return None


def _remove_cgroup(path: str) -> None:
    for root, dirs, _files in os.walk(path, topdown=False):
        for d in dirs:
            _rmdir(os.path.join(root, d))
    _rmdir(path)


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass


def sweep_stale() -> None:
    """Remove the cgroups and directories of boxes whose creator is dead."""
    cg = unified_root()
    for base in filter(None, (cg, "/run")):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in netns.dead_run_names(names, PREFIX.split("-")[1]):
            path = os.path.join(base, name)
            if base == cg:
                try:
                    with open(os.path.join(path, "cgroup.procs")) as f:
                        for pid in f.read().split():
                            os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
                _remove_cgroup(path)
            else:
                shutil.rmtree(path, ignore_errors=True)


def _child_setup(cgroup: str):
    def setup():
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)          # PR_SET_PDEATHSIG: dies with us
    return setup


class SystemdBox:
    """One systemd; a context manager. ``dir`` is where unit files and what services read live."""

    def __init__(self, host: str | None = None):
        self.netns = host
        why = missing()
        if why:
            raise RuntimeError(f"no systemd box: {why}")
        sweep_stale()
        self.name = f"{PREFIX}-{os.getpid()}-{next(_seq)}"
        self.dir = os.path.join("/run", self.name)
        self.units = os.path.join(self.dir, "units")
        self.cgroup = os.path.join(unified_root(), self.name)
        self.proc = None
        self.pid1 = None
        os.makedirs(self.units)
        os.makedirs(self.cgroup)
        for target in (TARGET, *STUB_TARGETS):
            with open(os.path.join(self.units, target), "w") as f:
                f.write(f"[Unit]\nDescription={target} of a flannel-udp test box (empty)\n"
                        "DefaultDependencies=no\n")
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        if self.netns is None:
            script, args, net = _BOX_SH, [self.units], []
        else:
            script, net = _HOST_BOX_SH, ["nsenter", f"--net=/run/netns/{self.netns}"]
            args = [self.units, os.path.join(self.dir, "layers"), os.path.join(self.dir, "root")]
        script = script.format(systemd=SYSTEMD, target=TARGET)
        with open(os.path.join(self.dir, "box.log"), "wb") as log_f:
            self.proc = subprocess.Popen(
                [*net, "unshare", "--pid", "--mount", "--cgroup", "--fork", "--kill-child=SIGKILL",
                 "sh", "-c", script, "box", *args],
                stdin=subprocess.DEVNULL, stdout=log_f, stderr=log_f,
                preexec_fn=_child_setup(self.cgroup))
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the systemd box exited with {self.proc.returncode}: "
                                   f"{self.log()[-2000:]}")
            self.pid1 = self.pid1 or self._find_pid1()
            if self.pid1:
                r = self.systemctl("is-system-running", check=False)
                if r.stdout.strip() in ("running", "degraded"):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the systemd box did not come up in {START_TIMEOUT:.0f} s: "
                           f"{self.log()[-2000:]}")

    def _find_pid1(self) -> int | None:
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                kids = f.read().split()
        except OSError:
            return None
        for kid in kids:
            try:
                with open(f"/proc/{kid}/comm") as f:
                    if f.read().strip() == "systemd":
                        return int(kid)
            except OSError:
                continue
        return None

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "box.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def systemctl(self, *args, check: bool = True, timeout: float = 60):
        # -r/-w: systemd's own root, not the mount namespace's (they differ under a chroot,
        # where systemctl would otherwise find the machine's /run/systemd, not the box's)
        r = subprocess.run(["nsenter", "-t", str(self.pid1), "-m", "-p", "-r", "-w", "systemctl",
                            "--no-pager", *args], capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"systemctl {' '.join(args)} failed ({r.returncode}): "
                               f"{r.stdout}{r.stderr}")
        return r

    def run(self, *argv, timeout: float = 300, env: dict | None = None):
        """``argv`` inside the box (its mount, pid and network namespaces, its root), as a
        command of the simulated host; returns the CompletedProcess."""
        return subprocess.run(["nsenter", "-t", str(self.pid1), "-m", "-p", "-n", "-r", "-w",
                               "env", *[f"{k}={v}" for k, v in (env or {}).items()], *argv],
                              capture_output=True, text=True, timeout=timeout)

    def path(self, inside: str) -> str:
        """The machine's name for the box's file ``inside`` (through systemd's root)."""
        return f"/proc/{self.pid1}/root/{inside.lstrip('/')}"

    def install(self, name: str, text: str, dropin: str | None = None) -> None:
        """A unit (and a drop-in for it), then daemon-reload."""
        with open(os.path.join(self.units, name), "w") as f:
            f.write(text)
        if dropin is not None:
            d = os.path.join(self.units, f"{name}.d")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "box.conf"), "w") as f:
                f.write(dropin)
        self.systemctl("daemon-reload")

    def start_journal(self) -> None:
        """journald in the box, for services whose output goes to the journal (StandardOutput=
        journal, systemd's default). Its sockets only (no /dev/log: /dev is the machine's); its
        files in the box's directory (bound over /run/log, which it would share with the
        machine), read with :meth:`journalctl`."""
        os.makedirs(os.path.join(self.dir, "log"), exist_ok=True)
        self.install("systemd-journald.socket", (
            "[Unit]\nDefaultDependencies=no\n[Socket]\n"
            "ListenStream=/run/systemd/journal/stdout\nListenDatagram=/run/systemd/journal/socket\n"
            "SocketMode=0666\nPassCredentials=yes\nPassSecurity=yes\nReceiveBuffer=8M\n"
            "Service=systemd-journald.service\n"))
        self.install("systemd-journald.service", (
            "[Unit]\nDefaultDependencies=no\nRequires=systemd-journald.socket\n"
            "After=systemd-journald.socket\n[Service]\nType=notify\n"
            "Sockets=systemd-journald.socket\nExecStart=/lib/systemd/systemd-journald\n"
            + ("" if self.netns else f"BindPaths={self.dir}/log:/run/log\n")
            + "RuntimeDirectory=systemd/journal\n"
            "RuntimeDirectoryPreserve=yes\nStandardOutput=null\n"))
        self.systemctl("start", "systemd-journald.socket", "systemd-journald.service")

    def journalctl(self, *args) -> str:
        """``journalctl ARGS`` over the box's journal files (journald writes them as it goes)."""
        if self.netns:          # a simulated host's journald writes in its own namespaces
            r = self.run("journalctl", "--no-pager", *args, timeout=30)
        else:
            r = subprocess.run(["journalctl", "--no-pager", "-D",
                                os.path.join(self.dir, "log", "journal"), *args],
                               capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"journalctl {' '.join(args)} failed ({r.returncode}): {r.stderr}")
        return r.stdout

    def show(self, unit: str, *props: str) -> dict:
        r = self.systemctl("show", unit, *[f"--property={p}" for p in props])
        return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)

    def main_pid(self, unit: str) -> int:
        """The unit's main process, as a pid of the machine (0: none)."""
        pid = int(self.show(unit, "MainPID")["MainPID"])
        if not pid:
            return 0
        # systemd names it in its own pid namespace: find the machine's pid with that NSpid
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status") as f:
                    for line in f:
                        if line.startswith("NSpid:"):
                            ids = line.split()[1:]
                            if len(ids) >= 2 and int(ids[-1]) == pid and self._inside(int(entry)):
                                return int(entry)
                            break
            except OSError:
                continue
        return 0

    def _inside(self, pid: int) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink(f"/proc/{self.pid1}/ns/pid")
        except OSError:
            return False

    def close(self) -> None:
        """Kill systemd (and with its pid namespace every service), remove what the box made."""
        if self.proc is not None and self.proc.poll() is None:
            if self.pid1:
                try:
                    os.kill(self.pid1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        # the pid namespace goes down asynchronously: wait for the sub-tree to empty
        deadline = time.monotonic() + CLOSE_TIMEOUT
        while self._populated() and time.monotonic() < deadline:
            time.sleep(0.05)
        _remove_cgroup(self.cgroup)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _populated(self) -> bool:
        try:
            with open(os.path.join(self.cgroup, "cgroup.events")) as f:
                return "populated 1" in f.read()
        except OSError:
            return False

    def __enter__(self) -> "SystemdBox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
