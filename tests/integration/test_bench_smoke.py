"""Smoke test of `flannel-udp bench --quick --json`: the JSON's shape, and that
every path (direct, kernel VXLAN, C engine, Python engine) moved traffic.

Speed is not checked: this machine is shared and the figures drift; the
full run and its numbers live in perf/README.md.

`c-direct` (issue 30: two `flannel-udp run` daemons over an etcd, DirectRouting
on) is not a default path; its case drives the path itself: setup, a short UDP
trial and round trips, teardown - the daemons routed around flannel0, and the
hosts are left as they were found.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import require, require_bpf, require_engine, require_etcd, require_root

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PCT = ("p50", "p90", "p99", "p999", "max")
ROW_KEYS = {"path", "size", "ndr_pps", "pdr_pps", "flood_rx_pps", "flood_loss", "tcp_gbps",
            "tcp4_gbps", "tcp_rev_gbps", *(f"rtt_{p}_us" for p in PCT), "rtt_samples",
            "common_load_pps", *(f"common_rtt_{p}_us" for p in PCT),
            "machine_cpu_ns_per_packet", "cpu_ns_per_packet", "syscalls_per_packet"}
PATHS = ("direct", "vxlan", "c", "python")
RATIO_FIGURES = {"ndr_pps_64", "ndr_pps_1400", "pdr_pps_64", "pdr_pps_1400", "flood_rx_pps_64",
                 "flood_rx_pps_1400", "tcp_gbps", "tcp4_gbps", "tcp_rev_gbps", "machine_cpu_64",
                 "rtt_p99_64", "common_rtt_p99_64"}

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def bench_json():
    require_root()
    require_engine("c")
    require(shutil.which("gcc") is not None, "needs gcc (the bench compiles its traffic generator)")
    require(shutil.which("iperf3") is not None, "needs iperf3 (apt-get install iperf3)")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "dataplane", "bench", "--quick", "--json"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
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
            assert r["ndr_pps"] is None and r["pdr_pps"] is None and r["flood_rx_pps"] is None
            assert r["common_load_pps"] is None
        else:
            assert r["tcp_gbps"] is None and r["tcp4_gbps"] is None
        if r["path"] in ("direct", "vxlan"):   # no forwarding process to account
            assert r["cpu_ns_per_packet"] is None and r["syscalls_per_packet"] is None
    ratios = data["ratios"]
    for engine in ("c", "python"):
        for ref in ("vxlan", "direct"):
            assert set(ratios[engine][ref]) == RATIO_FIGURES | {"ci95"}
            # one trial (--quick): no interval
            assert all(v is None for v in ratios[engine][ref]["ci95"].values())
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
            assert r["pdr_pps"] > 0, (p, size, r)
            assert 0 <= r["ndr_pps"] <= r["pdr_pps"], (p, size, r)
            assert 0 <= r["flood_loss"] <= 1, (p, size, r)
            rtt = [r[f"rtt_{q}_us"] for q in PCT]
            assert rtt[0] > 0 and rtt == sorted(rtt) and r["rtt_samples"] > 0, (p, size, r)
            # common load: one offered rate for every path, the lowest NDR of the run
            assert r["common_load_pps"] is None or r["common_load_pps"] > 0, (p, size, r)
            # every path, the kernel's too, costs the machine some CPU per packet
            assert r["machine_cpu_ns_per_packet"] > 0, (p, size, r)
            if p in ("c", "python"):
                assert r["syscalls_per_packet"] > 0, (p, size, r)
                assert r["cpu_ns_per_packet"] is not None and r["cpu_ns_per_packet"] >= 0
        idle = by[(p, None)]
        assert idle["tcp_gbps"] > 0 and idle["tcp4_gbps"] > 0 and idle["tcp_rev_gbps"] > 0, idle
        assert idle["rtt_p50_us"] > 0 and idle["rtt_samples"] > 0, (p, idle)
    for engine in ("c", "python"):
        assert data["ratios"][engine]["vxlan"]["pdr_pps_64"] > 0
    common = data["machine"].get("common_load_pps") or {}
    for size, rate in common.items():
        ndr = min(by[(p, int(size))]["ndr_pps"] for p in PATHS)
        assert rate == pytest.approx(ndr, abs=0.1), (size, common)
        assert all(by[(p, int(size))]["common_rtt_p50_us"] > 0 for p in PATHS)


def _host_state(side) -> dict:
    """What a path must leave as it found it on a bench host: links, routes, firewall rules."""
    links = side.run(["ip", "-o", "link", "show"]).stdout
    return {"links": sorted(ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines()),
            "routes": side.run(["ip", "route", "show"]).stdout,
            "filter": side.run(["iptables", "-S"], check=False).stdout,
            "nat": side.run(["iptables", "-t", "nat", "-S"], check=False).stdout}


def _tun_packets(side) -> tuple[int, int]:
    """flannel0's rx and tx packet counters on a host (the kernel's, whoever holds the TUN)."""
    r = side.run(["cat", "/sys/class/net/flannel0/statistics/rx_packets",
                  "/sys/class/net/flannel0/statistics/tx_packets"])
    rx, tx = r.stdout.split()
    return int(rx), int(tx)


@pytest.mark.etcd
@pytest.mark.timeout(60)
def test_c_direct_routes_around_flannel0():
    """`bench --paths c-direct` (issue 30) in little: both daemons up over etcd with the leases
    put beforehand, each host's kernel route to the peer's /24 via its PublicIP (proto 153, the
    daemon's), traffic both ways with flannel0's counters still, and a teardown that stops the
    daemons and etcd and leaves the hosts' links, routes and firewall as they were."""
    require_root()
    require_etcd()
    require_engine("c")
    require(shutil.which("gcc") is not None, "needs gcc (the bench compiles its traffic generator)")
    from dataplane.bench import build, measure
    from dataplane.bench.path_choice import make_path
    from dataplane.bench.topo import BenchTopo

    tools = measure.Tools(udpgen=str(build.build_udpgen()), iperf3="")
    with BenchTopo() as topo:
        before = {s.name: _host_state(s) for s in topo.sides}
        path = make_path(topo, "c-direct")
        path.setup()
        try:
            procs, etcd = dict(path.procs), path.etcd
            assert set(path.daemon_pids()) == {"h0", "h1"}, path.daemon_pids()
            for side in topo.sides:
                peer = topo.peer(side)
                route = path.direct_route(side)
                assert route is not None and "proto 153" in route, (side.name, route)
                # `nhid I` after the subnet where the kernel has nexthop objects (host/nexthops.py)
                assert re.match(rf"{re.escape(str(peer.subnet))} (nhid \d+ )?via {peer.ip} dev "
                                rf"{side.iface}", route), route
            tun0 = {s.name: _tun_packets(s) for s in topo.sides}
            udp = measure.udp_trial(topo, tools, size=64, rate=20000, duration=0.3)
            rr = measure.latency(topo, tools, count=100, interval_us=500)   # B answers A
            tun1 = {s.name: _tun_packets(s) for s in topo.sides}
            assert udp["received"] > 0.9 * udp["sent"] > 0, udp
            assert rr["lost"] < 10 and rr["p50_us"] > 0, rr
            assert tun1 == tun0, f"packets went through flannel0: {tun0} -> {tun1}"
            assert set(path.daemon_pids()) == {"h0", "h1"}, "a daemon exited under traffic"
        finally:
            path.teardown()
        assert all(p.poll() is not None for p in procs.values()), procs
        assert etcd.proc.poll() is not None and path.etcd is None
        after = {s.name: _host_state(s) for s in topo.sides}
        assert after == before


@pytest.mark.timeout(60)
def test_inner_ipv6_paths_carry_ipv6_through_their_devices():
    """`bench --paths c6,vxlan6` in little (issue 37): each path's device carries the UDP trial
    and the round trips between the hosts' IPv6 addresses (its counters move by as much), then
    an IPv4 trial between their IPv4 ones, and the teardown leaves the hosts' links and routes, IPv6 ones included, as they were."""
    require_root()
    require_engine("c")
    require(shutil.which("gcc") is not None, "needs gcc (the bench compiles its traffic generator)")
    from dataplane.bench import build, measure
    from dataplane.bench.path_choice import make_path
    from dataplane.bench.topo import BenchTopo

    tools = measure.Tools(udpgen=str(build.build_udpgen()), iperf3="")
    with BenchTopo(ipv6=True) as topo:
        def state(side):
            return dict(_host_state(side), routes6=side.run(["ip", "-6", "route", "show"]).stdout)
        before = {s.name: state(s) for s in topo.sides}
        for name, dev in (("c6", "flannel0"), ("vxlan6", "flannel.1")):
            path = make_path(topo, name)
            assert path.family == 6
            path.setup()
            try:
                stats = f"/sys/class/net/{dev}/statistics/tx_packets"
                tx0 = int(topo.a.run(["cat", stats]).stdout)
                udp = measure.udp_trial(topo, tools, size=64, rate=20000, duration=0.3, family=6)
                rr = measure.latency(topo, tools, count=100, interval_us=500, family=6)
                tx1 = int(topo.a.run(["cat", stats]).stdout)
                # the same device carries inner IPv4 too: the bench's IPv4 stream beside the
                # IPv6 one (runner._tcp_beside_ipv4) goes through the same forwarders
                udp4 = measure.udp_trial(topo, tools, size=64, rate=20000, duration=0.2, family=4)
                tx2 = int(topo.a.run(["cat", stats]).stdout)
            finally:
                path.teardown()
            assert udp["received"] > 0.9 * udp["sent"] > 0, (name, udp)
            assert rr["lost"] < 10 and rr["p50_us"] > 0, (name, rr)
            assert tx1 - tx0 >= udp["received"] + rr["received"], (name, tx0, tx1)
            assert udp4["received"] > 0.9 * udp4["sent"] > 0, (name, udp4)
            assert tx2 - tx1 >= udp4["received"], (name, tx1, tx2)
        assert {s.name: state(s) for s in topo.sides} == before


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid``, read from /proc (children before their parent exits)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, pp in parent.items() if pp == p}
        out |= kids
        todo.extend(kids)
    return out


