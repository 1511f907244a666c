"""engine/kernel_engine.py: the kernel path in front of an engine, seen as one engine.

The programs are loaded for real (root, clang, libbpf: tests.conftest.require_bpf) and not
attached; the engine behind them is the Python engine on socketpairs. What is checked: a table
made whole and a chain of changes leave the programs' maps with the same routes and peers as
set_routes of the whole table would; own sources, the strict rule and accept_any reach the
programs' config; stop leaves the programs alone; the choice of path (engine/choice.py).
"""
from __future__ import annotations

import ipaddress
import socket

import pytest

from dataplane.engine import choice, multi
from dataplane.engine.api import Route
from tests.conftest import require_bpf
from tests.unit.test_bpf_pins import host  # noqa: F401  (the fixture: pins, a veth pair)

pytestmark = [pytest.mark.root]


def _routes(n: int, peers: int = 7) -> list:
    return [Route.make(f"10.{1 + i // 256}.{i % 256}.0/24", f"192.168.7.{1 + i % peers}", 8285)
            for i in range(n)]


@pytest.fixture
def engine():
    require_bpf()
    from dataplane.engine.bpf_path import KernelPath
    from dataplane.engine.kernel_engine import KernelEngine
    from dataplane.engine.pyengine import PyEngine
    tun, udp = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM), socket.socketpair(
        socket.AF_UNIX, socket.SOCK_DGRAM)
    slow = multi.create(PyEngine, [tun[0].fileno()], [udp[0].fileno()], tun_addr="10.5.1.0",
                        mtu=1472, accept_any=False)
    e = KernelEngine(slow, KernelPath(), tun_ifindex=1, ext_ifindex=1, own_ip="192.168.7.100",
                     port=8285)
    yield e
    e.close()
    for a, b in (tun, udp):
        a.close()
        b.close()


def test_a_chain_of_changes_leaves_what_the_whole_table_would(engine):
    from dataplane.engine.bpf_path import KernelPath
    table = engine.table_type.of(_routes(300))
    engine.set_table(table)
    calls = []
    real = engine.kpath.change_routes
    engine.kpath.change_routes = lambda *a: (calls.append(a), real(*a))
    moved = Route.make("10.1.5.0/24", "192.168.7.99", 8285)
    table = table.updated([ipaddress.ip_network("10.1.3.0/24"), ipaddress.ip_network("10.9.9.0/24")],
                          [moved, Route.make("10.200.0.0/24", "192.168.7.50", 8285)])
    engine.set_table(table)
    # every route of the last peer gone: its peer leaves the peers map
    table = table.updated([r.subnet for r in _routes(300) if r.peer_ip.packed[-1] == 7], ())
    engine.set_table(table)
    assert len(calls) == 2
    with KernelPath() as whole:
        whole.set_routes(table.routes.values())
        assert engine.kpath._routes == whole._routes and engine.kpath._peers == whole._peers
    assert ipaddress.ip_address("192.168.7.7") not in engine.kpath._peers
    assert engine.slow.queues[0].stats()["route_swaps"] == 0     # not started: none taken yet
    # a table not derived from the last one written: set whole
    engine.set_table(engine.table_type.of(_routes(10)))
    assert len(calls) == 2 and len(engine.kpath._routes) == 10


def test_own_sources_and_rules_reach_the_programs(engine):
    engine.set_local(["10.5.1.0/24", "fc00:5:0:1::/64"], ["192.168.7.100", "10.5.1.0"])
    engine.set_strict_sources(True)
    cfg = engine.kpath._cfg
    from dataplane.engine import bpf_contract as bc
    assert cfg.flags & bc.F_STRICT and not cfg.flags & bc.F_ACCEPT_ANY
    assert cfg.port == 8285 and cfg.mtu == 1472
    assert ipaddress.ip_address("10.5.1.0") in engine.kpath._local
    assert cfg.own_mask != 0
    engine.stop()                       # the slow engine only; the programs stay loaded
    assert engine.kpath is not None and not engine.in_kernel
    assert engine.kernel_counters() is None      # not attached: nothing to report


def test_the_choice_of_path():
    require_bpf()
    got = choice.choose_engine("kernel", kernel=True)
    try:
        cls, why = got          # unpacks as ever
        assert got.kernel is not None and got.forced and "the tc programs" in why
    finally:
        got.kernel.close()

    def refuse():
        raise RuntimeError("no clang here (apt-get install clang)")
    got = choice.choose_engine("auto", kernel=True, load_kernel=refuse)
    assert got.kernel is None and not got.forced
    assert got.kernel_why.startswith("kernel path: not used: no clang here (apt-get install "
                                     "clang); the ")
    with pytest.raises(choice.EngineUnavailable, match="--engine kernel: the kernel path cannot "
                                                       "run here: no clang here"):
        choice.choose_engine("kernel", kernel=True, load_kernel=refuse)
    # without kernel= (engine_class): the slow path's class, nothing loaded
    assert choice.choose_engine("kernel").kernel is None
    with pytest.raises(RuntimeError, match="older than 6.3"):
        choice.load_kernel_path(release="6.1.0-18-amd64")


def test_no_bpf_syscall_is_said_as_such():
    """A kernel (or an emulator) without bpf(): no verifier ran, so none is quoted, and the
    line says what lacks it."""
    def enosys():
        raise RuntimeError("bpf_object__load: Function not implemented; the verifier said:")
    got = choice.choose_engine("auto", kernel=True, load_kernel=enosys)
    assert got.kernel is None
    assert "Function not implemented: this kernel has no bpf() system call" in got.kernel_why
    assert "verifier said" not in got.kernel_why


def test_an_adopted_path_gets_the_table_the_engine_starts_with(host):
    """A path adopted from its pins forwards while the daemon starts: the daemon's first table
    (empty until the peers are listed) and a config not yet whole never reach its maps; the
    table the engine starts with does, before the attach."""
    from dataplane.engine.bpf_path import KernelPath
    from dataplane.engine.kernel_engine import KernelEngine
    from dataplane.engine.pyengine import PyEngine
    from tests.unit.test_bpf_pins import MTU, OWN_IP, PEER, PORT, started
    pins, tun, ext = host
    started(pins, tun, ext).leave()
    pair, udp = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM), socket.socketpair(
        socket.AF_UNIX, socket.SOCK_DGRAM)
    kp = KernelPath(pin_dir=pins)
    slow = multi.create(PyEngine, [pair[0].fileno()], [udp[0].fileno()], tun_addr="10.5.1.0",
                        mtu=MTU, accept_any=False)
    e = KernelEngine(slow, kp, tun_ifindex=tun, ext_ifindex=ext, own_ip=OWN_IP, port=PORT)
    try:
        e.set_table(e.table_type.of([]))
        e.set_strict_sources(True)
        kept = ipaddress.ip_network("10.5.2.0/24")
        assert kept in kp._routes and kp._cfg.own_mask != 0       # as the pins held them
        e.set_table(e.table_type.of([Route.make("10.5.2.0/24", PEER, PORT),
                                     Route.make("10.5.3.0/24", PEER, PORT)]))
        assert ipaddress.ip_network("10.5.3.0/24") not in kp._routes
        e.set_local(["10.5.1.0/24"], [OWN_IP, "10.5.1.0"])
        e.start()
        assert e.in_kernel and {str(s) for s in kp._routes} == {"10.5.2.0/24", "10.5.3.0/24"}
    finally:
        e.stop()
        e.close()
        kp.leave()
        for a, b in (pair, udp):
            a.close()
            b.close()
