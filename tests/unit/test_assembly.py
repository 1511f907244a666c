"""The dataplane's assembly (dataplane/host/assembly.py), no root: the TUN queues are SOCK_DGRAM
socketpairs, netlink is a stand-in, the UDP sockets are real ones on loopback. What is pinned:
the one-queue fallback closes the TUN queues no socket pairs with, a failing step is named and
leaves nothing open, a daemon handed one queue says the fallback as a fresh start does, and the
engines are made on the queues that are left.
"""
from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket

import pytest

from dataplane.engine import engine_class
from dataplane.host import assembly, netconf, udpsock
from dataplane.host.assembly import AssemblyError, Dataplane, open_sockets
from dataplane.host.family import V4, Part
from dataplane.host.offload import Offloads

UNKNOWN_OPTION = 0x7FFF          # no SOL_SOCKET option has this number: the host "refuses"
FALLBACK = "running 1 queue instead of"


class PairTun(Offloads):
    """Offloads (off) whose TUN queues are socketpairs; it keeps the other ends, and what the
    probe was handed."""

    def __init__(self):
        super().__init__("off", "python")
        self.ends: list = []
        self.probed = None

    def open_tun(self, name_template: str, queues: int):
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(queues)]
        self.ends += [b for _, b in pairs]
        return [a.detach() for a, _ in pairs], name_template.replace("%d", "0")

    def probe(self, tun_fds, socks) -> int:
        self.probed = (list(tun_fds), list(socks))
        return super().probe(tun_fds, socks)

    def close(self):
        for b in self.ends:
            b.close()


def _raising(e: BaseException):
    def call(*_args, **_kw):
        raise e
    return call


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as e:
        assert e.errno == errno.EBADF
        return False
    return True


@pytest.fixture
def tun():
    t = PairTun()
    yield t
    t.close()


@pytest.fixture
def netlink(monkeypatch):
    """flannel0's address and route as netlink would have been asked for them."""
    asked = []
    monkeypatch.setattr(netconf, "configure_tun",
                        lambda name, addrs, mtu, txqueuelen=None: asked.append(
                            ("addr", name, list(addrs), mtu, txqueuelen)))
    monkeypatch.setattr(netconf, "add_network_route",
                        lambda network, name: asked.append(("route", network, name)) or True)
    return asked


@pytest.fixture
def refusing(monkeypatch):
    monkeypatch.setattr(udpsock, "SO_ATTACH_REUSEPORT_CBPF", UNKNOWN_OPTION)


def _open(tun, queues: int, sockets=None, network="10.5.0.0/16", more=()):
    return Dataplane.open(tun, tun_name="flannel%d", mtu=1472, queues=queues,
                          parts=[Part(network, address="10.5.1.0/32"), *more],
                          sockets={V4: sockets or (lambda n: open_sockets("127.0.0.1", 0, n))})


def test_a_dual_stack_lease_gives_flannel0_ipv6_and_its_route(tun, netlink):
    dp = _open(tun, 1, more=[Part(ipaddress.ip_network("fc00:66::/56"),
                                  ipaddress.ip_network("fc00:66:0:62::/64"))])
    try:
        assert netlink == [("addr", "flannel0", ["10.5.1.0/32", "fc00:66:0:62::/128"], 1472,
                            assembly.TXQUEUELEN),
                           ("route", "10.5.0.0/16", "flannel0"),
                           ("route", ipaddress.ip_network("fc00:66::/56"), "flannel0")]
    finally:
        dp.close()


def test_every_queue_pairs_a_tun_fd_with_a_socket(tun, netlink):
    dp = _open(tun, 3)
    try:
        assert dp.tun_name == "flannel0" and dp.queues == 3 and len(dp.tun_fds) == 3
        assert netlink == [("addr", "flannel0", ["10.5.1.0/32"], 1472, assembly.TXQUEUELEN),
                           ("route", "10.5.0.0/16", "flannel0")]
        assert tun.probed == (dp.tun_fds, dp.sockets[V4])
        assert all(s.getblocking() is False for s in dp.sockets[V4])
        assert len({s.getsockname() for s in dp.sockets[V4]}) == 1
    finally:
        dp.close()


