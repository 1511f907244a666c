"""The status socket answers every question, in every phase of the daemon's start: over a real
unix socket (daemon/status.py StatusServer), from a real daemon's state (daemon/main.py Daemon)
and a real engine (the Python one, its TUN and UDP sides socketpairs: nothing is sent).

Found by issue 47's scale test: a question while the main thread started the engine's loop got
a closed connection, because the engine's thread was made and not yet started, which
threading's join(0) (the readiness' "has it ended?") refuses with a RuntimeError."""
from __future__ import annotations

import logging
import socket
import threading
from ipaddress import IPv4Network
from types import SimpleNamespace

import pytest

from dataplane.daemon import status
from dataplane.daemon.main import Daemon
from dataplane.daemon.options import Options
from dataplane.engine.multi import MultiEngine
from dataplane.engine.pyengine import PyEngine


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(Options(subnet_file=str(tmp_path / "subnet.env"),
                       status_socket=str(tmp_path / "status.sock")))
    server = status.listen(d.state.opts.status_socket, d.state, d.source, d.warnings)
    yield d, server
    server.close()


@pytest.fixture
def engine():
    """A Python engine with one queue that is never started (its fds: two socketpairs)."""
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(2)]
    e = MultiEngine([PyEngine(pairs[0][0], pairs[1][0], "10.5.3.0", 1472)])
    yield e
    e.close()
    for a, b in pairs:
        a.close()
        b.close()


def ask(server) -> dict:
    return status.query(server.path, timeout=5.0)


def test_every_phase_of_the_start_gets_an_answer(daemon, engine):
    d, server = daemon
    doc = ask(server)                           # nothing yet: no config, no lease
    assert doc["phase"] == "starting" and doc["ready"] is False
    assert doc["checks"]["engine"] == "not started yet"
    d.state.lease = SimpleNamespace(subnet=IPv4Network("10.5.3.0/24"), public_ip="192.0.2.1",
                                    expiration=None, reservation=False, ipv6_subnet=None,
                                    attrs=SimpleNamespace(public_ipv6=None))
    d.state.engine = engine                     # made, its routes going in, not started
    doc = ask(server)
    assert doc["checks"]["engine"] == "starting" and doc["engine"]["engine"] == "python"
    # engine/api.py's start(): the loop's thread made, start() not yet called on it
    engine.queues[0]._thread = threading.Thread(target=lambda: None)
    doc = ask(server)
    assert doc["phase"] == "starting" and doc["ready"] is False, doc
    assert doc["checks"]["engine"] == "starting" and "error" not in doc, doc
    assert d.source.readiness()["engine"] == "starting"       # /readyz as well
    engine.queues[0]._thread = None
    d.state.phase = "running"                   # READY=1; an engine stopped now is stopped
    assert ask(server)["checks"]["engine"] == "queue(s) 0 stopped"


def test_a_document_that_cannot_be_made_is_answered_with_what_is_known(daemon, caplog):
    d, server = daemon
    d.state.lease = SimpleNamespace(subnet=IPv4Network("10.5.3.0/24"))

    def broken():
        raise KeyError("a bug")
    d.state.subnet_env = SimpleNamespace(stale=broken)
    with caplog.at_level(logging.DEBUG, logger="dataplane.daemon.status"):
        docs = [ask(server) for _ in range(3)]
    assert all(doc["ready"] is False and doc["phase"] == "starting" for doc in docs)
    assert docs[0]["lease"] == {"subnet": "10.5.3.0/24"} and "KeyError" in docs[0]["error"]
    # a bug, said once with its traceback; the next ones are counted
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].exc_info is not None, caplog.records
    assert server.failures == 3


def test_a_document_larger_than_the_socket_takes_arrives_whole(daemon):
    """The document goes in one send that cannot wait; what the socket did not take then
    follows (a status carries log records: a long one is no reason to lose the rest)."""
    d, server = daemon
    d.warnings.emit(logging.LogRecord("x", logging.WARNING, __file__, 1, "w" * 4_000_000,
                                      None, None))
    doc = ask(server)
    assert doc["warnings"][-1]["message"] == "w" * 4_000_000 and doc["pid"]