def _netns_of(pid: int) -> list[str]:
    from dataplane.testbed import netns
    return [n for n in netns.list_netns() if netns.owner_pid(n) == pid]


def test_sigterm_removes_what_the_bench_started():
    """`kill` (or a service manager's stop) mid-run: the bench exits 130 and leaves no namespace
    and no process of its own behind, as Ctrl-C does."""
    require_root()
    require(shutil.which("gcc") is not None, "needs gcc (the bench compiles its traffic generator)")
    require(shutil.which("iperf3") is not None, "needs iperf3 (apt-get install iperf3)")
    import select
    import signal
    import time

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "dataplane", "bench", "--quick", "--json",
                          "--paths", "vxlan"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        # Mid-trial: the latency probe or the TCP stream runs once the path carries traffic.
        deadline = time.monotonic() + 60
        seen = ""
        while "trial 1/1" not in seen and "idle rtt" not in seen:
            assert time.monotonic() < deadline and p.poll() is None, seen[-2000:]
            if select.select([p.stderr], [], [], 1.0)[0]:
                seen += p.stderr.readline()
        kids = _descendants(p.pid)
        assert _netns_of(p.pid), "the bench's namespaces should exist while it runs"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert _netns_of(p.pid) == []
    alive = [k for k in kids if os.path.exists(f"/proc/{k}") and _zombie_free(k)]
    assert alive == [], f"processes left behind: {alive}"


