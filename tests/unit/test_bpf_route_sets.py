"""Route sets the programs' maps must hold as the engines' tables do (engine/bpf_routes.py),
checked packet by packet through BPF_PROG_TEST_RUN against the Python engine (pypath, the
C engine's oracle), and the batched writes against the one-at-a-time ones.

* A route via 0.0.0.0: the engines keep it (their lookup finds it; the peer is one no datagram
  reaches), the programs would read its value as the IPv6 underlay's ``::``. Its packets go
  to the engine, and a shorter route around it never takes them, nor its inner sources.
* Several routes of one subnet in one set: the engines route by the last one and keep every
  one's peer as a sender (step 2); a table derived from a change knows its routes' peers only.
"""
from __future__ import annotations

import ipaddress
import logging

import pytest

from dataplane.engine import bpf_contract as bc
from dataplane.engine import pypath
from dataplane.engine.api import Local, Route
from dataplane.engine.bpf_lib import ffi
from dataplane.engine.pytable import RouteTable
from tests.conftest import require_bpf
from tests.unit.test_kernel_engine import engine  # noqa: F401  (the fixture)
from tests.unit.test_bpf_programs import (EXT_IF, MTU, OK, OTHER_PEER, OWN_IP, OWN_NET, PEER,
                                          PORT, REDIRECT, SHOT, TUN_IF, datagram, frame, run,
                                          udp4)

ANY_ROUTE = Route.make("10.5.2.0/24", "0.0.0.0", PORT)
AROUND = Route.make("10.5.0.0/16", OTHER_PEER, PORT)        # a shorter route around it


@pytest.fixture
def path():
    require_bpf()
    from dataplane.engine.bpf_path import KernelPath
    with KernelPath() as k:
        k.set_devices(TUN_IF, EXT_IF, tun_l2=True, ext_l2=True)
        k.configure(own_ip=OWN_IP, port=PORT, mtu=MTU, own_subnets=[OWN_NET], strict=True)
        yield k


def oracle(routes, strict=True) -> pypath.Path:
    pa = pypath.Path(ipaddress.IPv4Address("10.5.1.0").packed, accept_any=False)
    pa.routes = routes if isinstance(routes, RouteTable) else RouteTable(routes)
    pa.local = pypath.own_sources((
        Local(int(ipaddress.IPv4Network(OWN_NET).network_address), 24, ()), Local(0, 0, ())))
    pa.strict_sources = strict
    pypath.path_set_icmp_limit(pa, 0, 0)
    return pa


def engine_udp(pa, payload: bytes, sender: str):
    """pypath's UDP -> TUN: (the packet written or None, the drop reason or None)."""
    buf = bytearray(MTU + 1)
    buf[:len(payload)] = payload
    out = None
    for _ in pypath.path_udp(pa, [buf], [len(payload)], [(sender, PORT)], 1, MTU):
        out = bytes(buf[:len(payload)])
    dropped = [n for n, v in zip(pypath.STAT_NAMES, pa.c) if v and n.startswith("drop_")]
    return out, (dropped[0] if dropped else None)


def test_a_route_via_0000_goes_to_the_engine(path, caplog):
    routes = [AROUND, ANY_ROUTE]
    assert oracle(routes).routes.lookup(int(ipaddress.ip_address("10.5.2.3"))) is not None
    with caplog.at_level(logging.WARNING, logger="dataplane.engine.bpf_routes"):
        path.set_routes(routes)
        path.set_routes(routes + [Route.make("10.5.3.0/24", "0.0.0.0", PORT)])
    pkt = udp4(dst="10.5.2.3")
    verdict, out, moved = run(path, bc.PROG_EGRESS, frame(pkt))
    assert (verdict, out[14:]) == (OK, pkt)            # unchanged, to the engine
    assert list(moved) == ["tx_pass_too_big"]
    assert path.engine_routes == 2                     # counted, and said once
    assert len([r for r in caplog.records if "via 0.0.0.0" in r.getMessage()]) == 1
    # the route around it still sends
    assert run(path, bc.PROG_EGRESS, frame(udp4(dst="10.5.9.3")))[0] == REDIRECT
    # step 5: an inner source of that subnet is routed to no sender, as the engine has it
    inner = udp4(src="10.5.2.3", dst="10.5.1.2")
    assert engine_udp(oracle(routes), inner, OTHER_PEER) == (None, "drop_inner_foreign")
    verdict, _, moved = run(path, bc.PROG_INGRESS, datagram(inner, src=OTHER_PEER))
    assert (verdict, moved) == (SHOT, {"drop_inner_foreign": 1})
    # read back as written (a successor adopting the pins compares with this)
    assert path._routes[ANY_ROUTE.subnet] == (ANY_ROUTE.peer_ip, 0)
    path.set_routes([AROUND])
    assert path.engine_routes == 0
    assert run(path, bc.PROG_EGRESS, frame(pkt))[0] == REDIRECT


