"""`flannel-udp demo` end to end (root, real etcd): the story's numbers are the system's.

Runs ``flannel-udp demo --json`` once per engine (a real two-host
overlay: etcd, two daemons with --trace, their leases) and checks that every
step is there and that what it reports holds together and matches the running
system: the TUN_READ length is the probe's real size, the peer is the other
host's underlay address and its lease's PublicIP, the outer datagram is the
inner + 28 (also as tapped on the wire), the counters are the daemons'
/metrics deltas and agree with the trace events. Also: Ctrl-C tears everything
down, and the renderer and the SVG take a real run's data. ``demo --direct-routing`` runs once
(C engine: no engine is on that path): the packets go host to host on the kernel route.
``demo --engine kernel`` runs once: the ping carried by the tc programs, whose counters moved,
while the engines' did not.

(Over 450 lines as one piece: the tests read the same few demo runs, made once per module by
its fixtures, and split across files they would make those runs again.)
"""
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time
import types
import xml.etree.ElementTree as ET
from ipaddress import ip_network

import pytest

from dataplane.control.lease import subnet_key_name
from dataplane.host.child import cli_argv
from tests.conftest import (ENGINES, require_bpf, require_engine, require_etcd, require_root,
                            wait_until)

pytestmark = [pytest.mark.root, pytest.mark.etcd]

STEPS = ["overlay", "workloads", "app_send", "kernel_route", "tun_read", "lookup", "udp_send",
         "udp_recv", "tun_write", "deliver", "reply", "udp_packet", "ping_cost", "batching",
         "summary"]
KINDS = ("polls", "tun_reads", "tun_writes", "udp_sends", "udp_recvs")


def _netns_of(pid: int) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith(f"fu-{pid}-")]