def test_no_network_no_route(tun, netlink):
    dp = _open(tun, 1, network=None)
    dp.close()
    assert [a[0] for a in netlink] == ["addr"]


def test_refused_steering_leaves_one_queue_and_closes_the_others(tun, netlink, refusing,
                                                                 caplog):
    dp = _open(tun, 3)
    try:
        assert dp.queues == 1 and len(dp.tun_fds) == 1
        assert tun.probed == (dp.tun_fds, dp.sockets[V4])
        # the other two queues' socketpair ends see their peers gone
        for b in tun.ends[1:]:
            with pytest.raises(OSError):
                b.send(b"x")
        tun.ends[0].send(b"x")          # the one kept is open
    finally:
        dp.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and f"{FALLBACK} 3" in warned[0] and "ENOPROTOOPT" in warned[0]


@pytest.mark.parametrize("step", ["tun", "configure", "sockets"])
def test_a_failing_step_is_named_and_leaves_nothing_open(tun, netlink, monkeypatch, step):
    opened = []

    def sockets(n):
        if step == "sockets":
            raise udpsock.SocketCallError("bind(127.0.0.1:1)", OSError(errno.EADDRINUSE, "x"))
        socks = open_sockets("127.0.0.1", 0, n)
        opened.extend(socks)
        return socks
    if step == "tun":
        monkeypatch.setattr(tun, "open_tun", _raising(OSError(errno.ENOENT, "no /dev/net/tun")))
    if step == "configure":
        monkeypatch.setattr(netconf, "configure_tun", _raising(RuntimeError("netlink said no")))
    with pytest.raises(AssemblyError) as got:
        _open(tun, 2, sockets=sockets)
    e = got.value
    assert e.step == step and e.tun_name == (None if step == "tun" else "flannel0")
    assert opened == []                 # the sockets' step never ran, or failed whole
    for b in tun.ends:                  # flannel0's queues closed: the device would go
        with pytest.raises(OSError):
            b.send(b"x")


def test_a_caller_error_in_the_sockets_step_passes_through_and_closes_the_tun(tun, netlink):
    class Refused(RuntimeError):
        pass

    with pytest.raises(Refused):
        _open(tun, 2, sockets=_raising(Refused("the daemon's own message")))
    for b in tun.ends:
        with pytest.raises(OSError):
            b.send(b"x")


@pytest.mark.parametrize("refused", [True, False])
def test_a_daemon_handed_one_queue_says_the_fallback_only_where_it_is_one(
        tun, monkeypatch, caplog, refused):
    if refused:
        monkeypatch.setattr(udpsock, "SO_ATTACH_REUSEPORT_CBPF", UNKNOWN_OPTION)
    fds, _ = tun.open_tun("flannel%d", 1)
    socks = udpsock.open_udp_sockets("127.0.0.1", 0, 1)
    dp = Dataplane.adopt(tun, fds, "flannel0", {V4: socks}, queues=2)
    try:
        assert dp.queues == 1 and dp.tun_fds == fds and tun.probed == (fds, socks)
    finally:
        dp.close()
    warned = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and FALLBACK in r.getMessage()]
    assert len(warned) == (1 if refused else 0), warned
    assert not _is_open(fds[0]) and socks[0].fileno() == -1


def test_engines_are_made_on_the_queues(tun, netlink, engine_kind):
    dp = _open(tun, 2)
    try:
        engine = dp.engine(engine_class(engine_kind), tun_addr="10.5.1.0", mtu=1472)
        try:
            assert len(engine) == 2 and engine.name == engine_kind
            assert [q.tun_fd for q in engine.queues] == dp.tun_fds
            assert [q.udp_fds[4] for q in engine.queues] == [s.fileno() for s in dp.sockets[V4]]
        finally:
            engine.close()
    finally:
        dp.close()
    assert dp.tun_fds == [] and dp.sockets == {}
    dp.close()                          # again: nothing left to close
