"""Suite-wide fixtures and the rule that nothing skips silently in CI.

`require(ok, reason)` skips on a developer's machine but fails under CI=true,
so a missing etcd, root or compiler can never pass CI unnoticed.
"""
from __future__ import annotations

import os
import shutil

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
ENGINES = ("c", "python")


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
