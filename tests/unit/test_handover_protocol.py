"""The handover socket (dataplane/daemon/handover.py), no root: the running daemon's end with a
stand-in daemon (pipes for flannel0's queues, real UDP sockets), the new daemon's end as the
daemon calls it."""
from __future__ import annotations

import os
import socket
import threading
import time
from ipaddress import IPv4Address, IPv4Network
from types import SimpleNamespace

import pytest

from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.control.peerset import PeerSnapshot
from dataplane.daemon import handover
from dataplane.daemon.handover import HandoverServer, connect, recv_frame, send_frame
from dataplane.host.family import V4, V6
from tests.conftest import wait_until


class FakeEngine:
    name = "c"

    def __init__(self):
        self.running = True
        self.closed = False

    def stop(self):
        self.running = False

    def join(self, timeout=None):
        return not self.running

    def close(self):
        self.running, self.closed = False, True


class FakeDaemon:
    """What HandoverServer and inherited.state_of use of a daemon (daemon/succession.py
    Succession, and its state)."""

    def __init__(self, queues: int = 2):
        self.pipes = [os.pipe() for _ in range(queues)]
        socks = []
        for _ in range(queues):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        lease = Lease(subnet=IPv4Network("10.5.7.0/24"),
                      attrs=LeaseAttrs(public_ip=IPv4Address("127.0.0.1")),
                      expiration=time.time() + 3600, lease_id=5, mod_revision=9)
        peers = PeerSnapshot.of([Lease(subnet=IPv4Network("10.5.9.0/24"),
                                       attrs=LeaseAttrs(public_ip=IPv4Address("127.0.0.9")))],
                                lease.subnet)
        self.state = SimpleNamespace(
            lock=threading.RLock(), engine=FakeEngine(), engine_cls=SimpleNamespace(name="c"),
            # no such device: release() finds it gone
            dataplane=SimpleNamespace(tun_fds=[r for r, _ in self.pipes], sockets={V4: socks},
                                      tun_name=f"fu{os.getpid()}t"),
            offloads=SimpleNamespace(vnet=True),
            ext=SimpleNamespace(iface_addr=IPv4Address("127.0.0.1"), tun_mtu=1472),
            config=SimpleNamespace(backend_port=8285, raw={"Network": "10.5.0.0/16"}),
            lease=lease, peers={4: peers, 6: peers}, current_lease=lambda: lease)
        self.state_file = None
        self.handing_over = False
        self.stopped = threading.Event()
        self.successor = None
        self.resumed = 0
        self.let_go = False                 # stop_reconciling() called: it may only exit now

    def stop(self):
        self.stopped.set()

    def stop_reconciling(self):
        self.let_go = True

    def handed_over(self, pid):
        self.successor = pid
        self.stop()

    def resume_engine(self):
        self.state.engine = FakeEngine()
        self.handing_over = False
        self.resumed += 1

    def close(self):
        for r, w in self.pipes:
            os.close(r)
            os.close(w)
        for s in self.state.dataplane.sockets[V4]:
            s.close()


@pytest.fixture
def old(tmp_path):
    d = FakeDaemon()
    server = HandoverServer(str(tmp_path / "run" / "handover.sock"), d).start()
    d.server = server
    try:
        yield d
    finally:
        server.close()
        d.close()


def _same_file(a: int, b: int) -> bool:
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def test_the_socket_is_for_root_only(old):
    assert os.stat(old.server.path).st_mode & 0o777 == 0o600


def test_a_handover_moves_the_fds_and_the_state(old):
    new = connect(old.server.path)
    assert new is not None and new.old_running
    assert new.state["pid"] == os.getpid() and new.state["tun"]["queues"] == 2
    assert new.state["lease"]["subnet"] == "10.5.7.0/24"
    assert new.state["peers"] == [["10.5.9.0/24", "127.0.0.9"]]
    assert all(_same_file(a, b) for a, b in zip(new.tun_fds, old.state.dataplane.tun_fds))
    assert ([s.getsockname() for s in new.sockets[V4]]
            == [s.getsockname() for s in old.state.dataplane.sockets[V4]])
    assert old.state.engine.running                      # forwarding until the new one is ready
    started = []

    def start():
        assert not old.state.engine.running and old.handing_over   # never both engines at once
        started.append(True)

    state = new.switch(start)
    assert started and state["lease"]["mod_revision"] == 9
    assert old.stopped.wait(5) and old.successor == os.getpid()
    for fd in new.tun_fds:
        os.close(fd)
    for s in new.sockets[V4]:
        s.close()


