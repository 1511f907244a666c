"""The bench's `flanneld` path (issue 29) without flanneld: the real binary is not part of the
project and the suite never needs it. What is checked here: the path is chosen on request only,
a run without `--flanneld` skips it with the reason (and the other paths run), a `--flanneld`
that cannot be run is refused at start, and the command and cost it is measured with."""
from __future__ import annotations

import argparse
import os
import types

import pytest

from dataplane.bench import measure, report, runner
from dataplane.bench.daemon_paths import (FLANNELD_SKIP, flanneld_ready, flanneld_run,
                                          make_daemon_path, mixed_cleanup, mixed_ready,
                                          mixed_run)
from dataplane.bench.path_choice import make_path
from dataplane.bench.paths import ALL_PATHS, DAEMON_PATHS, PATHS, PathSkipped
from dataplane.bench.topo import TopoError, subnet
from dataplane.cli import bench as cli_bench


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    cli_bench.add_arguments(p)
    return p


def _executable(tmp_path, name="flanneld", mode=0o755) -> str:
    f = tmp_path / name
    f.write_text("#!/bin/sh\nexit 0\n")
    f.chmod(mode)
    return str(f)


class _Lines(runner.Progress):
    """The run's progress lines, kept."""

    def __init__(self):
        super().__init__(quiet=True)
        self.lines = []

    def __call__(self, msg: str) -> None:
        self.lines.append(msg)


def test_flanneld_is_a_path_on_request_only():
    p = _parser()
    assert "flanneld" in DAEMON_PATHS and "flanneld" in ALL_PATHS and "flanneld" not in PATHS
    args = p.parse_args(["--paths", "direct,c,flanneld"])
    assert args.flanneld is None
    assert "flanneld" not in p.parse_args([]).paths.split(",")
    # accepted without a binary: the run skips it rather than refusing the others
    assert cli_bench.choose_paths(args.paths, None) == ["direct", "c", "flanneld"]
    assert "--flanneld" in p.format_help()
    with pytest.raises(ValueError, match="unknown path.*flanneldd"):
        cli_bench.choose_paths("direct,flanneldd", None)


def test_without_a_binary_the_path_is_skipped_with_the_reason():
    with pytest.raises(PathSkipped) as e:
        make_path(object(), "flanneld")           # raised before the topology is touched
    assert str(e.value) == FLANNELD_SKIP and "--flanneld" in str(e.value)


def test_a_run_without_a_binary_skips_flanneld_and_runs_the_others(monkeypatch, capsys):
    class Topo:
        def __init__(self, ipv6=False, forwarders_together=False):
            self.ipv6 = ipv6

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    ran = []

    def run_path(topo, tools, name, profile, trials, batch, routes, progress, flanneld=None):
        if name == "flanneld":
            make_path(topo, name, flanneld=flanneld)      # the real choice: PathSkipped
            raise AssertionError("flanneld ran without a binary")
        ran.append(name)
        return {64: {"ndr_pps": [100e3]}, 1400: {"ndr_pps": [50e3]},
                None: {"tcp_gbps": [1.0]}}

    monkeypatch.setattr(runner.build, "setup", lambda: {"udpgen": "udpgen", "iperf3": "iperf3"})
    monkeypatch.setattr(runner, "BenchTopo", Topo)
    common = []

    def run_common(topo, tools, name, profile, trials, batch, routes, progress, flanneld, rates):
        common.append((name, rates))
        return {size: {"common_load_pps": [rate], "common_rtt_p99_us": [40.0]}
                for size, rate in rates.items()}

    monkeypatch.setattr(runner, "_run_path", run_path)
    monkeypatch.setattr(runner, "_run_common", run_common)
    progress = _Lines()
    res = runner.run(paths=["direct", "flanneld", "c"], profile=runner.QUICK, progress=progress)
    lines = progress.lines
    assert ran == ["direct", "c"]
    # the second pass: the paths that ran, at the lowest NDR of each size
    assert common == [("direct", {64: 100e3, 1400: 50e3}), ("c", {64: 100e3, 1400: 50e3})]
    assert any(ln.startswith("common load: every path again") for ln in lines)
    c64 = next(r for r in res["rows"] if r["path"] == "c" and r["size"] == 64)
    assert c64["common_load_pps"] == 100e3 and c64["common_rtt_p99_us"] == 40.0
    assert "errors" not in res["machine"]               # a skip is no failure: exit status 0
    assert res["machine"]["skipped"] == {"flanneld": FLANNELD_SKIP}
    assert f"flanneld: skipped: {FLANNELD_SKIP}" in lines
    rows = [r for r in res["rows"] if r["path"] == "flanneld"]
    assert len(rows) == 3 and all(r["skipped"] == FLANNELD_SKIP for r in rows)
    assert all(r[k] is None for r in rows for k in report.METRICS)
    assert all("skipped" not in r for r in res["rows"] if r["path"] != "flanneld")
    assert "flanneld" not in res["ratios"] and "c" in res["ratios"]
    report.print_table(res)
    out = capsys.readouterr().out
    assert f"flanneld: skipped: {FLANNELD_SKIP}" in out
    assert any(ln.startswith("flanneld") and "skipped" in ln for ln in out.splitlines())


