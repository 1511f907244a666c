"""Suite-wide fixtures, the rule that nothing skips silently in CI, and `wait_until`, the one
way a test waits for an event.

`require(ok, reason)` skips on a developer's machine but fails under CI=true,
so a missing etcd, root or compiler can never pass CI unnoticed.
"""
from __future__ import annotations

import os
import shutil
import time

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
ENGINES = ("c", "python")
# What forwards: each engine alone, and the kernel path (the tc programs of csrc/bpf/ with the C
# engine, else Python, as the slow path: `--engine kernel`)
PATHS = ENGINES + ("kernel",)


def require(ok: bool, reason: str) -> None:
    if ok:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def require_root() -> None:
    require(os.geteuid() == 0, "needs root (network namespaces, TUN devices)")
    require(os.path.exists("/dev/net/tun"), "needs /dev/net/tun")


def require_etcd() -> None:
    require(shutil.which("etcd") is not None, "needs the etcd binary (apt-get install etcd-server)")


def require_engine(kind: str) -> None:
    if kind == "c":
        from dataplane.engine import c_available, c_import_error
        require(c_available(), f"C engine not built: {c_import_error()}")


def require_bpf() -> None:
    """The kernel path (csrc/bpf/): root to load programs, clang to compile them, libbpf's
    headers and library (apt-get install clang libbpf-dev)."""
    require(os.geteuid() == 0, "needs root (loading BPF programs)")
    require(shutil.which("clang") is not None, "needs clang (apt-get install clang)")
    require(os.path.isfile("/usr/include/bpf/bpf_helpers.h"), "needs libbpf-dev's headers")
    from dataplane.engine.bpf_lib import BpfLibError, lib
    try:
        lib()
    except BpfLibError as e:
        require(False, str(e))


def require_overlay() -> None:
    """What an overlay of simulated hosts running both engines needs: root, etcd, every engine."""
    require_root()
    require_etcd()
    for kind in ENGINES:
        require_engine(kind)


def require_path(kind: str) -> None:
    if kind == "kernel":
        require_bpf()
    else:
        require_engine(kind)


@pytest.fixture(params=PATHS)
def path_kind(request) -> str:
    """Runs a forwarding test once per path: c, python (each engine alone) and kernel (the
    kernel path in front of the C engine); the kernel run fails in CI without root, clang and
    libbpf (require_bpf)."""
    require_path(request.param)
    return request.param


@pytest.fixture(params=ENGINES)
def engine_kind(request) -> str:
    """Runs the test once per engine; the C run fails in CI if it is not built."""
    require_engine(request.param)
    return request.param


@pytest.fixture(autouse=True)
def _no_process_exit_in_tests(monkeypatch):
    """Code under test that ends the process (os._exit, as `flannel-udp run` does after a clean
    shutdown) would end pytest with status 0 and the rest of the suite unrun: fail instead."""
    def refuse(status):
        raise AssertionError(f"os._exit({status}) called inside the test process")
    monkeypatch.setattr(os, "_exit", refuse)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02, what="condition"):
    """Poll ``predicate()`` until it returns something truthy, and return that. After ``timeout``
    s, fail with AssertionError naming ``what``: a string, or a callable that says what is seen
    at that moment (counters, a status). The first looks come within a millisecond, so a quick
    event costs no ``interval``; after that one look every ``interval`` s, so a predicate that
    runs a command is not run in a busy loop."""
    deadline = time.monotonic() + timeout
    delay = min(0.0002, interval)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for "
                                 f"{what() if callable(what) else what}")
        time.sleep(delay)
        delay = min(delay * 2, interval)
