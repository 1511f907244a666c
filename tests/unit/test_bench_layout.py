"""Where the bench pins its processes (dataplane/bench/topo.py): each host's on its own core, or,
with --forwarders-together, both forwarders on host B's core (no root: a stand-in topology)."""
from __future__ import annotations

from types import SimpleNamespace

from dataplane.bench import runner
from dataplane.bench.topo import Side
from dataplane.cli import bench as cli_bench


def _sides(together: bool):
    topo = SimpleNamespace(forwarders_together=together)
    a = Side(topo, SimpleNamespace(index=0), 0)
    b = Side(topo, SimpleNamespace(index=1), 1)
    topo.a, topo.b = a, b
    return a, b


def test_each_forwarder_on_its_hosts_core_by_default():
    a, b = _sides(False)
    assert (a.forwarder_cpu, b.forwarder_cpu) == (0, 1)
    assert a.pinned(["udpgen"])[:3] == ["taskset", "-c", "0"]


def test_together_both_forwarders_on_host_bs_core_and_the_generator_stays():
    a, b = _sides(True)
    assert (a.forwarder_cpu, b.forwarder_cpu) == (1, 1)
    assert a.pinned(["flannel-udp"], a.forwarder_cpu)[:3] == ["taskset", "-c", "1"]
    assert a.pinned(["udpgen"])[:3] == ["taskset", "-c", "0"]     # host A's other processes
    assert "both forwarders: CPU1" in runner.PINNING_TOGETHER


def test_the_flag_parses():
    import argparse
    p = argparse.ArgumentParser()
    cli_bench.add_arguments(p)
    assert p.parse_args(["--forwarders-together"]).forwarders_together
    assert not p.parse_args([]).forwarders_together


def test_an_ipv6_paths_one_stream_runs_beside_ipv4_in_alternating_order(monkeypatch):
    """runner._idle_and_tcp: an inner-IPv6 path's one stream and one of inner IPv4 through
    the same forwarders run back to back, IPv4 first in odd trials and second in even ones
    (measure.tcp stood in for: the order and the bookkeeping are what is tested here; the
    IPv4 stream's route through the IPv6 path is test_bench_smoke's)."""
    calls = []

    def tcp(topo, tools, *, seconds, streams=1, reverse=False, family=4):
        calls.append((streams, reverse, family))
        return {"gbps": {4: 2.0, 6: 1.8}[family] if streams == 1 and not reverse else 5.0,
                "retransmits": 0}

    monkeypatch.setattr(runner.measure, "tcp", tcp)
    monkeypatch.setattr(runner.measure, "latency", lambda *a, **k: dict(
        p50_us=1, p90_us=1, p99_us=1, p999_us=1, max_us=1, received=1, lost=0))
    out, lines = {}, []
    profile = runner.QUICK
    for trial in (1, 2):
        runner._idle_and_tcp(None, None, profile, out, f"t{trial}", lines.append, family=6,
                             trial=trial)
    one = [c for c in calls if c[:2] == (1, False)]
    assert [c[2] for c in one] == [4, 6, 6, 4]
    assert all(c[2] == 6 for c in calls if c[:2] != (1, False))     # the other variants
    assert out[None]["tcp_gbps"] == [1.8, 1.8]
    assert out[None]["tcp_ipv4_same_gbps"] == [2.0, 2.0]
    assert out[None]["tcp_family_ratio"] == [0.9, 0.9]
    assert "IPv4 through the same forwarders 2.00 Gbit/s" in lines[0]
    calls.clear()
    runner._idle_and_tcp(None, None, profile, {}, "t", lines.append, family=4, trial=1)
    assert all(c[2] == 4 for c in calls) and len(calls) == len(runner.TCP_VARIANTS)


def test_an_ipv6_paths_floods_run_beside_ipv4_in_alternating_order(monkeypatch):
    """runner._flood: the same for an inner-IPv6 path's floods."""
    calls = []

    def trial(topo, tools, *, size, rate, duration, family=4):
        calls.append(family)
        rx = {4: 100e3, 6: 90e3}[family]
        return {"rx_pps": rx, "tx_pps": 2 * rx, "loss": 0.5, "machine_cpu_ns_per_packet": None,
                "received": 1, "sent": 2}

    def flood(topo, tools, path, *, size, duration, quiet_since, family=None):
        return dict(measure_trial()(topo, tools, size=size, rate=0, duration=duration,
                                    family=family or path.family),
                    cost={"cpu_ns_per_packet": 1000.0, "syscalls_per_packet": 1.05}, drops={})

    def measure_trial():
        return runner.measure.udp_trial

    monkeypatch.setattr(runner.measure, "udp_trial", trial)
    monkeypatch.setattr(runner.measure, "flood", flood)
    out, lines = {}, []
    for t in (1, 2):
        runner._flood(None, None, SimpleNamespace(family=6), runner.QUICK, out, 64, f"t{t}",
                      lines.append, trial=t)
    assert calls == [4, 6, 6, 4]
    assert out[64]["flood_family_ratio"] == [0.9, 0.9]
    assert out[64]["flood_ipv4_same_rx_pps"] == [100e3, 100e3]
    assert "IPv4 through the same forwarders: offered 200.0, received 100.0 kpps, 1000 ns CPU" \
        in lines[0]
    assert out[64]["ipv4_same_cpu_ns_per_packet"] == [1000.0, 1000.0]
    assert out[64]["ipv4_same_syscalls_per_packet"] == [1.05, 1.05]
    calls.clear()
    runner._flood(None, None, SimpleNamespace(family=4), runner.QUICK, {}, 64, "t",
                  lines.append, trial=1)
    assert calls == [4]
    # a flood that lost < 0.5 % measured its generator: no ratio of the forwarders
    monkeypatch.setattr(runner.measure, "udp_trial", lambda *a, family=4, **k: dict(
        trial(*a, family=family, **k), loss=0.001 if family == 4 else 0.5))
    runner._flood(None, None, SimpleNamespace(family=6), runner.QUICK, out, 64, "t3",
                  lines.append, trial=3)
    assert out[64]["flood_family_ratio"] == [0.9, 0.9, None]
    assert "no ratio" in lines[-1] and "no ratio" not in lines[0]
    assert "IPv6 / IPv4 0.90)" in lines[0]
    # an IPv6 flood that lost < 0.5 % beside an IPv4 one the forwarders limited: a lower bound
    monkeypatch.setattr(runner.measure, "udp_trial", lambda *a, family=4, **k: dict(
        trial(*a, family=family, **k), loss=0.001 if family == 6 else 0.5))
    runner._flood(None, None, SimpleNamespace(family=6), runner.QUICK, out, 64, "t4",
                  lines.append, trial=4)
    assert out[64]["flood_family_ratio"] == [0.9, 0.9, None, 0.9]
    assert out[64]["flood_family_ratio_lower_bound"] == [False, False, None, True]
    assert "IPv6 / IPv4 >= 0.90" in lines[-1]
