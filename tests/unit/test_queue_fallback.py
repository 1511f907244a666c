"""One queue where the host refuses the sockets' steering program (dataplane/host/udpsock.py),
no root: the decision, the sockets it leaves, the daemon's messages, and the handover's check.

The refusal is the kernel's own: the steering option's number is swapped for one no kernel
knows, and setsockopt() answers ENOPROTOOPT as QEMU's user-mode emulation does for the real
one. Sockets bind on loopback only.
"""
from __future__ import annotations

import errno
import json
import logging
import socket
import time
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from types import SimpleNamespace

import pytest

from dataplane.control.config import parse_config
from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.daemon import inherited, startup
from dataplane.daemon.startup import StartupError
from dataplane.host import udpsock
from dataplane.host.tun import IFF_MULTI_QUEUE, IFF_NO_PI, IFF_TUN
from dataplane.host.udpsock import (STEERING_CALL, SocketCallError, open_queue_sockets,
                                    open_udp_sockets, steering_refusal, steering_refused)

UNKNOWN_OPTION = 0x7FFF          # no SOL_SOCKET option has this number


@pytest.fixture
def refusing(monkeypatch):
    monkeypatch.setattr(udpsock, "SO_ATTACH_REUSEPORT_CBPF", UNKNOWN_OPTION)


def _err(call: str, code: int) -> SocketCallError:
    return SocketCallError(call, OSError(code, "x"))


@pytest.mark.parametrize("code", sorted(udpsock.STEERING_REFUSED))
def test_a_host_that_does_not_steer_means_one_queue(code):
    assert steering_refused(_err(STEERING_CALL, code))


@pytest.mark.parametrize("e", [
    _err(STEERING_CALL, errno.EINVAL),          # the kernel rejected our program: a bug
    _err(STEERING_CALL, errno.ENOMEM),          # a limit (optmem_max), not a missing feature
    _err("bind(127.0.0.1:8285)", errno.ENOPROTOOPT),
    _err("setsockopt(SOL_SOCKET, SO_REUSEPORT)", errno.ENOPROTOOPT),
    OSError(errno.ENOPROTOOPT, "not from open_udp_sockets"),
    ValueError("no OSError"),
])
def test_other_failures_stay_errors(e):
    assert not steering_refused(e)


def test_an_error_names_its_call():
    e = _err("bind(192.0.2.1:8285)", errno.EADDRNOTAVAIL)
    assert isinstance(e, OSError) and e.errno == errno.EADDRNOTAVAIL and e.strerror == "x"
    assert str(e) == "bind(192.0.2.1:8285) failed: EADDRNOTAVAIL (x)"
    with pytest.raises(SocketCallError) as got:
        open_udp_sockets("192.0.2.1", 0, 2)      # TEST-NET-1: no address of this host
    assert got.value.call == "bind(192.0.2.1:0)" and got.value.errno == errno.EADDRNOTAVAIL


def test_this_kernel_steers():
    assert steering_refusal() is None
    socks, refused = open_queue_sockets("127.0.0.1", 0, 3, bufsize=1 << 16)
    try:
        assert refused is None and len(socks) == 3
        assert len({s.getsockname() for s in socks}) == 1
    finally:
        for s in socks:
            s.close()


def test_refused_steering_leaves_one_exclusive_socket(refusing):
    with pytest.raises(SocketCallError) as strict:
        open_udp_sockets("127.0.0.1", 0, 3, bufsize=1 << 16)
    assert steering_refused(strict.value) and strict.value.errno == errno.ENOPROTOOPT
    assert steering_refusal().errno == errno.ENOPROTOOPT
    socks, refused = open_queue_sockets("127.0.0.1", 0, 3, bufsize=1 << 16)
    try:
        assert len(socks) == 1 and refused.call == STEERING_CALL
        assert refused.errno == errno.ENOPROTOOPT
        s = socks[0]
        # flanneld's socket: no SO_REUSEPORT, so nothing else can join its port
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 0
        other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        with pytest.raises(OSError) as taken:
            other.bind(s.getsockname())
        other.close()
        assert taken.value.errno == errno.EADDRINUSE
    finally:
        for s in socks:
            s.close()


def test_a_rejected_program_is_an_error_not_a_fallback(monkeypatch):
    # a jump past the end: the kernel knows the option and rejects the program (EINVAL)
    monkeypatch.setattr(udpsock, "steering_program", lambda queues: [(0x05, 0, 0, 99)])
    with pytest.raises(SocketCallError) as got:
        open_queue_sockets("127.0.0.1", 0, 2, bufsize=1 << 16)
    assert got.value.call == STEERING_CALL and got.value.errno == errno.EINVAL


