"""Smoke test of `flannel-udp bench --quick --json`: the JSON's shape, and that
every path (direct, kernel VXLAN, C engine, Python engine) moved traffic.

Speed is not checked: this machine is shared and the figures drift; the
full run and its numbers live in perf/README.md.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import require, require_engine, require_root

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROW_KEYS = {"path", "size", "ndr_pps", "flood_rx_pps", "flood_loss", "tcp_gbps",
            "rtt_p50_us", "rtt_p99_us", "machine_cpu_ns_per_packet", "cpu_ns_per_packet",
            "syscalls_per_packet"}
PATHS = ("direct", "vxlan", "c", "python")
RATIO_FIGURES = {"ndr_pps_64", "ndr_pps_1400", "flood_rx_pps_64", "flood_rx_pps_1400",
                 "tcp_gbps", "machine_cpu_64"}

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def bench_json():
    require_root()
    require_engine("c")
    require(shutil.which("gcc") is not None, "needs gcc (the bench compiles its traffic generator)")
    require(shutil.which("iperf3") is not None, "needs iperf3 (apt-get install iperf3)")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "dataplane", "bench", "--quick", "--json"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=85)
    assert r.returncode == 0, f"bench failed ({r.returncode}):\n{r.stderr[-3000:]}"
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, f"stdout is not one JSON object:\n{r.stdout[:2000]}"
    return json.loads(lines[0]), r.stderr


def test_shape(bench_json):
    data, _ = bench_json
    assert set(data) == {"rows", "ratios", "machine"}
    rows = data["rows"]
    assert all(set(r) == ROW_KEYS for r in rows), rows
    assert {(r["path"], r["size"]) for r in rows} == {
        (p, s) for p in PATHS for s in (64, 1400, None)}
    for r in rows:
        for k in ROW_KEYS - {"path", "size"}:
            assert r[k] is None or isinstance(r[k], (int, float)), (r, k)
        if r["size"] is None:     # the TCP + idle latency row
            assert r["ndr_pps"] is None and r["flood_rx_pps"] is None
        else:
            assert r["tcp_gbps"] is None
        if r["path"] in ("direct", "vxlan"):   # no forwarding process to account
            assert r["cpu_ns_per_packet"] is None and r["syscalls_per_packet"] is None
    ratios = data["ratios"]
    for engine in ("c", "python"):
        for ref in ("vxlan", "direct"):
            assert set(ratios[engine][ref]) == RATIO_FIGURES
    m = data["machine"]
    assert m["mode"] == "quick" and m["trials"] == 1 and "errors" not in m
    for k in ("date_utc", "command", "cpus", "kernel", "pinning"):
        assert k in m


def test_every_path_moved_traffic(bench_json):
    data, stderr = bench_json
    by = {(r["path"], r["size"]): r for r in data["rows"]}
    for p in PATHS:
        for size in (64, 1400):
            r = by[(p, size)]
            assert r["flood_rx_pps"] > 0, (p, size, r)
            assert r["ndr_pps"] > 0, (p, size, r)
            assert 0 <= r["flood_loss"] <= 1, (p, size, r)
            assert r["rtt_p50_us"] > 0 and r["rtt_p99_us"] >= r["rtt_p50_us"], (p, size, r)
            # every path, the kernel's too, costs the machine some CPU per packet
            assert r["machine_cpu_ns_per_packet"] > 0, (p, size, r)
            if p in ("c", "python"):
                assert r["syscalls_per_packet"] > 0, (p, size, r)
                assert r["cpu_ns_per_packet"] is not None and r["cpu_ns_per_packet"] >= 0
        idle = by[(p, None)]
        assert idle["tcp_gbps"] > 0, (p, idle)
        assert idle["rtt_p50_us"] > 0, (p, idle)
    for engine in ("c", "python"):
        assert data["ratios"][engine]["vxlan"]["ndr_pps_64"] > 0
