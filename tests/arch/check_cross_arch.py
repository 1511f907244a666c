"""An arm64 daemon beside an amd64 one in one overlay: flannel-udp as the udp backend of an
architecture flanneld's udp backend does not exist for.

::

    h0 (netns)  flannel-udp run, this machine's build          \\
                                                                 bridge, etcd (switch netns)
    h1 (netns)  flannel-udp run from the arm64 root, under      /
                QEMU user mode (qemu-aarch64 through binfmt_misc)

Both daemons run with the default flags, both engines in turn; the arm64 one as the install
step put it in a venv, and as the arm64 Debian package (the deb step) installs it. It meets what
QEMU does not emulate, SO_ATTACH_REUSEPORT_CBPF, and runs one queue (dataplane/host/udpsock.py);
QEMU's iptables does not reach this kernel's netfilter either, and the forward rules are then
only a warning (as flanneld's). Nor does it emulate bpf(): the C run's arm64 daemon runs with
``--engine auto``, whose kernel path must then give way to the C engine with one log line
naming ENOSYS (tests/arch/kernel_path_emulated.py checks the rest of what reaches the kernel
path here). Pings cross both ways over flannel0.

Not collected by `make test` (its name is no test_*.py: it needs the arm64 root, which takes
minutes to make); `make test-arch ARCH=arm64` runs it last (tests/arch/run.sh's cross step), and
CI runs that. By path, once the root exists: `.venv/bin/python -m pytest tests/arch/check_cross_arch.py`.
The root is tests/arch/run.sh's (`make test-arch ARCH=arm64`, or its `root install build`
steps): $FLANNEL_UDP_ARCH_DIR/arm64, by default /var/cache/flannel-udp/arch/arm64. Without it the
test skips on a developer's machine and fails under CI=true. The arm64 daemon runs in a mount
namespace of its own inside h1's (proc, sys, dev and the testbed's directory mounted into the
root), which goes away with it; the overlay removes daemons, etcd and namespaces, also on failure.
"""
from __future__ import annotations

import os
import platform

import pytest

from tests.conftest import require, require_overlay

pytestmark = [pytest.mark.root, pytest.mark.slow]

ARCH, QEMU = "arm64", "qemu-aarch64"
ROOT = os.path.join(os.environ.get("FLANNEL_UDP_ARCH_DIR", "/var/cache/flannel-udp/arch"), ARCH)
VENV = "/srv/flannel-udp/venv"              # in the root (tests/arch/run.sh)
SRC = "/srv/flannel-udp/src"                # the install step's copy of the checkout
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGED = "/opt/flannel-udp"               # the Debian package's venv (tests/arch/run.sh deb)
BINFMT = f"/proc/sys/fs/binfmt_misc/{QEMU}"
EMULATED_READY_S = 240.0                    # imports under emulation; no figure, a bound

# Inside h1's namespace: a private mount namespace whose mounts vanish with the daemon, the
# root's /proc, /sys (h1's devices: sysfs shows the mounter's network namespace), /dev (the
# TUN) and the testbed's directory (the subnet file, the notify, handover and status sockets,
# and the bpffs of the hosts' pins mounted under it: --rbind) at the path the daemon is given,
# then the daemon itself inside the root.
_IN_ROOT = r'''
r=$1 wd=$2; shift 2
mkdir -p "$r$wd" &&
mount -t proc proc "$r/proc" && mount -t sysfs sysfs "$r/sys" && mount --rbind /dev "$r/dev" &&
mount --rbind "$wd" "$r$wd" && exec chroot "$r" "$@"
'''


def _binfmt_on() -> None:
    """Something on a shared host may switch the handler off: on again before each start."""
    if os.path.exists(BINFMT):
        with open(BINFMT, "w") as f:
            f.write("1")


def _stale_in_root(where: str, tops=("dataplane", "csrc")) -> list[str]:
    """The daemon's files (under ``tops``) that differ between the checkout and ``where`` in
    the root: a daemon installed from older sources would test those."""
    stale = []
    for top in tops:
        for d, _, files in os.walk(os.path.join(CHECKOUT, top)):
            for f in files:
                # _dataplane_c.c: cffi's output, a build product of each side
                if not f.endswith((".py", ".c", ".h", ".txt")) or f.startswith("_dataplane_c"):
                    continue
                here = os.path.join(d, f)
                rel = os.path.relpath(here, CHECKOUT)
                there = os.path.join(ROOT, where.lstrip("/"), rel)
                with open(here, "rb") as a:
                    mine = a.read()
                try:
                    with open(there, "rb") as b:
                        same = b.read() == mine
                except OSError:
                    same = False
                if not same:
                    stale.append(rel)
    return stale


