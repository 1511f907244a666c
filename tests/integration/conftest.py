"""Fixtures for integration tests: a real etcd (started here, cleaned up by PID), a two-host testbed."""
from __future__ import annotations

import itertools
import os

import pytest

from dataplane.control.etcd_errors import RegistryError
from dataplane.control.registry import Registry
from dataplane.testbed.etcd import EtcdServer
from tests.conftest import require, require_etcd, require_overlay, require_root, wait_until

_prefix_seq = itertools.count()
DEFAULT_CONFIG = '{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}'


def reach_again(reg, timeout: float = 10.0) -> None:
    """After an etcd restart, wait until ``reg`` reaches it. Its channel reconnects on a backoff
    of up to 2 s (control/etcd.py), and a call made before then fails at once, however soon
    etcd is back."""
    def reached():
        try:
            reg.get(reg.subnets_prefix, prefix=True)
            return True
        except RegistryError:
            return False
    wait_until(reached, timeout, 0.05, what=f"a client to reach etcd again ({reg.endpoint().url})")


def unique_prefix(tag: str = "t") -> str:
    return f"/fu-{os.getpid()}-{tag}-{next(_prefix_seq)}/network"


FIGURE = "figure: "             # prefix of the user properties that hold measured figures


@pytest.fixture
def figure(record_property):
    """figure(name, value): a figure this test measured. A report, not a check: kept as a
    property of the test (the JUnit XML has it) and listed at the end of the run by the
    hook below, whichever tests ran and in whatever order."""
    def record(name: str, value) -> None:
        record_property(FIGURE + name, value)
    return record


def pytest_terminal_summary(terminalreporter):
    rows = [(name[len(FIGURE):], value)
            for reports in terminalreporter.stats.values() for rep in reports
            if getattr(rep, "when", None) == "call"
            for name, value in getattr(rep, "user_properties", ())
            if isinstance(name, str) and name.startswith(FIGURE)]
    if rows:
        terminalreporter.section("figures measured by the integration tests")
        for name, value in sorted(rows):
            terminalreporter.write_line(f"FIGURE {name}: {value}")


def require_iperf3() -> None:
    import shutil
    require(shutil.which("iperf3") is not None, "needs iperf3 (apt-get install iperf3)")


@pytest.fixture
def testbed():
    """Two hosts h0, h1 on the project's testbed (network namespaces on a
    bridge), removed after the test, also when it fails."""
    require_root()
    from dataplane.testbed.hosts import Testbed
    tb = Testbed(2)
    try:
        yield tb
    finally:
        tb.close()


def overlay_of(engine: str, kinds, **overlay_kw):
    """For an `ov` fixture: yields a started Overlay (its own etcd, made with `overlay_kw`)
    whose hosts run the engines `kinds`, in order, all ready; `ov.kind` is `engine`. A kind
    may also be `(kind, add_host's keywords)` or the host's Overlay.add_host arguments
    (`{"engine": "c", "args": (...)}`). Closed after, also when a test fails."""
    require_overlay()
    from dataplane.testbed.overlay import Overlay
    overlay = Overlay(hosts=0, engine=engine, **overlay_kw)
    try:
        for kind in kinds:
            if isinstance(kind, str):
                kind = {"engine": kind}
            elif isinstance(kind, tuple):
                kind = {"engine": kind[0], **kind[1]}
            overlay.add_host(wait=False, **kind)
        for h in overlay.hosts:
            overlay.wait_ready(h)
        overlay.kind = engine
        yield overlay
    finally:
        overlay.close()


def other_engine(engine: str) -> str:
    return "python" if engine == "c" else "c"


def _etcd_server():
    require_etcd()
    server = EtcdServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def shared_etcd():
    """One etcd per test module; tests isolate themselves with a unique key prefix."""
    yield from _etcd_server()


@pytest.fixture
def etcd():
    """A private etcd for tests that stop, restart or compact it."""
    yield from _etcd_server()


@pytest.fixture
def make_registry():
    """Factory: make_registry(server_or_endpoints, prefix=None, config=DEFAULT_CONFIG) -> Registry."""
    made = []

    def make(target, prefix: str | None = None, config: str | None = DEFAULT_CONFIG, **kw) -> Registry:
        endpoints = target.endpoints if hasattr(target, "endpoints") else (
            [target.client_url] if hasattr(target, "client_url") else list(target))
        reg = Registry(endpoints, prefix=prefix or unique_prefix(), **kw)
        made.append(reg)
        if config is not None:
            reg.put_config(config)
        return reg

    yield make
    for reg in made:
        reg.close()