def _ext(addr: str):
    return SimpleNamespace(iface_addr=IPv4Address(addr))


def test_the_daemon_warns_once_and_opens_one_socket(refusing, caplog):
    caplog.set_level(logging.INFO, logger="dataplane.daemon.startup")
    socks = startup.open_sockets(_ext("127.0.0.1"), 0, 2)
    try:
        assert len(socks) == 1 and socks[0].getblocking() is False
    finally:
        socks[0].close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert STEERING_CALL in warnings[0] and "ENOPROTOOPT" in warnings[0]
    assert "running 1 queue instead of 2" in warnings[0]


def test_a_bind_failure_names_bind_and_the_interface():
    with pytest.raises(StartupError) as got:
        startup.open_sockets(_ext("192.0.2.1"), 0, 1)
    msg = str(got.value)
    assert "bind(192.0.2.1:0) failed: EADDRNOTAVAIL" in msg and "check --iface" in msg, msg


def test_a_port_in_use_names_the_holder_not_the_interface():
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    holder.bind(("127.0.0.1", 0))
    try:
        for queues in (1, 2):
            with pytest.raises(StartupError) as got:
                startup.open_sockets(_ext("127.0.0.1"), holder.getsockname()[1], queues)
            msg = str(got.value)
            assert "EADDRINUSE" in msg and "still running" in msg and "--iface" not in msg, msg
    finally:
        holder.close()


def test_a_rejected_program_stops_the_daemon_with_the_call(monkeypatch):
    monkeypatch.setattr(udpsock, "steering_program", lambda queues: [(0x05, 0, 0, 99)])
    with pytest.raises(StartupError) as got:
        startup.open_sockets(_ext("127.0.0.1"), 0, 2)
    msg = str(got.value)
    assert STEERING_CALL in msg and "EINVAL" in msg and "--queues=1" in msg, msg


# -- what a new daemon is handed after a fallback (daemon/inherited.py) ----------------------

CONFIG = {"Network": "10.5.0.0/16", "Backend": {"Type": "udp"}}
SUBNET = IPv4Network("10.5.7.0/24")
EXT = SimpleNamespace(name="eth1", iface_addr=IPv4Address("192.168.1.5"),
                      ext_addr=IPv4Address("192.168.1.5"), tun_mtu=1472)
LEASE = Lease(subnet=SUBNET, attrs=LeaseAttrs(public_ip=EXT.ext_addr),
              expiration=time.time() + 86400, lease_id=1, mod_revision=1, key="k")
STATE = {"version": inherited.STATE_VERSION, "pid": 1, "engine": "python",
         "tun": {"name": "flannel0", "queues": 1, "vnet": False},
         "udp": {"addr": str(EXT.iface_addr), "port": 8285}, "mtu": 1472, "config": CONFIG,
         "lease": inherited.lease_json(LEASE), "peers": []}


def _why(multi_queue_device: bool, refused, queues: int = 2):
    flags = IFF_TUN | IFF_NO_PI | (IFF_MULTI_QUEUE if multi_queue_device else 0)
    obs = inherited.Observed(tun=[("flannel0", flags)], mtu=1472,
                             addrs=[IPv4Interface("10.5.7.0/32")],
                             udp=[(str(EXT.iface_addr), 8285)], steering_refused=refused)
    return inherited.mismatch(STATE, obs, ext=EXT, config=parse_config(json.dumps(CONFIG)),
                              lease=LEASE, queues=queues, vnet=False)


@pytest.mark.parametrize("multi_queue_device", [True, False])
def test_one_queue_is_taken_over_where_steering_is_refused(multi_queue_device):
    # the fallback's device (made for two, one queue left) or a --queues=1 one: either is
    # what a one-queue daemon runs on
    assert _why(multi_queue_device, _err(STEERING_CALL, errno.ENOPROTOOPT)) is None


def test_one_queue_is_not_taken_over_where_the_kernel_steers():
    assert "this daemon runs 2 queue(s)" in _why(True, None)


def test_a_one_queue_daemon_still_wants_a_one_queue_device():
    assert "is a multi-queue device" in _why(True, _err(STEERING_CALL, errno.ENOPROTOOPT),
                                             queues=1)


def test_observe_asks_the_host_only_for_one_queue(refusing):
    a, b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET,
                                                                           socket.SOCK_DGRAM)
    try:
        # fds that are no TUN: observe records their errors, the steering answer comes anyway
        assert inherited.observe([a.fileno()], [a]).steering_refused.errno == errno.ENOPROTOOPT
        assert inherited.observe([a.fileno(), b.fileno()], [a, b]).steering_refused is None
    finally:
        a.close()
        b.close()