def _require_root_of_arch(install: str) -> str:
    """The arm64 root, its binfmt handler on, and the daemon ``install`` names ("venv": the
    install and build steps', "deb": the Debian package's) made from this checkout's sources;
    returns that daemon's path in the root."""
    require(platform.machine() == "x86_64", "runs an arm64 daemon beside this amd64 machine's")
    require(os.path.exists(os.path.join(ROOT, ".flannel-udp-root")),
            f"needs the arm64 root in {ROOT}: tests/arch/run.sh arm64 root install build makes "
            "it (make test-arch ARCH=arm64 too, and runs the engine tests there)")
    if install == "venv":
        daemon, steps = f"{VENV}/bin/flannel-udp", "install build"
        stale = _stale_in_root(SRC)
    else:
        site = f"{PACKAGED}/lib/python3.11/site-packages"
        daemon, steps = "/usr/bin/flannel-udp", "install deb"
        stale = _stale_in_root(site, ("dataplane",))
    # the package's /usr/bin/flannel-udp is an absolute link: it resolves inside the root only
    require(os.path.exists(ROOT + daemon) if install == "venv" else
            os.path.islink(ROOT + daemon) and os.path.exists(f"{ROOT}{PACKAGED}/bin/flannel-udp"),
            f"needs {daemon} in the arm64 root: tests/arch/run.sh arm64 {steps} puts it there")
    require(not stale, f"the arm64 root's {install} holds older sources than the checkout "
                       f"({len(stale)} file(s), e.g. {stale[:3]}): tests/arch/run.sh arm64 {steps}")
    require(os.path.exists(BINFMT), f"needs the {QEMU} binfmt handler (qemu-user-static, "
                                    "binfmt-support; tests/arch/run.sh registers it)")
    _binfmt_on()
    with open(BINFMT) as f:
        state = f.read()
    require(state.startswith("enabled") and "flags: " in state and
            "F" in state.split("flags: ")[1].split()[0],
            f"the {QEMU} binfmt handler must be enabled with the F flag: {state[:80]!r}")
    return daemon


@pytest.mark.timeout(600)
@pytest.mark.parametrize("install", ["venv", "deb"])
def test_arm64_and_amd64_daemons_forward_to_each_other(engine_kind, install):
    require_overlay()
    daemon = _require_root_of_arch(install)
    from dataplane.testbed.overlay import Overlay
    workdir = None
    try:
        with Overlay(hosts=0, engine=engine_kind) as ov:
            workdir = ov.tb.workdir
            _overlay_across(ov, engine_kind, workdir, daemon)
    finally:
        # the directory the daemon's mounts hung on, once the daemon and its namespace are gone
        if workdir and os.path.isdir(ROOT + workdir) and not os.listdir(ROOT + workdir):
            os.rmdir(ROOT + workdir)


def _overlay_across(ov, engine_kind: str, workdir: str, daemon: str) -> None:
    here = ov.add_host(start=False)
    arm = ov.add_host(start=False)
    plain_argv = ov.daemon_argv

    def argv(h, engine, args=()):
        if h is not arm:
            return plain_argv(h, engine, args)
        # the C run's arm64 daemon makes the default choice, which meets the emulator's
        # missing bpf() and must go on with the C engine (asserted below)
        engine = "auto" if engine == "c" else engine
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                _IN_ROOT, "sh", ROOT, workdir, daemon,
                *ov.daemon_command(h, engine, args)]
    ov.daemon_argv = argv
    ov.start_daemon(here, wait=False)
    _binfmt_on()
    ov.start_daemon(arm, wait=False)
    ov.wait_ready(here)
    d = ov.wait_ready(arm, timeout=EMULATED_READY_S)
    exe = os.readlink(f"/proc/{d.pid}/exe")
    assert "aarch64" in exe, exe          # binfmt_misc: the emulator runs the daemon
    log = d.log_text()
    assert f"Engine: {engine_kind}" in log, log
    if engine_kind == "c":
        # one line that names the true cause: QEMU user mode has no bpf() syscall
        why = [line for line in log.splitlines() if "kernel path: not used" in line]
        assert len(why) == 1 and "Function not implemented" in why[0] and \
            why[0].endswith("the C engine forwards alone"), log
    # QEMU refuses the steering: one queue, said once (dataplane/host/udpsock.py)
    refused = [line for line in log.splitlines() if "SO_ATTACH_REUSEPORT_CBPF" in line]
    assert len(refused) == 1 and "running 1 queue instead of" in refused[0], log
    assert ov.metrics(arm)["flannel_udp_queues"] == 1

    for src, dst in ((here, arm), (arm, here)):
        assert ov.reachable(src, ov.flannel_ip(dst), 60), \
            f"{ov.daemon(src).log_text()}\n{ov.daemon(dst).log_text()}"
        r = ov.ping(src, ov.flannel_ip(dst), count=5, wait=3)
        assert r["received"] == 5, (r, ov.daemon(arm).log_text())
    m = ov.metrics(arm)
    assert m['flannel_udp_packets_total{path="udp_rx"}'] >= 5, m
    assert m['flannel_udp_packets_total{path="udp_tx"}'] >= 5, m
    assert ov.stop_daemon(arm, timeout=60) == 0, d.log_text()