def test_a_new_daemon_that_goes_away_after_stop_leaves_the_old_forwarding(old):
    new = connect(old.server.path)
    send_frame(new.conn, {"op": "stop"})
    doc, _ = recv_frame(new.conn)
    assert doc["op"] == "stopped" and not old.state.engine.running
    new.conn.close()                               # it died before it forwarded
    wait_until(lambda: old.resumed, 5, 0.01, "the old daemon to resume")
    assert old.resumed == 1 and old.state.engine.running and not old.stopped.is_set()
    assert not old.let_go                          # it serves on: its resync too
    new.release()
    # and the next one can still take over
    again = connect(old.server.path)
    again.switch(lambda: None)
    assert old.stopped.wait(5)
    again.release()


def test_a_new_daemon_that_starts_afresh_makes_the_old_one_exit(old):
    new = connect(old.server.path)

    def old_exits():
        old.stopped.wait(5)
        old.server.close()                         # its exit: the connection ends

    t = threading.Thread(target=old_exits)
    t.start()
    new.release()                                  # returns once the old one is gone
    t.join(5)
    assert old.stopped.is_set() and old.successor is None and old.state.engine.running
    assert old.let_go            # from "exit" on, the new one's rules are not put back


def test_nobody_listening_is_a_fresh_start(tmp_path):
    assert connect(str(tmp_path / "none.sock")) is None
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()                                      # a dead daemon's socket file
    assert connect(str(stale)) is None


def test_frames_carry_more_fds_than_one_message_can():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    try:
        n = handover.MAX_FDS_PER_FRAME * 2 + 3
        sender = threading.Thread(target=send_frame, args=(a, {"op": "offer"}, [r] * n))
        sender.start()
        doc, fds = recv_frame(b)
        sender.join(5)
        assert doc == {"op": "offer", "fds": n} and len(fds) == n
        assert all(_same_file(fd, r) for fd in fds)
        for fd in fds:
            os.close(fd)
    finally:
        for x in (a, b):
            x.close()
        os.close(r)
        os.close(w)


def test_a_frame_that_is_no_json_object_is_refused():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        a.sendall(handover._LEN.pack(2) + b"[]")
        with pytest.raises(handover.HandoverError):
            recv_frame(b)
        a.close()
        with pytest.raises(handover.HandoverError):
            recv_frame(b)                          # closed: not a hang, not an empty frame
    finally:
        b.close()


def test_the_ipv6_underlay_sockets_go_only_to_a_daemon_that_takes_them(old):
    """A new daemon says "udp6" in its hello and gets the IPv6 sockets after the IPv4 ones
    (the state counts them); an older one's hello gets the offer it knows."""
    dp = old.state.dataplane
    six = dp.sockets[V6] = []
    for _ in dp.sockets[V4]:
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        s.bind(("::1", 0))
        six.append(s)
    try:
        new = connect(old.server.path)
        assert new.state["udp6"] == {"addr": "::1", "sockets": 2}
        assert [s.getsockname() for s in new.sockets[V6]] == [s.getsockname() for s in six]
        assert ([s.getsockname() for s in new.sockets[V4]]
                == [s.getsockname() for s in dp.sockets[V4]])
        new._close()                               # it goes away before "stop"
        new.conn.close()
        # an older daemon's hello: no IPv6 fds, the TUN queues and sockets as ever
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(old.server.path)
        send_frame(conn, {"op": "hello", "pid": os.getpid()})
        doc, fds = recv_frame(conn)
        assert doc["op"] == "offer" and "udp6" not in doc and len(fds) == 4
        for fd in fds:
            os.close(fd)
        conn.close()
    finally:
        for s in six:
            s.close()


def test_a_daemon_taking_over_keeps_matching_ipv6_sockets_else_opens_or_goes_without():
    from dataplane.daemon import takeover
    from dataplane.daemon.inherited import Inherited
    from dataplane.host.udpsock import open_udp_sockets
    ext = SimpleNamespace(iface_addr=IPv4Address("127.0.0.1"))
    v4 = open_udp_sockets("127.0.0.1", 0, 2)
    handed = open_udp_sockets("::1", 0, 2)
    port = handed[0].getsockname()[1]
    wanted = ("2001:db8::1", "::1", 1452)
    try:
        inh = Inherited({}, [], {V4: v4, V6: handed})
        assert takeover.underlay6(inh, wanted, ext, port) == wanted and inh.sockets[V6] == handed
        # another port: let go, no IPv6 underlay this run
        assert takeover.underlay6(inh, wanted, ext, port + 1) is None and V6 not in inh.sockets
        assert all(s.fileno() == -1 for s in handed)
        # none handed (the previous daemon had none): opened now
        inh = Inherited({}, [], {V4: v4})
        assert takeover.underlay6(inh, wanted, ext, port) == wanted
        assert [s.getsockname()[:2] for s in inh.sockets[V6]] == [("::1", port)] * 2
        # not wanted: what came is let go
        mine = inh.sockets[V6]
        assert takeover.underlay6(inh, None, ext, port) is None
        assert all(s.fileno() == -1 for s in mine)
    finally:
        for s in v4 + handed:
            s.close()
