"""Network namespaces for the testbed: names, create/delete, veth pairs, processes, stale sweep.

Names: every namespace this module makes is called ``fu-<pid>-<seq>-<role>``
(``<pid>`` in decimal is the creating process, ``<seq>`` a per-process
counter), so that

* two runs (or two testbeds of one run) never collide, and
* :func:`sweep_stale` can delete what a dead run left behind - and only that:
  a name whose pid is still alive belongs to someone else and is kept.

Deleting a namespace first kills (by PID) every process still inside it, since
a process in a namespace keeps it - and its veths, bridge and TUNs - alive
after ``ip netns del`` has removed the name.

Everything goes through the ``ip`` command (iproute2): it is what people type,
so a failing step can be replayed by hand.
"""
from __future__ import annotations

import itertools
import logging
import os
import re
import signal
import subprocess
import time

log = logging.getLogger(__name__)

PREFIX = "fu"
NETNS_DIR = "/run/netns"
IP = "ip"
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-")
_seq = itertools.count(1)


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the message holds the command and its stderr."""


def run_ip(args: list[str], *, netns: str | None = None, input: str | None = None,
           check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    """Run ``ip [-n netns] args...`` (``-batch -`` with ``input``)."""
    cmd = [IP] + (["-n", netns] if netns else []) + list(args)
    r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}"
                         + (f"\ninput:\n{input}" if input else ""))
    return r


def new_run_id() -> tuple[int, int]:
    """(pid, seq): the unique part of the names of one testbed."""
    return os.getpid(), next(_seq)


def ns_name(run_id: tuple[int, int], role: str) -> str:
    pid, seq = run_id
    return f"{PREFIX}-{pid}-{seq}-{role}"


def short_id(run_id: tuple[int, int]) -> str:
    """A short base-36 form of run_id for interface names (<= 15 bytes)."""
    pid, seq = run_id
    return _b36(pid) + _b36(seq)


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    s = ""
    while True:
        n, r = divmod(n, 36)
        s = digits[r] + s
        if n == 0:
            return s


def exec_argv(netns: str, argv: list[str]) -> list[str]:
    """The argv that runs ``argv`` inside ``netns``. ``ip netns exec`` execs the
    command, so the PID of the started process is the command's own."""
    return [IP, "netns", "exec", netns] + [str(a) for a in argv]


def list_netns() -> list[str]:
    """Names of all named network namespaces (``/run/netns``)."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def exists(netns: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, netns))


def create(netns: str, *, disable_ipv6: bool = True) -> None:
    """Create ``netns`` with its loopback up.

    ``disable_ipv6`` (default) keeps the kernel from sending IPv6 router and
    multicast-listener packets into the TUN devices, which the engines would
    count as ``drop_not_ipv4`` and which would blur counter checks.
    """
    run_ip(["netns", "add", netns])
    try:
        run_ip(["link", "set", "lo", "up"], netns=netns)
        if disable_ipv6:
            for key in ("all", "default"):
                write_sysctl(netns, f"net/ipv6/conf/{key}/disable_ipv6", "1")
    except BaseException:
        delete(netns)
        raise


def add_veth(netns: str, name: str, peer_netns: str, peer: str, *, mtu: int, peer_cidr: str,
             gateway: str, master: str | None = None, cidr: str | None = None) -> None:
    """A veth pair from ``netns`` into ``peer_netns``, both ends of ``mtu`` and up: ``name`` stays
    in ``netns`` (a port of the bridge ``master``, or with the address ``cidr``), ``peer`` gets
    ``peer_cidr`` and its default route via ``gateway``. How a testbed host hangs off the
    switch, and a demo workload off its host."""
    near = [f"link add {name} mtu {mtu} type veth peer name {peer} mtu {mtu} netns {peer_netns}"]
    if cidr:
        near.append(f"addr add {cidr} dev {name}")
    near.append(f"link set {name} master {master} up" if master else f"link set {name} up")
    run_ip(["-batch", "-"], netns=netns, input="".join(line + "\n" for line in near))
    run_ip(["-batch", "-"], netns=peer_netns, input=(
        f"addr add {peer_cidr} dev {peer}\n"
        f"link set {peer} up\n"
        f"route add default via {gateway} dev {peer}\n"))


def write_sysctl(netns: str, key: str, value: str) -> None:
    r = subprocess.run(exec_argv(netns, ["sysctl", "-qw", f"{key.replace('/', '.')}={value}"]),
                       capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        raise NetnsError(f"sysctl {key}={value} in {netns}: {r.stderr.strip()}")


def pids(netns: str) -> list[int]:
    """PIDs of the processes running inside ``netns``."""
    r = run_ip(["netns", "pids", netns], check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


def kill_pids(pid_list, timeout: float = 3.0) -> None:
    """SIGTERM each PID, wait up to ``timeout`` for them to go, then SIGKILL."""
    alive = set()
    for pid in pid_list:
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGTERM)
            alive.add(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if _alive(p)}
        if alive:
            time.sleep(0.05)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is "alive" for kill(0) but gone for our purpose; reap it if it
    # is our child, otherwise look at its state.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def delete(netns: str, *, kill_timeout: float = 3.0) -> None:
    """Kill every process inside ``netns`` (by PID), then delete it.
    Deleting takes the namespace's interfaces with it: veths (and so their
    peers in other namespaces), bridges and TUN devices."""
    if not exists(netns):
        return
    kill_pids(pids(netns), timeout=kill_timeout)
    r = run_ip(["netns", "del", netns], check=False)
    if r.returncode != 0 and exists(netns):
        raise NetnsError(f"ip netns del {netns}: {r.stderr.strip()}")


def owner_pid(netns: str) -> int | None:
    """The creating pid encoded in one of our names, else None."""
    m = _NAME_RE.match(netns)
    return int(m.group(1)) if m else None


def dead_run_names(names, kind: str) -> list[str]:
    """Of ``names``, those of the form ``fu-<kind>-<pid>-...`` (a testbed's workdir, a test's
    systemd box) whose creating pid is dead and not ours: what a dead run left behind."""
    out = []
    for name in names:
        parts = name.split("-")
        if len(parts) < 4 or parts[0] != PREFIX or parts[1] != kind or not parts[2].isdigit():
            continue
        pid = int(parts[2])
        if pid != os.getpid() and not _pid_exists(pid):
            out.append(name)
    return out


def sweep_stale() -> list[str]:
    """Delete the namespaces left by dead runs of this module (their creating
    pid is no longer alive). Returns the names deleted. Namespaces of live
    processes and names of any other form are never touched."""
    gone = []
    for name in list_netns():
        pid = owner_pid(name)
        if pid is None or pid == os.getpid() or _pid_exists(pid):
            continue
        try:
            delete(name)
            gone.append(name)
        except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
            log.warning("could not delete stale namespace %s: %s", name, e)
    if gone:
        log.info("deleted %d stale testbed namespace(s): %s", len(gone), " ".join(gone))
    return gone


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
