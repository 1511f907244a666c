"""--queues and --offload (run and forward), the queue count rules, and the offload
decision on real sockets (no root: the TUN side is in tests/integration/test_multiqueue.py)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from dataplane.cli import flanneld_flags
from dataplane.host import queues
from dataplane.cli import build_parser
from dataplane.engine.api import OFF_TUN_GRO, OFF_TUN_VNET, OFF_UDP_GRO, OFF_UDP_GSO
from dataplane.host.offload import NAMES, SOL_UDP, UDP_GRO, Offloads


def resolve(argv, env=None):
    return flanneld_flags.resolve(build_parser().parse_args(["run", *argv]), env or {})


def forward(*argv):
    return build_parser().parse_args(["forward", "--tun-addr", "10.5.1.0/32", "--listen",
                                      "192.168.77.1:8285", *argv])


def _cli(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "dataplane", *argv], capture_output=True,
                          text=True, timeout=60, env=env)


# -- flags --------------------------------------------------------------------------------

def test_defaults():
    o = resolve([])
    assert o.queues == queues.default_queues() and o.sources["queues"] == "default"
    assert o.offload == "auto"
    a = forward()
    assert a.queues is None and a.offload is None     # main(): default_queues(), "auto"


@pytest.mark.parametrize("argv", [["--queues", "3", "--offload", "auto"],
                                  ["-queues=3", "-offload=auto"],
                                  ["--queues=3", "-offload", "AUTO"]])
def test_run_spellings(argv):
    o = resolve(argv)
    assert (o.queues, o.offload) == (3, "auto")


def test_run_env_and_flag_precedence():
    env = {"FLANNELD_QUEUES": "2", "FLANNELD_OFFLOAD": "auto"}
    o = resolve([], env)
    assert (o.queues, o.offload) == (2, "auto") and o.sources["queues"] == "env"
    assert resolve(["--queues=1", "--offload=off"], env).queues == 1


def test_run_env_out_of_range_names_the_variable():
    with pytest.raises(flanneld_flags.FlagError, match="FLANNELD_QUEUES"):
        resolve([], {"FLANNELD_QUEUES": "0"})


@pytest.mark.parametrize("env,name", [({"FLANNELD_QUEUES": "many"}, "FLANNELD_QUEUES"),
                                      ({"FLANNELD_OFFLOAD": "on"}, "FLANNELD_OFFLOAD")])
def test_run_unparsable_env_ignored_naming_the_variable(env, name):
    # as flanneld: logged (a warning naming the variable) and the default used
    o = resolve([], env)
    assert any(w.startswith(f"ignored {name}=") for w in o.warnings), o.warnings
    assert (o.sources["queues"], o.sources["offload"]) == ("default", "default")


@pytest.mark.parametrize("argv,name", [(["run", "--queues=0"], "--queues"),
                                       (["run", "--queues=257"], "--queues"),
                                       (["run", "-queues=x"], "--queues"),
                                       (["run", "--offload=on"], "--offload"),
                                       (["forward", "--tun-addr", "10.5.1.0", "--listen",
                                         "127.0.0.1", "--queues", "0"], "--queues"),
                                       (["forward", "--tun-addr", "10.5.1.0", "--listen",
                                         "127.0.0.1", "--offload", "yes"], "--offload")])
def test_cli_bad_values_exit_nonzero_naming_the_flag(argv, name):
    r = _cli(*argv)
    assert r.returncode != 0
    assert name in r.stderr, r.stderr


def test_help_lists_the_flags():
    out = _cli("run", "--help").stdout
    for text in ("--queues", "--offload", "FLANNELD_QUEUES", "FLANNELD_OFFLOAD"):
        assert text in out, text
    out = _cli("forward", "--help").stdout
    assert "--queues" in out and "--offload" in out


def test_forward_flags():
    a = forward("--queues", "4", "--offload", "auto")
    assert (a.queues, a.offload) == (4, "auto")


# -- queue count ------------------------------------------------------------------------------

def test_default_is_cpus_capped_at_8(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert queues.default_queues() == 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert queues.default_queues() == 1


def test_trace_runs_one_queue():
    n, why = queues.effective(4, trace=True)
    assert n == 1 and "--trace" in why
    assert queues.effective(4, trace=False) == (4, "")
    assert queues.effective(1, trace=True) == (1, "")


# -- offload decision ---------------------------------------------------------------------------

@pytest.fixture
def socks():
    made = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    yield made
    for s in made:
        s.close()


def _gro(s):
    return s.getsockopt(SOL_UDP, UDP_GRO)


def test_off_and_python_touch_nothing(socks):
    for off in (Offloads("off", "c"), Offloads("auto", "python")):
        assert not off.wanted
        assert off.probe([], socks) == 0 and off.flags == 0
        assert off.enabled() == dict.fromkeys(NAMES, False)
        assert [_gro(s) for s in socks] == [0, 0]
    assert "--offload off" in Offloads("off", "c").summary()
    assert "python engine has no offloads" in Offloads("auto", "python").summary()
    with pytest.raises(ValueError):
        Offloads("on", "c")


def test_udp_probe_on_this_kernel(socks):
    off = Offloads("auto", "c")
    flags_ = off.probe([], socks)             # no TUN opened: the UDP side alone
    # UDP_SEGMENT is Linux >= 4.18, UDP_GRO >= 5.0: any kernel that runs this suite
    assert flags_ == OFF_UDP_GSO | OFF_UDP_GRO, off.summary()
    assert [_gro(s) for s in socks] == [1, 1]
    assert off.enabled()["udp_gro"] and off.enabled()["udp_gso"] and not off.enabled()["tun_vnet"]
    assert "on: udp_gso, udp_gro" in off.summary()


def test_tun_refusing_everything_keeps_plain_vnet(socks):
    """TUNSETOFFLOAD failing (here: the fd is no TUN, ioctl fails for real) leaves
    the vnet header alone on: valid for the engine, no TUN GRO."""
    off = Offloads("auto", "c")
    off.vnet = True                           # as if opened with IFF_VNET_HDR
    flags_ = off.probe([socks[0].fileno()], socks[1:])
    assert flags_ & OFF_TUN_VNET and not flags_ & OFF_TUN_GRO
    assert "tun_tso" in off.refused and "zero vnet headers" in off.refused["tun_tso"]
    assert "refused: tun_tso" in off.summary()


# -- /metrics ------------------------------------------------------------------------------------

def test_metrics_queues_offloads_and_their_counters():
    from prometheus_client import generate_latest

    from dataplane.engine.api import OFFLOAD_STATS, STAT_NAMES
    from dataplane.daemon.metrics import MetricsSource, make_registry

    class Source(MetricsSource):
        def engine_stats(self):
            return {n: 7 for n in STAT_NAMES}

        def queues_count(self):
            return 2

        def offloads_enabled(self):
            return dict(dict.fromkeys(NAMES, False), tun_tso=True)

    body = generate_latest(make_registry(Source())).decode()
    assert "flannel_udp_queues 2.0" in body
    assert 'flannel_udp_offload_enabled{offload="tun_tso"} 1.0' in body
    assert 'flannel_udp_offload_enabled{offload="udp_gro"} 0.0' in body
    for op in OFFLOAD_STATS:
        assert f'flannel_udp_offload_ops_total{{op="{op}",queue="0"}} 7.0' in body
    # a source that has not decided yet exports neither family
    body = generate_latest(make_registry(MetricsSource())).decode()
    assert "flannel_udp_queues" not in body and "offload_enabled" not in body
