"""The ping stream's floor: faster than MIN_INTERVAL_S, ping takes a core from the scene."""
from __future__ import annotations

import os
import resource
import shutil
import subprocess

import pytest

from dataplane.testbed.ping_stream import MIN_INTERVAL_S, PingStream
from tests.conftest import require


def test_a_stream_faster_than_the_floor_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="busy-polls a core"):
        PingStream(None, None, "127.0.0.1", MIN_INTERVAL_S / 2, 1)   # no overlay is touched


def _ping_cpu_s(interval: float, seconds: int = 1) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(["ping", "-n", "-q", "-i", str(interval), "-w", str(seconds), "127.0.0.1"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=seconds + 10)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_ping_at_the_floor_sleeps_between_echoes():
    # What the floor stands on: this machine's ping, at MIN_INTERVAL_S, leaves the core alone
    # (below it, iputils' ping polls without sleeping: a whole core for the stream's length).
    require(shutil.which("ping") is not None, "ping (iputils-ping) is not installed")
    require(os.geteuid() == 0, "ping faster than every 0.2 s needs root")
    assert _ping_cpu_s(MIN_INTERVAL_S) < 0.25