def test_every_peer_of_a_subnets_routes_is_a_sender(path):
    path.configure(own_ip=OWN_IP, port=PORT, mtu=MTU, own_subnets=[OWN_NET], strict=False)
    dups = [Route.make("10.5.2.0/24", PEER, PORT), Route.make("10.5.2.0/24", OTHER_PEER, PORT)]
    path.set_routes(dups)
    inner = udp4(src="10.5.2.3", dst="10.5.1.2")
    for sender in (PEER, OTHER_PEER):           # the replaced route's peer too
        want, reason = engine_udp(oracle(dups, strict=False), inner, sender)
        assert reason is None and want is not None
        verdict, out, _ = run(path, bc.PROG_INGRESS, datagram(inner, src=sender))
        assert (verdict, out[14:]) == (REDIRECT, want)
    # the route is the last one's
    assert path._routes[ipaddress.ip_network("10.5.2.0/24")] == (
        ipaddress.ip_address(OTHER_PEER), 0)
    # a change derives a table that knows its routes' peers only: so do the maps
    extra = Route.make("10.5.4.0/24", OTHER_PEER, PORT)
    derived = RouteTable(dups).updated((), [extra])
    path.change_routes((), [extra])
    assert engine_udp(oracle(derived, strict=False), inner, PEER) == (None, "drop_bad_source")
    verdict, _, moved = run(path, bc.PROG_INGRESS, datagram(inner, src=PEER))
    assert (verdict, moved) == (SHOT, {"drop_bad_source": 1})


def test_batched_writes_leave_what_single_writes_do(path, monkeypatch):
    """16,000 routes over 3,000 peers set, half replaced, a few changed: the maps read back
    the same as through one write per element (the kernel refusing batches)."""
    from dataplane.engine.bpf_path import KernelPath
    big = [Route.make(f"10.{64 + i // 256}.{i % 256}.0/24", f"172.16.{i % 3000 // 256}."
                      f"{i % 256}", PORT) for i in range(16000)]
    other = [Route.make(str(r.subnet), OTHER_PEER, PORT) for r in big[:8000]]

    def apply(kp):
        kp.configure(own_ip=OWN_IP, port=PORT, mtu=MTU, own_subnets=[OWN_NET])
        kp.set_routes(big)
        kp.set_routes(other + big[12000:] + [ANY_ROUTE])
        kp.change_routes([r.subnet for r in big[12000:12100]], big[9000:9050])
        return {m: sorted(bytes(ffi.buffer(k)) for k in kp._keys(m, ctype)) for m, ctype in (
            (bc.MAP_ROUTES4, "fu_key4"), (bc.MAP_PEERS4, "__u32"))}, dict(kp._routes)

    batched = apply(path)
    assert all(path._batch_ok.values())
    with KernelPath() as single:
        single._batch_ok = dict.fromkeys(path._batch_ok, False)
        assert apply(single) == batched
    assert len(batched[1]) == 8000 + 3900 + 1 + 50


def test_the_kernel_engine_gives_the_maps_a_whole_tables_duplicates(engine):
    """KernelEngine (kernel_engine.py): a table made whole reaches the maps with the replaced
    duplicate's peer, a table derived from it without."""
    dups = [Route.make("10.5.2.0/24", PEER, PORT), Route.make("10.5.2.0/24", OTHER_PEER, PORT)]
    table = engine.table_type.of(dups)
    engine.set_table(table)

    def senders():
        return {str(ipaddress.IPv4Address(bytes(ffi.buffer(k))))
                for k in engine.kpath._keys(bc.MAP_PEERS4, "__u32")}
    assert senders() == {PEER, OTHER_PEER}
    engine.set_table(table.updated((), [Route.make("10.5.3.0/24", OTHER_PEER, PORT)]))
    assert senders() == {OTHER_PEER}


def test_a_batched_delete_skips_a_key_that_is_gone(path):
    """The kernel stops a batch at a key it does not find (ENOENT): the rest are deleted."""
    from dataplane.engine.bpf_lib import delete_batch, update_batch
    keys = [ipaddress.ip_address(f"192.168.8.{i}").packed for i in range(1, 6)]
    fd = path.map_fd[bc.MAP_PEERS4]
    update_batch(fd, b"".join(keys[:4]), bytes(16), 4, "writing")
    delete_batch(fd, b"".join([keys[0], keys[4], keys[1], keys[4], keys[2]]), 5, 4, "deleting")
    left = {bytes(ffi.buffer(k)) for k in path._keys(bc.MAP_PEERS4, "__u32")}
    assert left == {keys[3]}


def test_without_an_ipv6_underlay_a_subnet_routed_over_it_has_no_route():
    """The programs have no own PublicIPv6 here: a subnet whose route goes over the IPv6
    underlay is left out of the maps (the engine carries it), even where a replaced duplicate
    of it went over IPv4."""
    import socket
    require_bpf()
    from dataplane.engine import multi
    from dataplane.engine.bpf_path import KernelPath
    from dataplane.engine.kernel_engine import KernelEngine
    from dataplane.engine.pyengine import PyEngine
    tun = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    s4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    slow = multi.create(PyEngine, [tun[0].fileno()], {4: [s4.fileno()], 6: [s6.fileno()]},
                        tun_addr="10.5.1.0", mtu=MTU, accept_any=False)
    e = KernelEngine(slow, KernelPath(), tun_ifindex=1, ext_ifindex=1, own_ip=OWN_IP,
                     port=PORT)
    try:
        subnet6 = "fd00:5:2::/64"
        e.set_table(e.table_type.of([Route.make(subnet6, PEER, PORT),
                                     Route.make(subnet6, "fd00:99::2", PORT, mtu=1400),
                                     Route.make("10.5.3.0/24", OTHER_PEER, PORT)]))
        assert set(map(str, e.kpath._routes)) == {"10.5.3.0/24"}
    finally:
        e.close()
        for sock in (*tun, s4, s6):
            sock.close()
