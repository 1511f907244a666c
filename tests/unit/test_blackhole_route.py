"""--ip-blackhole-route without a kernel: when the daemon checks the route, what a lease move and a
failure do, what is logged (daemon/blackhole_route.py), and which route messages of a dump are
blackholes of the main table (host/blackhole.py). The kernel's side:
tests/integration/test_blackhole_route.py."""
from __future__ import annotations

import errno
import ipaddress
import logging
import struct
from ipaddress import IPv4Network

import pytest

from dataplane.daemon.blackhole_route import BlackholeRoute
from dataplane.host import blackhole

A, B, C = (IPv4Network(f"10.5.{n}.0/24") for n in (3, 9, 12))


class FakeKernel:
    """The blackholes of the main table, as host/blackhole.py would find and change them;
    ``fail`` holds the errors the next calls raise, by function name."""

    def __init__(self, *present):
        self.routes = set(present)
        self.fail: dict = {}
        self.calls: list = []

    def _maybe_fail(self, name):
        errs = self.fail.get(name)
        if errs:
            raise errs.pop(0)

    def add(self, subnet) -> bool:
        self.calls.append(("add", subnet))
        self._maybe_fail("add")
        if subnet in self.routes:
            return False
        self.routes.add(subnet)
        return True

    def remove(self, subnet) -> int:
        self.calls.append(("remove", subnet))
        self._maybe_fail("remove")
        n = int(subnet in self.routes)
        self.routes.discard(subnet)
        return n


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def keeper(kernel, enabled=True, period=5):
    clock = Clock()
    return BlackholeRoute(enabled, period, host=kernel, clock=clock), clock


def eperm():
    return OSError(errno.EPERM, "Operation not permitted")


def messages(caplog, level=logging.INFO):
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_added_at_once_with_the_lease_not_a_period_later(caplog):
    caplog.set_level(logging.INFO)
    kernel = FakeKernel()
    bh, _ = keeper(kernel)
    bh.want(A)
    assert kernel.routes == {A} and bh.present and bh.added == 1
    assert any(f"blackhole {A} proto 153 metric 4294967295" in m for m in messages(caplog))


def test_checked_once_a_period_on_the_tick_and_put_back_when_gone(caplog):
    caplog.set_level(logging.INFO)
    kernel = FakeKernel()
    bh, clock = keeper(kernel, period=5)
    bh.want(A)
    kernel.routes.clear()                       # `ip route del blackhole ...`
    for _ in range(4):                          # the daemon ticks every second
        clock.now += 1
        bh.tick()
    assert kernel.routes == set() and kernel.calls == [("add", A)]
    clock.now += 1
    bh.tick()
    assert kernel.routes == {A} and bh.added == 2
    assert any("was gone" in m and "added it again" in m for m in messages(caplog))


def test_a_route_already_there_is_kept_without_a_second_one(caplog):
    """A restarted daemon, or one that took over: the route is there and nothing is added."""
    caplog.set_level(logging.INFO)
    kernel = FakeKernel(A)
    bh, clock = keeper(kernel)
    bh.want(A, previous=A)
    clock.now += 5
    bh.tick()
    assert kernel.routes == {A} and bh.added == 0 and bh.present
    assert ("remove", A) not in kernel.calls
    assert sum("in place already" in m for m in messages(caplog)) == 1


def test_a_failure_is_said_once_with_its_cause_retried_each_period_and_never_raises(caplog):
    caplog.set_level(logging.INFO)
    kernel = FakeKernel()
    kernel.fail["add"] = [eperm() for _ in range(3)]
    bh, clock = keeper(kernel, period=5)
    bh.want(A)
    for _ in range(10):                         # two periods: two more attempts, both failing
        clock.now += 1
        bh.tick()
    assert kernel.calls == [("add", A)] * 3 and not bh.present
    warned = messages(caplog, logging.WARNING)
    assert len(warned) == 1, warned
    assert "EPERM" in warned[0] and "CAP_NET_ADMIN" in warned[0] and "every 5 s" in warned[0]
    assert bh.status()["problem"] and bh.status()["add_failures"] == 3
    clock.now += 5
    bh.tick()                                   # the kernel takes it now
    assert kernel.routes == {A} and bh.present and bh.status()["problem"] is None
    assert any("recovered" in m for m in messages(caplog))