def _zombie_free(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(90)
def test_kernel_paths_carry_traffic_in_the_kernel():
    """`bench --paths kernel,kernel6` in little (issue 46): the C engine's `forward` on each
    host with the tc programs of csrc/bpf/ on its flannel0 and veth. A UDP trial and round
    trips of each family cross, the programs' counters (in the path's counters as bpf_*)
    carry them and the engines none; a TCP stream crosses; the teardown leaves no filter,
    link or route behind. Where the programs cannot load the path says so (PathSkipped)."""
    require_root()
    require_engine("c")
    require_bpf()
    require(shutil.which("gcc") is not None, "needs gcc (the bench compiles its traffic generator)")
    require(shutil.which("iperf3") is not None, "needs iperf3 (apt-get install iperf3)")
    from dataplane.bench import build, measure
    from dataplane.bench.path_choice import make_path
    from dataplane.bench.topo import BenchTopo

    tools = measure.Tools(udpgen=str(build.build_udpgen()), iperf3=shutil.which("iperf3"))
    with BenchTopo(ipv6=True) as topo:
        def state(side):
            return dict(_host_state(side),
                        tc=side.run(["tc", "filter", "show", "dev", side.iface, "ingress"]).stdout,
                        offloads=side.run(["ethtool", "-k", side.iface]).stdout)
        before = {s.name: state(s) for s in topo.sides}
        for name in ("kernel", "kernel6"):
            path = make_path(topo, name)
            path.setup()
            try:
                a, b = topo.a.name, topo.b.name
                c0 = path.counters(after=None)
                udp = measure.udp_trial(topo, tools, size=64, rate=20000, duration=0.3,
                                        family=path.family)
                rr = measure.latency(topo, tools, count=100, interval_us=500, family=path.family)
                tcp = [measure.tcp(topo, tools, seconds=1, reverse=r, family=path.family)
                       for r in (False, True)]
                c1 = path.counters(after=time.time())
            finally:
                path.teardown()
            moved = {h: {k: c1[h].get(k, 0) - c0[h].get(k, 0) for k in c1[h]} for h in (a, b)}
            assert udp["received"] > 0.9 * udp["sent"] > 0, (name, udp)
            assert rr["lost"] < 10 and rr["p50_us"] > 0, (name, rr)
            assert all(t["gbps"] > 0 for t in tcp), (name, tcp)
            # A's egress program sent the trial, B's ingress program took it in
            assert moved[a]["bpf_udp_tx_packets"] >= udp["received"] + rr["received"], moved
            assert moved[b]["bpf_tun_tx_packets"] >= udp["received"] + rr["received"], moved
            # the engines carried none of it (the stats file, written after the trials)
            for h in (a, b):
                assert moved[h]["udp_tx_packets"] == 0 and moved[h]["tun_tx_packets"] == 0, moved
        assert {s.name: state(s) for s in topo.sides} == before


@pytest.mark.timeout(60)
def test_kernel_path_is_skipped_with_the_reason_where_it_cannot_load(monkeypatch, tmp_path):
    """No clang to build the programs (BPF_CLANG names none, an empty cache): the `kernel`
    path says PathSkipped with what to install, and leaves the hosts as it found them (its
    engines stopped), so the bench goes on with the other paths."""
    require_root()
    require_engine("c")
    from dataplane.bench.path_choice import make_path
    from dataplane.bench.paths import PathSkipped
    from dataplane.bench.topo import BenchTopo

    monkeypatch.setenv("BPF_CLANG", str(tmp_path / "no-clang"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with BenchTopo() as topo:
        before = {s.name: _host_state(s) for s in topo.sides}
        path = make_path(topo, "kernel")
        with pytest.raises(PathSkipped, match="apt-get install clang"):
            path.setup()
        assert path.forwarder_pids() == {}
        assert {s.name: _host_state(s) for s in topo.sides} == before
