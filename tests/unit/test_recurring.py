"""control/recurring.py: a failure that repeats is said once, reminded at a slow pace, and said
once when it is over; a fake clock stands for the hours an outage lasts."""
from __future__ import annotations

import importlib
import logging
import threading

import pytest

from dataplane.control import recurring
from dataplane.control.recurring import Recurring

LOGGER = "fu.test.recurring"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def lines(caplog):
    """The lines written at INFO and above, as (level, message)."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    return lambda: [(r.levelno, r.getMessage()) for r in caplog.records
                    if r.name == LOGGER and r.levelno >= logging.INFO]


def make(clock, **kw) -> Recurring:
    return Recurring(logging.getLogger(LOGGER), "etcd unreachable", clock=clock, **kw)


def test_an_hour_of_failures_every_second_is_a_line_a_minute(clock, lines):
    r = make(clock, remind_every=60)
    for _ in range(3600):
        r.fail("connection refused", "is etcd running?")
        clock.now += 1
    said = lines()
    assert said[0] == (logging.WARNING, "etcd unreachable: connection refused; is etcd running?")
    assert len(said) == 1 + 3599 // 60           # the first line, then one a minute
    assert all("still failing after" in text for _, text in said[1:])
    assert said[-1][1] == ("etcd unreachable: still failing after 59 min 0 s (3541 attempts): "
                           "connection refused")
    assert r.failing and r.attempts == 3600 and r.total == 3600


def test_ok_says_once_that_it_is_over_and_a_new_failure_is_said_again(clock, lines):
    r = make(clock)
    assert r.ok() is False and lines() == []      # nothing was failing: nothing to say
    r.fail("refused")
    clock.now += 125
    r.fail("refused")                           # a reminder: 125 s > 60 s
    assert r.ok("answering at http://e:2379") is True
    assert r.ok() is False                      # said once
    assert lines()[-1] == (logging.INFO, "etcd unreachable: recovered after 2 min 5 s (2 failed "
                                         "attempts); answering at http://e:2379")
    assert not r.failing and r.lasted() == 0 and r.cause == ""
    r.fail("refused")
    assert lines()[-1] == (logging.WARNING, "etcd unreachable: refused")
    assert r.attempts == 1 and r.total == 3


def test_a_new_cause_is_said_at_once(clock, lines):
    r = make(clock, level=logging.ERROR)
    r.fail("authentication failed")
    clock.now += 1
    r.fail("authentication failed")
    clock.now += 1
    r.fail("permission denied")
    assert lines() == [(logging.ERROR, "etcd unreachable: authentication failed"),
                       (logging.ERROR, "etcd unreachable: permission denied")]


def test_a_steady_key_keeps_a_changing_text_to_the_reminders(clock, lines):
    # Several loops report one outage, each in its own words: one line, and the reminder
    # carries the newest words.
    r = make(clock, remind_every=10)
    for i in range(30):
        r.fail(f"watch {i % 3} cannot open a stream", key="unreachable")
        clock.now += 1
    said = lines()
    assert [text for _, text in said] == [
        "etcd unreachable: watch 0 cannot open a stream",
        "etcd unreachable: still failing after 10 s (11 attempts): watch 1 cannot open a stream",
        "etcd unreachable: still failing after 20 s (21 attempts): watch 2 cannot open a stream"]
    assert r.key == "unreachable" and r.cause == "watch 2 cannot open a stream"


def test_extra_is_asked_only_for_the_lines_written(clock, lines):
    asked = []

    def extra():
        asked.append(clock.now)
        return f"{len(asked)} peer(s) kept"

    r = make(clock, remind_every=60)
    for _ in range(121):
        r.fail("refused", "retrying", extra)
        clock.now += 1
    assert len(asked) == 3                      # the first line and two reminders, not 121 times
    said = [text for _, text in lines()]
    assert said[0] == "etcd unreachable: refused; retrying; 1 peer(s) kept"
    assert said[1].endswith(": refused; 2 peer(s) kept")


def test_an_extra_that_fails_does_not_fail_the_line(clock, lines):
    r = make(clock)
    r.fail("refused", extra=lambda: 1 / 0)
    assert lines() == [(logging.WARNING, "etcd unreachable: refused; (state unknown: "
                                         "ZeroDivisionError)")]


def test_threads_reporting_one_problem_say_it_once(clock, lines):
    r = make(clock)
    barrier = threading.Barrier(8)

    def report():
        barrier.wait()
        for _ in range(200):
            r.fail("refused")

    threads = [threading.Thread(target=report) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(lines()) == 1 and r.attempts == 1600


@pytest.mark.parametrize("value,expected", [("2", 2.0), ("0.5", 0.5), ("nonsense", 60.0),
                                            ("0", 60.0), ("-3", 60.0), (None, 60.0)])
def test_the_pace_can_be_shortened_through_the_environment(monkeypatch, value, expected):
    # The daemon tests shorten it to see reminders within a short outage.
    if value is None:
        monkeypatch.delenv(recurring.REMIND_ENV, raising=False)
    else:
        monkeypatch.setenv(recurring.REMIND_ENV, value)
    try:
        module = importlib.reload(recurring)
        assert module.REMIND_EVERY == expected
        assert module.Recurring(logging.getLogger(LOGGER), "x").remind_every == expected
    finally:
        monkeypatch.delenv(recurring.REMIND_ENV, raising=False)
        importlib.reload(recurring)


def test_a_failure_just_after_a_recovery_waits_out_the_settle_window(clock, lines):
    r = make(clock, remind_every=60, settle=3.0)
    r.fail("refused")
    clock.now += 5
    assert r.ok("answering") is True
    said = len(lines())
    # A channel still in its reconnect backoff fails once more, then succeeds: nothing said.
    clock.now += 0.5
    r.fail("watch cannot open a stream")
    assert r.failing and len(lines()) == said
    clock.now += 0.5
    assert r.ok("answering") is True and len(lines()) == said
    # A failure that lasts past the window is said, with its cause, and its end too.
    clock.now += 0.5
    r.fail("refused again")
    clock.now += 3
    r.fail("refused again")
    assert lines()[said:] == [(logging.WARNING, "etcd unreachable: refused again")]
    clock.now += 1
    assert r.ok() is True
    assert "recovered after 4 s (2 failed attempts)" in lines()[-1][1]


def test_without_settle_a_failure_right_after_a_recovery_is_said_at_once(clock, lines):
    r = make(clock)
    r.fail("refused")
    r.ok()
    r.fail("refused")
    assert [text for _, text in lines()][-1] == "etcd unreachable: refused"