def test_a_lease_move_removes_the_old_subnets_and_adds_the_new_ones():
    kernel = FakeKernel()
    bh, _ = keeper(kernel)
    bh.want(A)
    bh.moved(A, B)
    assert kernel.routes == {B} and bh.subnet == B
    bh.moved(B, B)                              # the same subnet: nothing to do
    assert kernel.calls == [("add", A), ("remove", A), ("add", B)]


def test_an_old_subnets_route_that_will_not_go_is_retried_until_it_does(caplog):
    caplog.set_level(logging.INFO)
    kernel = FakeKernel()
    bh, clock = keeper(kernel, period=5)
    bh.want(A)
    kernel.fail["remove"] = [eperm()]
    bh.moved(A, B)
    assert kernel.routes == {A, B} and bh.status()["stale"] == [str(A)]
    assert any(blackhole.removal_command(A) in m for m in messages(caplog, logging.WARNING))
    clock.now += 5
    bh.tick()
    assert kernel.routes == {B} and bh.status()["stale"] == []
    bh.moved(B, A)                              # back to A: A is no longer stale, B is
    assert kernel.routes == {A}


def test_at_start_the_subnet_subnet_env_named_loses_its_route_when_the_lease_is_another():
    kernel = FakeKernel(A)
    bh, _ = keeper(kernel)
    bh.want(B, previous=A)
    assert kernel.routes == {B}


def test_at_exit_it_stays_and_the_log_says_how_to_remove_it(caplog):
    caplog.set_level(logging.INFO)
    kernel = FakeKernel()
    bh, _ = keeper(kernel)
    bh.want(C)
    calls = list(kernel.calls)
    bh.leave()
    assert kernel.routes == {C} and kernel.calls == calls
    assert any(f"ip route del blackhole {C}" in m for m in messages(caplog))


def test_without_the_flag_nothing_is_touched_or_said(caplog):
    caplog.set_level(logging.DEBUG)
    kernel = FakeKernel()
    bh, clock = keeper(kernel, enabled=False)
    bh.want(A, previous=B)
    bh.moved(A, B)
    clock.now += 100
    bh.tick()
    bh.leave()
    assert kernel.calls == [] and bh.status() is None
    assert not [r for r in caplog.records if r.name == "dataplane.daemon.blackhole_route"]


def route_msg(dst, dst_len=24, rtype=blackhole.RTN_BLACKHOLE, table=254, metric=None,
              family=2, proto=153) -> bytes:
    """One route message of a dump as the kernel writes it: rtmsg, then attributes (a table
    above 255 is in RTA_TABLE only)."""
    attrs = b""

    def attr(kind, value):
        return struct.pack("=HH", 4 + len(value), kind) + value

    if dst is not None:
        attrs += attr(1, ipaddress.IPv4Address(dst).packed)
    if metric is not None:
        attrs += attr(6, struct.pack("=I", metric))
    attrs += attr(15, struct.pack("=I", table))
    return struct.pack("=BBBBBBBBI", family, dst_len, 0, 0, min(table, 252), proto, 0, rtype,
                       0) + attrs


@pytest.mark.parametrize("msg, seen", [
    (route_msg("10.5.3.0"), (A.network_address, 24, 0, 153)),            # flanneld's metric
    (route_msg("10.5.3.0", metric=blackhole.METRIC), (A.network_address, 24, blackhole.METRIC,
                                                      153)),
    (route_msg("10.5.3.0", rtype=1), None),                               # cni0's connected route
    (route_msg("10.5.3.0", table=1000), None),                            # another table
    (route_msg("10.5.3.0", family=10), None),
    (route_msg(None, dst_len=0), (ipaddress.IPv4Address(0), 0, 0, 153)),  # a default blackhole
    (b"\x02\x18", None),                                                  # cut short
])
def test_which_route_messages_of_a_dump_are_blackholes_of_the_main_table(msg, seen):
    assert blackhole._blackhole_of(msg) == seen


def test_the_metric_is_the_last_one_and_the_command_needs_none():
    assert blackhole.METRIC == 2 ** 32 - 1
    assert blackhole.removal_command(A) == "ip route del blackhole 10.5.3.0/24"