def test_a_flanneld_that_cannot_run_is_refused_at_start(tmp_path):
    plain = _executable(tmp_path, "plain", mode=0o644)
    for bad, why in ((plain, "not executable"), (str(tmp_path / "none"), "no such file"),
                     (str(tmp_path), "not a file")):
        with pytest.raises(ValueError, match=f"--flanneld .*{why}"):
            cli_bench.choose_paths("direct,flanneld", bad)
        with pytest.raises(TopoError, match=why):
            make_daemon_path(object(), "flanneld", flanneld=bad)
    good = _executable(tmp_path)
    assert cli_bench.choose_paths("flanneld", good) == ["flanneld"]


def test_flanneld_runs_with_its_own_flags_and_is_ready_once_it_has_the_peer():
    a = types.SimpleNamespace(name="h0", iface="veth0", subnet=subnet(0))
    b = types.SimpleNamespace(name="h1", iface="veth1", subnet=subnet(1))
    topo = types.SimpleNamespace(peer=lambda s: b if s is a else a)
    path = types.SimpleNamespace(etcd_url="http://192.168.77.254:2379",
                                 prefix="/coreos.com/network", topo=topo,
                                 subnet_file=lambda s: f"/tmp/x/{s.name}/subnet.env")
    argv = flanneld_run("/opt/flanneld")(path, a)
    assert argv == ["/opt/flanneld", "-etcd-endpoints=http://192.168.77.254:2379",
                    "-etcd-prefix=/coreos.com/network", "-iface=veth0",
                    "-subnet-file=/tmp/x/h0/subnet.env"]
    assert "Subnet added: 10.5.2.0/24" in flanneld_ready(path, a)
    assert "Subnet added: 10.5.1.0/24" in flanneld_ready(path, b)


def test_the_mixed_path_runs_the_kernel_path_beside_flanneld(tmp_path):
    """`kernel-flanneld`: host A the daemon on the kernel path (pinned in the testbed's own
    bpffs, removed by its cleanup), host B flanneld; skipped or refused as `flanneld` is."""
    with pytest.raises(PathSkipped):
        make_daemon_path(object(), "kernel-flanneld")
    with pytest.raises(TopoError, match="no such file"):
        make_daemon_path(object(), "kernel-flanneld", flanneld=str(tmp_path / "none"))
    assert cli_bench.choose_paths("vxlan,kernel-flanneld", _executable(tmp_path)) == [
        "vxlan", "kernel-flanneld"]
    a = types.SimpleNamespace(name="h0", iface="veth0", subnet=subnet(0), host=0)
    b = types.SimpleNamespace(name="h1", iface="veth1", subnet=subnet(1), host=1)
    tb = types.SimpleNamespace(bpf_pins=lambda h: f"/tmp/tb/bpffs/h{h}")
    topo = types.SimpleNamespace(a=a, b=b, tb=tb, peer=lambda s: b if s is a else a)
    path = types.SimpleNamespace(etcd_url="http://192.168.77.254:2379",
                                 prefix="/coreos.com/network", topo=topo,
                                 subnet_file=lambda s: f"/tmp/x/{s.name}/subnet.env",
                                 sockets=lambda s: (f"/tmp/x/{s.name}/st", f"/tmp/x/{s.name}/ho"))
    run_a, run_b = mixed_run("/opt/flanneld")(path, a), mixed_run("/opt/flanneld")(path, b)
    assert run_a[run_a.index("--engine") + 1] == "kernel"
    assert "--bpf-pins=/tmp/tb/bpffs/h0" in run_a and "--iface" in run_a
    assert run_b == flanneld_run("/opt/flanneld")(path, b)
    assert mixed_ready(path, a) == ("Running:",)
    assert mixed_ready(path, b) == flanneld_ready(path, b)
    clean_a, clean_b = mixed_cleanup(path, a), mixed_cleanup(path, b)
    assert "cleanup" in clean_a and "--kernel-path" in clean_a
    assert "--bpf-pins=/tmp/tb/bpffs/h0" in clean_a
    assert "cleanup" in clean_b and "--kernel-path" not in clean_b


def test_cost_of_a_forwarder_without_syscall_counters():
    """flanneld's CPU per packet is measured as the engines' (its PIDs, flannel0's counts);
    it counts no syscalls, so those stay None instead of failing the cost."""
    counts = iter([{"h0": {"udp_tx_packets": 0, "tun_tx_packets": 0},
                    "h1": {"udp_tx_packets": 0, "tun_tx_packets": 0}},
                   {"h0": {"udp_tx_packets": 1000, "tun_tx_packets": 0},
                    "h1": {"udp_tx_packets": 0, "tun_tx_packets": 800}}])
    topo = types.SimpleNamespace(a=types.SimpleNamespace(name="h0"),
                                 b=types.SimpleNamespace(name="h1"))
    path = types.SimpleNamespace(kernel=False, topo=topo, counters=lambda after=None: next(counts),
                                 forwarder_pids=lambda: {"h0": os.getpid(), "h1": os.getpid()})
    cost = measure.CostWindow(path)
    cost.start(0.0)
    sum(i * i for i in range(300_000))                  # some CPU time of this process
    out = cost.stop()
    assert out["send_packets"] == 1000 and out["recv_packets"] == 800
    assert out["syscalls_per_packet"] is None and out["send_syscalls_per_packet"] is None
    assert out["cpu_ns_per_packet"] is not None and out["cpu_ns_per_packet"] >= 0
