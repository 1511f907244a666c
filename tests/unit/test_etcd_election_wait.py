"""A call that meets a cluster electing its leader waits for the vote; a dead etcd does not wait.

The real case (a member killed, the others answering "leader changed" until they vote) is in
tests/integration/test_etcd_cluster.py, where it is a race; here the answers are given in order,
so each rule is met every run. No network: gRPC channels connect only when a call is made, and the
call here is a function that raises what etcd's members would answer.
"""
from __future__ import annotations

import time

import grpc
import pytest

from dataplane.control import etcd
from dataplane.control.etcd_errors import RegistryUnavailableError


class Answer(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


LEADER_CHANGED = Answer(grpc.StatusCode.UNAVAILABLE, "etcdserver: leader changed")
NO_LEADER = Answer(grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader")
REFUSED = Answer(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; Connection refused")


def client(n: int = 3) -> etcd.EtcdClient:
    return etcd.EtcdClient([f"http://127.0.0.1:{1 + i}" for i in range(n)], warn_insecure=False)


def scripted(answers: list):
    """A call that raises each of ``answers`` in turn, then returns "ok"; it counts its tries."""
    tries = []

    def call(channel, metadata):
        tries.append(time.monotonic())
        if len(tries) <= len(answers):
            raise answers[len(tries) - 1]
        return "ok"
    return call, tries


def test_a_call_waits_for_the_vote_when_the_live_members_say_no_leader():
    c = client()
    # The leader is dead (refused), the others are electing for two rounds, then one answers.
    call, tries = scripted([REFUSED, LEADER_CHANGED, NO_LEADER] * 2)
    t0 = time.monotonic()
    assert c._call("get", call) == "ok"
    assert len(tries) == 7
    # Each new round came after a pause, not at once.
    assert tries[3] - tries[2] >= etcd.ELECTION_RETRY_S * 0.9
    assert time.monotonic() - t0 < etcd.ELECTION_WAIT_S
    c.close()


def test_the_wait_for_a_vote_is_bounded(monkeypatch):
    monkeypatch.setattr(etcd, "ELECTION_WAIT_S", 1.0)
    c = client()
    call, tries = scripted([LEADER_CHANGED] * 1000)
    t0 = time.monotonic()
    with pytest.raises(RegistryUnavailableError, match="leader changed"):
        c._call("get", call)
    took = time.monotonic() - t0
    assert 1.0 - etcd.ELECTION_RETRY_S <= took < 2.0
    assert len(tries) % 3 == 0 and 3 < len(tries) < 1000
    c.close()


def test_an_etcd_that_is_down_everywhere_fails_after_one_round():
    c = client()
    call, tries = scripted([REFUSED] * 1000)
    with pytest.raises(RegistryUnavailableError, match="failed on every endpoint"):
        c._call("get", call)
    assert len(tries) == 3
    c.close()
