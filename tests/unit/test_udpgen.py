"""The traffic generator (dataplane/bench/udpgen.c) on the loopback (no root): it
builds once into the cache, sends what it is told, and the sink, echo and rr
modes agree with it. Bounded: small counts, short deadlines, 127.0.0.1 only."""
from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess

import pytest

from tests.conftest import require


@pytest.fixture(scope="module")
def udpgen():
    require(shutil.which("gcc") is not None, "needs gcc to build udpgen")
    from dataplane.bench import build
    return str(build.build_udpgen())


def _port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sink(udpgen, port, tag):
    p = subprocess.Popen([udpgen, "sink", "--bind", f"127.0.0.1:{port}", "--tag", str(tag),
                          "--deadline", "10", "--idle-ms", "50"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "READY"
    return p


def _finish(p) -> dict:
    p.send_signal(signal.SIGUSR1)
    out, _ = p.communicate(timeout=10)
    return json.loads(out.strip().splitlines()[-1])


def test_paced_send_is_counted_by_tag(udpgen):
    port = _port()
    sink = _sink(udpgen, port, 7)
    try:
        # A straggler of another trial (tag 8) must not be counted.
        subprocess.run([udpgen, "send", "--dst", f"127.0.0.1:{port}", "--size", "100",
                        "--rate", "10000", "--count", "50", "--duration", "2", "--tag", "8"],
                       check=True, capture_output=True, timeout=10)
        r = subprocess.run([udpgen, "send", "--dst", f"127.0.0.1:{port}", "--size", "100",
                            "--rate", "20000", "--count", "2000", "--duration", "5", "--tag", "7"],
                           check=True, capture_output=True, text=True, timeout=10)
        sent = json.loads(r.stdout)
        got = _finish(sink)
    finally:
        sink.kill()
    assert sent["sent"] == 2000
    # 2000 packets at 20 kpps take about 0.1 s: the pacing holds.
    assert 0.08 <= sent["elapsed_s"] <= 1.0
    assert got["received"] == 2000 and got["bytes"] == 200_000
    assert got["other"] == 50


def test_send_is_bounded_by_time(udpgen):
    port = _port()
    r = subprocess.run([udpgen, "send", "--dst", f"127.0.0.1:{port}", "--size", "64",
                        "--rate", "1000", "--count", "1000000", "--duration", "0.2"],
                       check=True, capture_output=True, text=True, timeout=10)
    sent = json.loads(r.stdout)
    assert sent["elapsed_s"] < 0.5 and sent["sent"] <= 250


def test_rr_against_echo(udpgen):
    port = _port()
    echo = subprocess.Popen([udpgen, "echo", "--bind", f"127.0.0.1:{port}", "--deadline", "10"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert echo.stdout.readline().strip() == "READY"
        r = subprocess.run([udpgen, "rr", "--dst", f"127.0.0.1:{port}", "--count", "200",
                            "--interval-us", "200", "--deadline", "5"],
                           check=True, capture_output=True, text=True, timeout=10)
        res = json.loads(r.stdout)
    finally:
        echo.kill()
        echo.wait(5)
    assert res["received"] == 200 and res["lost"] == 0
    assert (0 < res["min_us"] <= res["p50_us"] <= res["p90_us"] <= res["p99_us"]
            <= res["p999_us"] <= res["max_us"])
    # nearest rank: of 200 round trips, p99.9 is rank ceil(199.8) = 200, the slowest
    assert res["p999_us"] == res["max_us"]


def test_bad_arguments_are_refused(udpgen):
    r = subprocess.run([udpgen, "send", "--size", "64"], capture_output=True, timeout=5)
    assert r.returncode == 2
    r = subprocess.run([udpgen, "bogus"], capture_output=True, timeout=5)
    assert r.returncode == 2


def test_built_once_into_the_cache_under_a_key_of_source_and_flags(tmp_path, monkeypatch):
    require(shutil.which("gcc") is not None, "needs gcc to build udpgen")
    from dataplane.bench import build
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = build.build_udpgen()
    assert first.parent == tmp_path / "cache" / "flannel-udp" and first.stat().st_mode & 0o111
    stamp = first.stat().st_mtime_ns
    assert build.build_udpgen() == first and first.stat().st_mtime_ns == stamp  # not rebuilt
    assert [p.name for p in first.parent.iterdir()] == [first.name]          # no temp left
    cc = build._compiler()
    assert build.udpgen_path(cc) == first and build.udpgen_path("other-cc") != first
    monkeypatch.setattr(build, "CFLAGS", [*build.CFLAGS, "-g"])
    other_flags = build.udpgen_path(cc)
    edited = tmp_path / "udpgen.c"
    edited.write_bytes(build.SOURCE.read_bytes() + b"\n")
    monkeypatch.setattr(build, "SOURCE", edited)
    assert len({first, other_flags, build.udpgen_path(cc)}) == 3


def test_no_compiler_says_what_to_install(monkeypatch):
    from dataplane.bench import build
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(build.SetupError, match="apt-get install gcc"):
        build.build_udpgen()
