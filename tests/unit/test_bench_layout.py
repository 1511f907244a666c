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