@pytest.fixture(scope="module", params=ENGINES)
def run(request):
    require_root()
    require_etcd()
    require_engine(request.param)
    if request.param == "python":
        require_engine("c")          # the batching comparison runs both engines
    t0 = time.monotonic()
    p = subprocess.run(cli_argv("demo", "--json", "--engine", request.param),
                       capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, f"demo exited {p.returncode}:\n{p.stderr[-3000:]}"
    result = json.loads(p.stdout)            # exactly one JSON object on stdout
    return types.SimpleNamespace(kind=request.param, r=result, elapsed=elapsed, proc=p)


def _step(r, sid):
    return next(s for s in r["steps"] if s["id"] == sid)


def test_runs_fast_and_tears_down(run):
    assert run.elapsed < 50, f"the demo took {run.elapsed:.1f} s"
    assert run.r["torn_down"] is True
    for d in run.r["hosts"].values():
        assert not os.path.exists(f"/proc/{d['daemon_pid']}"), "a daemon survived the demo"
    # No namespace of the demo's run (its pid is the one that made them) is left.
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for d in run.r["hosts"].values():
        assert d["netns"] not in left
        assert d["workload"]["netns"] not in left


def test_every_step_present_in_order(run):
    from dataplane.demo.steps import TUN_PATH
    assert [s["id"] for s in run.r["steps"]] == STEPS == list(TUN_PATH)
    assert [s["n"] for s in run.r["steps"]] == list(range(1, len(STEPS) + 1))
    for s in run.r["steps"]:
        assert s["title"] and s.get("side") and s.get("why"), s["id"]
    assert run.r["engine"] == run.kind


def test_leases_subnet_env_routes(run):
    r = run.r
    A, B = r["hosts"]["A"], r["hosts"]["B"]
    leases = {l["subnet"]: l for l in r["leases"]}
    assert set(leases) == {A["subnet"], B["subnet"]}
    for h in (A, B):
        lease = leases[h["subnet"]]
        assert lease["public_ip"] == h["underlay_ip"] == lease["value"]["PublicIP"]
        assert lease["key"].endswith("/subnets/" + subnet_key_name(ip_network(h["subnet"])))
        env = h["subnet_env"]
        assert env["FLANNEL_NETWORK"] == r["network_config"]["Network"]
        assert env["FLANNEL_SUBNET"].split("/")[0] == h["workload"]["gateway"]
        assert int(env["FLANNEL_MTU"]) == h["flannel0_link"]["mtu"] == 1500 - 28
        assert f"{r['network_config']['Network']} dev flannel0" in h["routes"]
        assert h["flannel0_link"]["addr"] == f"{h['flannel0']}/32"
        assert f"{h['underlay_ip']}:{r['port']}" in (h["socket"] or "")
        assert h["daemon_argv"].startswith("flannel-udp run --etcd-endpoints "), h["daemon_argv"]
    # The kernel's choices, as `ip route get` printed them.
    assert A["route_get"]["dev"] == "flannel0"
    assert B["route_get"]["dev"] == B["workload"]["host_iface"]
    assert A["route_get_workload"]["via"] == A["workload"]["gateway"]


def _check_leg(r, leg, src_role, dst_role, expected_len, proto):
    H = r["hosts"]
    src, dst = H[src_role], H[dst_role]
    rd, hit, snd, rcv, wr = (leg[k] for k in ("tun_read", "route_hit", "udp_send", "udp_recv",
                                              "tun_write"))
    # The bytes the engine read from the TUN are the real packet.
    assert rd["len"] == expected_len == rd["packet"]["tot_len"]
    assert rd["packet"]["src"] == src["workload"]["ip"]
    assert rd["packet"]["dst"] == dst["workload"]["ip"]
    assert rd["packet"]["proto"] == proto and rd["packet"]["checksum_ok"]
    assert bytes.fromhex(rd["head"])[:1] == b"\x45"
    # The lease-table lookup chose the other host: its underlay IP, its lease's PublicIP.
    lease = next(l for l in r["leases"] if l["subnet"] == dst["subnet"])
    assert hit["peer"] == dst["underlay_ip"] == lease["public_ip"]
    assert hit["port"] == r["port"] == 8285
    assert hit["prefixlen"] == int(dst["subnet"].split("/")[1])
    # The outer datagram: inner + 28, from this host's underlay address and port.
    assert snd["peer"] == dst["underlay_ip"] and snd["len"] == rd["len"] and snd["batch"] >= 1
    o = leg["outer"]
    assert (o["src"], o["sport"], o["dst"], o["dport"]) == (src["underlay_ip"], r["port"],
                                                            dst["underlay_ip"], r["port"])
    assert o["ip_len"] == rd["len"] + 28 and o["udp_len"] == rd["len"] + 8
    wire = leg["wire"]
    assert wire is not None, "the tap on A's veth did not see the datagram"
    assert wire["outer"]["tot_len"] == rd["len"] + 28
    assert wire["outer"]["src"] == src["underlay_ip"] and wire["outer"]["dst"] == dst["underlay_ip"]
    assert wire["outer"]["udp"] == {"sport": r["port"], "dport": r["port"], "len": rd["len"] + 8}
    assert wire["inner"]["id"] == rd["packet"]["id"]
    assert wire["inner"]["ttl"] == rd["packet"]["ttl"] - 1        # after the sender's TTL - 1
    # The receive on the other host and the write into its TUN.
    assert rcv["source"] == src["underlay_ip"] and rcv["sport"] == r["port"]
    assert rcv["len"] == rd["len"] and rcv["batch"] >= 1
    assert rcv["packet"]["id"] == rd["packet"]["id"]
    assert rcv["packet"]["ttl"] == rd["packet"]["ttl"] - 1
    assert wr["len"] == rd["len"] and wr["packet"]["ttl"] == rd["packet"]["ttl"] - 2
    assert wr["packet"]["checksum_ok"]


def test_ping_followed(run):
    r = run.r
    ping = r["probes"]["ping"]
    res = ping["result"]
    assert res["received"] == 1 and res["rc"] == 0
    assert res["expected_len"] == res["size"] + 8 + 20 == 84
    _check_leg(r, ping["request"], "A", "B", res["expected_len"], "icmp")
    _check_leg(r, ping["reply"], "B", "A", res["expected_len"], "icmp")
    assert ping["request"]["tun_read"]["packet"]["icmp"]["type"] == 8
    assert ping["reply"]["tun_read"]["packet"]["icmp"]["type"] == 0
    # ping's reply TTL: 64 - (A's kernel, engine B... ) = two kernel hops + two engine hops.
    assert res["ttl"] == 64 - 4
    assert _step(r, "lookup")["data"]["lease"]["public_ip"] == r["hosts"]["B"]["underlay_ip"]


def test_timeline_is_causal(run):
    """Both daemons stamp events with the one kernel's CLOCK_MONOTONIC: what must come first does."""
    tl = _step(run.r, "reply")["data"]["timeline"]
    ev = tl["events"]
    assert len(ev) == 8 and ev[0]["t_us"] == 0 and tl["total_us"] == ev[-1]["t_us"]
    assert [e["t_us"] for e in ev] == sorted(e["t_us"] for e in ev)
    ts = {(e["host"], e["event"], e["packet"]): e["ts_ns"] for e in ev}
    for host in "AB":        # one engine thread per host: its own events in path order
        mine = [e["path_order"] for e in ev if e["host"] == host]
        assert mine == sorted(mine), host
    assert ts[("A", "TUN_READ", "request")] < ts[("B", "UDP_RECV", "request")]
    assert ts[("B", "TUN_READ", "reply")] < ts[("A", "UDP_RECV", "reply")]
    rtt_us = run.r["probes"]["ping"]["result"]["rtt_ms"] * 1e3
    # ping stamps its request before A reads it and its reply after A has received it.
    inside = (ts[("A", "UDP_RECV", "reply")] - ts[("A", "TUN_READ", "request")]) / 1e3
    assert 0 < inside < rtt_us + 50


def test_udp_followed(run):
    r = run.r
    udp = r["probes"]["udp"]
    res = udp["result"]
    assert res["received"] == res["sent"] == len(res["payload"].encode()) and res["same"]
    assert res["expected_len"] == res["sent"] + 28
    _check_leg(r, udp["request"], "A", "B", res["expected_len"], "udp")
    _check_leg(r, udp["reply"], "B", "A", res["expected_len"], "udp")
    assert udp["request"]["tun_read"]["packet"]["udp"]["dport"] == res["dport"]
    app = res["app_received"]
    assert app == {"from": r["hosts"]["A"]["workload"]["ip"], "sport": res["sport"],
                   "len": res["sent"]}
    assert udp["request"]["tun_read"]["packet"]["udp"]["sport"] == res["sport"]


@pytest.mark.parametrize("probe", ["ping", "udp"])
def test_counters_are_metrics_deltas_and_match_the_trace(run, probe):
    p = run.r["probes"][probe]
    length = p["result"]["expected_len"]
    for role in ("A", "B"):
        before, after, d = p["stats_before"][role], p["stats_after"][role], p["counters"][role]
        assert d == {k: after[k] - before.get(k, 0) for k in after}
        # One packet each way through each engine, nothing else.
        for k in ("tun_rx_packets", "udp_tx_packets", "udp_rx_packets", "tun_tx_packets"):
            assert d[k] == 1, (role, k, d)
        for k in ("tun_rx_bytes", "udp_tx_bytes", "udp_rx_bytes", "tun_tx_bytes"):
            assert d[k] == length, (role, k, d)
        assert all(v == 0 for k, v in d.items() if k.startswith("drop_")), d
        # Syscall counters: non-zero, and the total covers every kind.
        assert d["syscalls"] > 0 and d["tun_reads"] >= 1 and d["tun_writes"] == 1
        assert d["udp_sends"] >= 1 and d["udp_recvs"] >= 1 and d["polls"] >= 1
        assert d["syscalls"] >= sum(d[k] for k in KINDS)
        # The trace events in the window are the same packets the counters saw.
        ev = p["events"][role]
        kinds = [e["kind"] for e in ev]
        assert kinds.count("tun_read") == d["tun_rx_packets"]
        assert kinds.count("udp_recv") == d["udp_rx_packets"]
        assert kinds.count("tun_write") == d["tun_tx_packets"]
        assert kinds.count("route_hit") == d["tun_rx_packets"]
        assert sum(1 for e in ev if e["kind"] == "udp_send") >= 1
        assert all(e["seq"] > p["cursor"][role] for e in ev)
    # ... and they are the daemons' /metrics, read here by the exported names.
    # (the keys without the queue label are the sums over the queues, as parse_metrics adds them;
    # the syscall total is the sum of the kinds)
    names = {"tun_reads": 'flannel_udp_syscalls_total{kind="tun_reads"}',
             "udp_sends": 'flannel_udp_syscalls_total{kind="udp_sends"}',
             "polls": 'flannel_udp_syscalls_total{kind="polls"}',
             "tun_rx_packets": 'flannel_udp_packets_total{path="tun_rx"}',
             "udp_tx_bytes": 'flannel_udp_bytes_total{path="udp_tx"}',
             "tx_batches": 'flannel_udp_batches_total{direction="tx"}'}

    def syscalls(metrics):
        return sum(v for k, v in metrics.items()
                   if k.startswith("flannel_udp_syscalls_total{") and "queue=" not in k)

    for role in ("A", "B"):
        for stat, metric in names.items():
            assert p["stats_after"][role][stat] == p["metrics_after"][role][metric]
            assert p["counters"][role][stat] == \
                p["metrics_after"][role][metric] - p["metrics_before"][role][metric]
        assert p["stats_after"][role]["syscalls"] == syscalls(p["metrics_after"][role])
        assert p["counters"][role]["syscalls"] == \
            syscalls(p["metrics_after"][role]) - syscalls(p["metrics_before"][role])
    cost = _step(run.r, "ping_cost")["data"] if probe == "ping" else None
    if cost:
        assert cost["A"]["syscalls"] == p["counters"]["A"]["syscalls"]


def test_batching_measured_for_both_engines(run):
    bursts = run.r["bursts"]
    assert set(bursts) == {"c", "python"}
    for kind, b in bursts.items():
        assert b["sent"] > 0 and b["received"] > 0
        for side, n_key in (("send_side", "tun_rx_packets"), ("receive_side", "udp_rx_packets")):
            s = b[side]
            host = "A" if side == "send_side" else "B"
            d = b["counters"][host]
            assert s["packets"] == d[n_key] > 0
            assert s["syscalls"] == d["syscalls"] > 0
            assert abs(s["syscalls_per_packet"] - d["syscalls"] / d[n_key]) < 0.01
            assert d == {k: b["stats_after"][host][k] - b["stats_before"][host].get(k, 0)
                         for k in b["stats_after"][host]}
        send = b["counters"]["A"]
        if kind == "c":
            # sendmmsg: fewer send calls than packets once packets queue up.
            assert send["udp_sends"] < send["udp_tx_packets"]
        else:
            # Python has no sendmmsg: one sendto() per packet.
            assert send["udp_sends"] >= send["udp_tx_packets"]
        # A TUN has no batched read: at least one read() per packet.
        assert send["tun_reads"] >= send["tun_rx_packets"]
    measured = {m["engine"]: m for m in run.r["summary"]["measured"]}
    assert measured["c"]["send"] == bursts["c"]["send_side"]["syscalls_per_packet"]
    rows = {m["short"]: m for m in run.r["summary"]["rows"]}
    for kind in ("c", "python"):
        s = bursts[kind]
        assert rows[f"{kind} burst"]["syscalls"] == round(
            s["send_side"]["syscalls_per_packet"] + s["receive_side"]["syscalls_per_packet"], 2)
    cA, cB = (run.r["probes"]["ping"]["counters"][h] for h in "AB")
    assert rows["one ping"]["syscalls"] == round(cA["syscalls"] / 2 + cB["syscalls"] / 2, 2)
    # Copies measured from the byte counters: every packet is copied out of and back into the
    # kernel once on each host, whatever the batching.
    for short in ("one ping", "c burst", "python burst"):
        assert rows[short]["copies"] == 4 and rows[short]["crossings"] == 4, rows[short]
    assert rows["one ping"]["bytes_added"] == 28
    model = {m["short"]: m for m in run.r["summary"]["model"]}
    assert model["TUN + UDP"]["copies"] == 4 and model["TUN + UDP"]["bytes_added"] == 28


def test_renderer_and_svg_take_the_real_run(run):
    from rich.console import Console

    from dataplane.demo import svg
    from dataplane.demo.render import Renderer
    buf = io.StringIO()
    rnd = Renderer(Console(file=buf, width=100, no_color=True, highlight=False))
    rnd.demo = types.SimpleNamespace(result=run.r)
    for s in run.r["steps"]:
        rnd.on_step(s)
    text = buf.getvalue()
    rd = run.r["probes"]["ping"]["request"]["tun_read"]
    assert f"{rd['len']} bytes = {rd['packet']['summary']}" in text
    assert f"{rd['len'] + 28} bytes" in text and "28 bytes" in text
    assert run.r["hosts"]["B"]["underlay_ip"] in text
    ET.fromstring(svg.render(run.r))       # well-formed SVG


def test_ctrl_c_tears_everything_down(tmp_path):
    require_root()
    require_etcd()
    out = tmp_path / "demo.out"
    with open(out, "w") as f:
        # unbuffered: a file gets the demo's output in blocks, and the prompt could reach it
        # only once the demo is done, too late to interrupt it (seen on a stock Debian). With
        # --step and nothing ever written to its stdin, the demo waits at its first step: the
        # interrupt comes while the overlay is up, however fast the demo runs.
        # SIGINT back to its default in the child: a suite started in the background by a
        # shell without job control inherits it ignored, and Python then never raises
        # KeyboardInterrupt (seen: the demo ran on to its end, or sat at its prompt).
        p = subprocess.Popen(cli_argv("demo", "--engine", "python", "--one-engine", "--step"),
                             stdin=subprocess.PIPE, stdout=f, stderr=subprocess.STDOUT,
                             text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: "Enter: next step" in out.read_text() or p.poll() is not None, 60,
                   0.1, "the demo to wait at its first step")
        assert "Enter: next step" in out.read_text(), out.read_text()
        assert _netns_of(p.pid), "the demo's namespaces should exist while it runs"
        p.send_signal(signal.SIGINT)
        rc = p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdin.close()
    assert rc == 130, out.read_text()[-2000:]
    assert "interrupted" in out.read_text()
    assert _netns_of(p.pid) == []


def test_error_midway_tears_everything_down(monkeypatch):
    """A step that fails after the overlay and the workloads are up still removes them all."""
    require_root()
    require_etcd()
    from dataplane.demo import story

    seen = {}

    def boom(self):
        seen["hosts"] = {k: dict(v) for k, v in self.result["hosts"].items()}
        seen["netns"] = list(self.ov.tb.namespaces())
        raise story.DemoError("made to fail for the test")
    monkeypatch.setattr(story.Demo, "_probe_udp", boom)
    d = story.Demo("python", compare_engines=False)
    with pytest.raises(story.DemoError, match="made to fail"):
        d.run()
    assert d.result["torn_down"] is True and d.ov is None
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = seen["netns"] + [h["workload"]["netns"] for h in seen["hosts"].values()]
    assert len(names) == 5 and not [n for n in names if n in left]
    for h in seen["hosts"].values():
        assert not os.path.exists(f"/proc/{h['daemon_pid']}")


# -- demo --direct-routing: one run, C engine (the engines are not on this path) ---------------

DIRECT_STEPS = ["overlay", "workloads", "app_send", "kernel_route", "wire", "untouched",
                "deliver_direct", "summary"]


@pytest.fixture(scope="module")
def direct_run():
    require_root()
    require_etcd()
    require_engine("c")
    t0 = time.monotonic()
    p = subprocess.run(cli_argv("demo", "--json", "--engine", "c", "--direct-routing"),
                       capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, f"demo exited {p.returncode}:\n{p.stderr[-3000:]}"
    return types.SimpleNamespace(r=json.loads(p.stdout), elapsed=elapsed)


def test_direct_routing_goes_host_to_host(direct_run):
    """With "DirectRouting": true the followed packets take the kernel route
    `<peer subnet> via <peer PublicIP> dev <veth>`, as the hosts say: ip route get, the wire tap
    (the packet itself, nothing added), flannel0's kernel counters and the engines' counters
    and trace rings still."""
    r = direct_run.r
    assert direct_run.elapsed < 50, f"the demo took {direct_run.elapsed:.1f} s"
    assert r["torn_down"] is True
    from dataplane.demo.steps import DIRECT_PATH
    assert [s["id"] for s in r["steps"]] == DIRECT_STEPS == list(DIRECT_PATH)
    assert r["network_config"]["Backend"]["DirectRouting"] is True
    H = r["hosts"]
    A, B = H["A"], H["B"]
    for l in r["leases"]:
        assert l["value"]["DirectRouting"] is True, l
    for src, dst in ((A, B), (B, A)):
        route = f"{dst['subnet']} via {dst['underlay_ip']} dev {src['iface']}"
        # a nexthop object's id after the subnet where the kernel has them (host/nexthops.py)
        lines = [re.sub(r" nhid \d+ ", " ", ln, count=1) for ln in src["routes"]]
        assert any(ln.startswith(route + " ") or ln == route for ln in lines), \
            (route, src["routes"])
        assert src["peers_by_mode"].get("direct") == 1, src["peers_by_mode"]
        assert not src["peers_by_mode"].get("encapsulated"), src["peers_by_mode"]
    # The kernel's own choice for the forwarded packet: B's PublicIP on A's veth, not flannel0.
    assert A["route_get"]["via"] == B["underlay_ip"] and A["route_get"]["dev"] == A["iface"]
    assert B["route_get"]["dev"] == B["workload"]["host_iface"]
    assert B["route_get_reply"]["via"] == A["underlay_ip"]
    # On the wire: the workloads' packets themselves, nothing added, one TTL off per kernel.
    for probe, proto in (("ping", "icmp"), ("udp", "udp")):
        p = r["probes"][probe]
        assert p["result"]["received"], p["result"]
        for leg, src, dst in (("request", A, B), ("reply", B, A)):
            w = p[leg]["wire"]
            assert w is not None, f"{probe} {leg}: the tap did not see the plain packet"
            assert (w["src"], w["dst"], w["proto"]) == (src["workload"]["ip"],
                                                        dst["workload"]["ip"], proto)
            assert w["tot_len"] == p["result"]["expected_len"]
            assert w["direction"] == ("out" if leg == "request" else "in")
            assert w["ttl"] == 64 - 1        # forwarded once (by the sender's host) on the wire
            assert p[leg]["engine_events"] == []
        # Neither flannel0 (the kernel's counters) nor an engine moved a packet.
        for role in ("A", "B"):
            f0 = p["flannel0"][role]
            assert f0 and f0["rx_packets"] == f0["tx_packets"] == 0, (probe, role, f0)
            c = p["counters"][role]
            for k in ("tun_rx_packets", "udp_tx_packets", "udp_rx_packets", "tun_tx_packets"):
                assert c[k] == 0, (probe, role, k, c)
    assert r["probes"]["ping"]["result"]["ttl"] == 64 - 2
    row = next(m for m in r["summary"]["rows"] if m["short"] == "one ping, direct")
    assert row["copies"] == 0 and row["bytes_added"] == 0
    # The renderer takes the run.
    from rich.console import Console

    from dataplane.demo.render import Renderer
    buf = io.StringIO()
    rnd = Renderer(Console(file=buf, width=100, no_color=True, highlight=False))
    rnd.demo = types.SimpleNamespace(result=r)
    for s in r["steps"]:
        rnd.on_step(s)
    assert A["route_get"]["text"] in buf.getvalue()


# -- demo --ipv6: one run, C engine, one engine (no switch: about 15 s) ------------------------

def test_ipv6_ping_followed_through_the_engines():
    """With a dual-stack config the workloads get IPv6 addresses from FLANNEL_IPV6_SUBNET and an
    IPv6 ping is followed through both engines' trace rings: its IPv6 header in the heads, the
    route hit on the peer's IPv6 /64 carrying the peer's IPv4 PublicIP, the outer datagram the
    inner packet + 28 (also on the wire), one hop off per engine and per kernel."""
    require_root()
    require_etcd()
    require_engine("c")
    t0 = time.monotonic()
    p = subprocess.run(cli_argv("demo", "--json", "--engine", "c", "--ipv6", "--one-engine"),
                       capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, f"demo exited {p.returncode}:\n{p.stderr[-3000:]}"
    r = json.loads(p.stdout)
    assert elapsed < 50 and r["torn_down"] is True and r["ipv6"] is True
    from dataplane.demo.steps import TUN_PATH_IPV6
    assert [s["id"] for s in r["steps"]] == list(TUN_PATH_IPV6)
    assert r["network_config"]["EnableIPv6"] is True
    H, leases = r["hosts"], {l["public_ip"]: l for l in r["leases"]}
    ping6 = r["probes"]["ping6"]
    assert ping6["result"]["received"] and ping6["result"]["expected_len"] == 104
    for leg, src, dst in (("request", H["A"], H["B"]), ("reply", H["B"], H["A"])):
        lg = ping6[leg]
        rd, hit, wr = lg["tun_read"], lg["route_hit"], lg["tun_write"]
        six = ip_network(leases[dst["underlay_ip"]]["ipv6_subnet"])
        assert rd["packet"]["version"] == 6 and rd["len"] == 104
        assert rd["packet"]["dst"] == str(six.network_address + 2)      # the workload
        assert rd["packet"]["icmp"]["name"] == ("echo request" if leg == "request" else
                                                "echo reply")
        assert (hit["peer"], hit["prefixlen"]) == (dst["underlay_ip"], six.prefixlen)
        assert lg["udp_send"]["peer"] == dst["underlay_ip"]
        assert lg["udp_recv"]["source"] == src["underlay_ip"]
        assert lg["outer"]["ip_len"] == 104 + 28 == lg["wire"]["outer"]["tot_len"]
        assert wr["packet"]["hop_limit"] == rd["packet"]["hop_limit"] - 2 == 64 - 3
    step = next(s for s in r["steps"] if s["id"] == "ping6")
    assert step["data"]["lease"]["ipv6_subnet"] == leases[H["B"]["underlay_ip"]]["ipv6_subnet"]
    from rich.console import Console

    from dataplane.demo.render import Renderer
    buf = io.StringIO()
    rnd = Renderer(Console(file=buf, width=100, no_color=True, highlight=False))
    rnd.demo = types.SimpleNamespace(result=r)
    rnd.on_step(step)
    assert "hop limit" in buf.getvalue() and "echo request" in buf.getvalue()


# -- demo --engine kernel: one run (the tc programs, the C engine behind them: about 10 s) ------

def test_kernel_path_ping_carried_by_the_programs():
    """With --engine kernel both daemons run the kernel path: the story's figures are the
    readings. The ping's request left A as a datagram the egress program counted
    (udp_tx_packets on A, tun_tx_packets on B's ingress program) and the tap saw (inner + 28);
    the engines moved no packet, made no call that moves one, copied no byte and traced
    nothing (0 crossings, 0 copies in the summary's measured row); a TTL-2 ping is handed on by
    A's program (passed_tx_ttl) and answered by A's engine (time exceeded)."""
    require_root()
    require_etcd()
    require_engine("c")
    require_bpf()
    t0 = time.monotonic()
    p = subprocess.run(cli_argv("demo", "--json", "--engine", "kernel"),
                       capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, f"demo exited {p.returncode}:\n{p.stderr[-3000:]}"
    r = json.loads(p.stdout)
    assert elapsed < 50 and r["torn_down"] is True
    from dataplane.demo.kernel_readings import kernel_counters
    from dataplane.demo.steps import KERNEL_PATH
    assert [s["id"] for s in r["steps"]] == list(KERNEL_PATH)
    assert r["datapath"] == "kernel" and r["engine"] == "c"
    H = r["hosts"]
    for h in H.values():
        assert "--engine kernel" in h["daemon_argv"]
    ping = r["probes"]["ping"]
    assert ping["result"]["received"] and ping["result"]["ttl"] == 64 - 4
    # The programs' counters are the daemons' /metrics deltas, and they moved.
    for role in ("A", "B"):
        want = {k: v - kernel_counters(ping["metrics_before"][role]).get(k, 0)
                for k, v in kernel_counters(ping["metrics_after"][role]).items()}
        assert ping["kernel"][role] == want
        assert want["udp_tx_packets"] >= 1 and want["tun_tx_packets"] >= 1, (role, want)
    steps = {s["id"]: s for s in r["steps"]}
    assert steps["tc_egress"]["data"]["counters_A"]["udp_tx_packets"] >= 1
    assert steps["tc_ingress"]["data"]["counters_B"]["tun_tx_packets"] >= 1
    # On the wire: flannel's datagram, A to B's port, the inner packet + 28, one TTL off each.
    w = ping["request"]["wire"]
    assert (w["outer"]["src"], w["outer"]["dst"]) == (H["A"]["underlay_ip"], H["B"]["underlay_ip"])
    assert w["outer"]["udp"]["dport"] == r["port"]
    assert w["outer"]["tot_len"] == ping["result"]["expected_len"] + 28
    assert w["inner"]["ttl"] == 64 - 2 and steps["tc_egress"]["data"]["bytes_added"] == 28
    # The engines: nothing moved, on either host, for the ping or the UDP datagram.
    for name in ("ping", "udp"):
        for role in ("A", "B"):
            e = steps["engines_idle"]["data"][name][role]
            assert e["packets"] == dict.fromkeys(e["packets"], 0), (name, role, e)
            assert e["calls"] == 0 and e["bytes_copied"] == 0 and e["trace_events"] == 0
            assert e["programs"] == r["probes"][name]["kernel"][role]
    row = next(m for m in r["steps"][-1]["data"]["rows"] if m.get("measured"))
    assert (row["crossings"], row["copies"], row["syscalls"], row["bytes_added"]) == (0, 0, 0, 28)
    # What stays with the engine: the TTL-2 ping, handed on by A's program, answered by A's engine.
    slow = steps["slow_path"]["data"]
    assert "Time to live exceeded" in (slow["result"]["answer"] or ""), slow["result"]
    assert slow["programs_A"].get("passed_tx_ttl", 0) >= 1, slow["programs_A"]
    assert slow["engine_A"].get("icmp_ttl_sent", 0) >= 1, slow["engine_A"]
    # The renderer takes the run, the kernel path's picture with it.
    from rich.console import Console

    from dataplane.demo.render import Renderer
    buf = io.StringIO()
    rnd = Renderer(Console(file=buf, width=100, no_color=True, highlight=False))
    rnd.demo = types.SimpleNamespace(result=r)
    for s in r["steps"]:
        rnd.on_step(s)
    out = buf.getvalue()
    assert "flannel0: tc egress" in out and "udp_tx_packets +" in out and "passed_tx_ttl +" in out
    from dataplane.demo import svg_kernel
    svg = svg_kernel.render(r)
    ET.fromstring(svg)
    assert "fu_egress" in svg and f"udp_tx_packets +{ping['kernel']['A']['udp_tx_packets']}" in svg
