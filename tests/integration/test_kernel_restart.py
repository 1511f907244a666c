"""The kernel path outlives its process (docs/kernel-path.md, "Restarts, pins and cleanup").

::

    h0 = A: a child process that makes a persistent flannel0 and puts the programs on it and
            on A's veth, pinned (engine/bpf_pins.py), then waits; `flannel-udp forward` on
            that flannel0 as the slow path (each engine)
    h1 = B: `flannel-udp forward` (the same engine)

Ping streams run A -> B (both inner families) and B -> A. The child and A's engine are
SIGKILLed: nothing is lost, since no process was in the path. A second child adopts the pins (it finds the same
programs running, leaves them on their hooks, reads the routes back) and adds a route: a
subnet reached only through it answers, and the streams still lose nothing; a new engine
answers what the programs hand on (TTL 1). The counters
count on across both. Then `flannel-udp cleanup` leaves nothing attached, pinned or
persistent.

The pins live on a bpffs of the test's own, mounted outside /sys: `ip netns exec` remounts
/sys for the namespace, which hides /sys/fs/bpf, and a bpffs mount is one set of pins.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import types

import pytest

from dataplane.host.child import cli_argv, python_argv
from dataplane.testbed.forwarder import Forwarder
from dataplane.testbed.ping_stream import PingStream
from dataplane.testbed.wait import wait_for
from tests.conftest import require_bpf, require_root

pytestmark = [pytest.mark.root, pytest.mark.slow]

PORT, MTU = 8285, 1472
A_TUN, B_TUN, A_TUN6, B_TUN6 = "10.5.1.0", "10.5.2.0", "fd00:5:1::", "fd00:5:2::"
ONLY_NEW = "10.5.3.1"        # on B, routed by A's programs only once the second child adds it

# The child on A: argv[1] is its JSON config. It writes what it found into cfg["out"], then
# holds on until it is killed.
HOLDER = r"""
import json, os, signal, socket, subprocess, sys
from dataplane.engine.api import Route
from dataplane.engine.bpf_path import KernelPath
from dataplane.host import tun
cfg = json.loads(sys.argv[1])
fd, name = tun.open_tun("flannel0", persist=True)   # made, or found as the last child left it
os.close(fd)                                         # the engine attaches to it; it stays
def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)
if cfg["setup"]:
    ip("link", "set", "flannel0", "mtu", str(cfg["mtu"]), "up")
    ip("addr", "add", cfg["tun"] + "/32", "dev", "flannel0")
    ip("-6", "addr", "add", cfg["tun6"] + "/128", "dev", "flannel0", "nodad")
    ip("route", "add", "10.5.0.0/16", "dev", "flannel0")
    ip("-6", "route", "add", "fd00:5::/32", "dev", "flannel0")
kp = KernelPath(pin_dir=cfg["pins"])
found = {"state": kp.maps_state, "same_programs": kp.same_programs,
         "routes": sorted(str(s) for s in kp._routes)}
kp.configure(own_ip=cfg["own_ip"], port=cfg["port"], mtu=cfg["mtu"], strict=True,
             own_subnets=[cfg["tun"] + "/24", cfg["tun6"] + "/64"])
kp.set_routes([Route.make(s, p, cfg["port"]) for s, p in cfg["routes"]])
kp.set_local([cfg["own_ip"], cfg["tun"], cfg["tun6"]])
kp.attach(socket.if_nametoindex("flannel0"), socket.if_nametoindex(cfg["ext"]))
with open(cfg["out"] + ".tmp", "w") as f:
    json.dump(found, f)
os.replace(cfg["out"] + ".tmp", cfg["out"])
while True:
    signal.pause()
"""


def holder(tb, a, b, pins, out, routes, setup):
    cfg = {"setup": setup, "pins": pins, "out": out, "own_ip": a.ip, "port": PORT, "mtu": MTU,
           "tun": A_TUN, "tun6": A_TUN6, "ext": a.iface, "routes": routes}
    with open(out + ".log", "w") as log:
        proc = tb.popen(a, python_argv(HOLDER) + [json.dumps(cfg)], stdout=log,
                        stderr=subprocess.STDOUT)
    if not wait_for(lambda: os.path.exists(out) or proc.poll() is not None, 20) \
            or not os.path.exists(out):
        tb.kill(proc, sig=signal.SIGKILL)
        with open(out + ".log") as log:
            raise AssertionError(f"the kernel path's child did not start:\n{log.read()}")
    with open(out) as f:
        return proc, json.load(f)


def slow_path(tb, a, b, kind):
    """A's engine, on the persistent flannel0 the kernel path's child made: what the programs
    hand on (here: TTL 1) it answers, as the daemon's slow path does."""
    return Forwarder(tb, a, tun_addr=f"{A_TUN}/32", engine=kind, accept_from="leases",
                     routes=[f"{B_TUN}/24={b.ip}", f"{B_TUN6}/64={b.ip}"],
                     extra=["--tun-name", "flannel0", "--queues", "1"]).wait_ready()


def counters(pins):
    from dataplane.engine import bpf_pinned
    return bpf_pinned.describe(pins)["counters"]


def mount_bpffs(path):
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mount(b"bpffs", path.encode(), b"bpf", 0, None) == 0, os.strerror(ctypes.get_errno())
    return lambda: libc.umount2(path.encode(), 2)          # MNT_DETACH


def test_the_kernel_path_outlives_its_process(engine_kind):
    require_root()
    require_bpf()
    from dataplane.testbed.hosts import Testbed
    bpffs = tempfile.mkdtemp(prefix="fu-kpin-bpffs-")
    unmount = mount_bpffs(bpffs)
    root = os.path.join(bpffs, "flannel-udp")
    pins = os.path.join(root, "flannel0")
    tb = Testbed(2, disable_ipv6=False)
    streams, fwd, procs = [], None, []
    try:
        a, b = tb["h0"], tb["h1"]
        fwd = Forwarder(tb, b, tun_addr=f"{B_TUN}/32", engine=engine_kind, accept_from="leases",
                        routes=[f"{A_TUN}/24={a.ip}", f"{A_TUN6}/64={a.ip}"],
                        extra=["--tun-addr6", f"{B_TUN6}/128", "--network6", "fd00:5::/32"])
        fwd.wait_ready()
        tb.exec(b, ["ip", "addr", "add", f"{ONLY_NEW}/32", "dev", "lo"], check=True)
        # B's C engine sends what one batch holds for A as a UDP GSO train, which a NIC cuts
        # into datagrams on the way out and a veth hands on whole; A's ingress program cannot
        # take a train apart and hands it to A's engine, and there is none here. So B's
        # kernel cuts the trains, as B's NIC would (docs/kernel-path.md, "Restarts")
        tb.exec(b, ["ethtool", "-K", b.iface, "tx-udp-segmentation", "off"], check=True)
        routes = [[f"{B_TUN}/24", b.ip], [f"{B_TUN6}/64", b.ip]]
        p1, found1 = holder(tb, a, b, pins, os.path.join(tb.workdir, "h1.json"), routes, True)
        procs.append(p1)
        assert found1["state"] == "new", found1
        fa = slow_path(tb, a, b, engine_kind)
        procs.append(fa.proc)
        ping = tb.exec(a, ["ping", "-n", "-c", "1", "-W", "2", B_TUN])
        assert ping.returncode == 0, f"{ping.stdout}\n{fwd.log()}"
        assert tb.exec(a, ["ping", "-n", "-c", "1", "-W", "1", ONLY_NEW]).returncode != 0

        overlay = types.SimpleNamespace(tb=tb)
        streams = [PingStream(overlay, a, B_TUN, 0.02, 20), PingStream(overlay, a, B_TUN6, 0.02, 20),
                   PingStream(overlay, b, A_TUN, 0.02, 20)]
        assert wait_for(lambda: all(s.replies for s in streams), 10), "no replies"
        before = counters(pins)
        tb.kill(fa.proc, sig=signal.SIGKILL)                # the whole "daemon" crashes
        tb.kill(p1, sig=signal.SIGKILL)
        time.sleep(2)                                       # no process anywhere on A's path
        between = counters(pins)
        assert between["udp_tx_packets"] > before["udp_tx_packets"] + 50, (before, between)
        assert between["tun_tx_packets"] > before["tun_tx_packets"] + 50, (before, between)
        r = tb.exec(a, cli_argv("status", "--bpf-pins", root, "--status-socket",
                                os.path.join(tb.workdir, "nobody.sock")))
        assert r.returncode == 2 and "RUNNING WITHOUT A DAEMON" in r.stdout, r.stdout + r.stderr
        assert "fu_egress   on flannel0" in r.stdout and f"fu_ingress  on {a.iface}" in r.stdout

        # a new process adopts the path and adds a route; its programs are the same code
        p2, found2 = holder(tb, a, b, pins, os.path.join(tb.workdir, "h2.json"),
                            routes + [["10.5.3.0/24", b.ip]], False)
        procs.append(p2)
        fa = slow_path(tb, a, b, engine_kind)
        procs.append(fa.proc)
        assert found2 == {"state": "reused", "same_programs": True,
                          "routes": sorted([f"{B_TUN}/24", f"{B_TUN6}/64"])}, found2
        ping = tb.exec(a, ["ping", "-n", "-c", "3", "-i", "0.2", "-W", "2", ONLY_NEW])
        assert ping.returncode == 0, ping.stdout
        time.sleep(1)
        results = [s.stop() for s in streams]
        streams = []
        print(f"ping streams across the kill and the adoption ({engine_kind}): "
              + ", ".join(f"{r['replies']} replies, {r['lost']} lost" for r in results))
        for r in results:
            assert r["replies"] > 100 and r["lost"] == 0, results
        after = counters(pins)
        assert after["udp_tx_packets"] > between["udp_tx_packets"], (between, after)
        tb.exec(a, ["ping", "-n", "-c", "1", "-W", "1", "-t", "1", B_TUN], timeout=10)

        # cleanup refuses while a process holds flannel0
        env = dict(os.environ, FLANNELD_IFACE=a.iface)
        argv = cli_argv("cleanup", f"--bpf-pins={root}",
                        f"--subnet-file={os.path.join(tb.workdir, 'subnet.env')}")
        r = tb.exec(a, argv, env=env)
        assert r.returncode == 1 and "flannel0 is held open" in r.stderr, r.stdout + r.stderr
        assert fwd.stop() == 0 and fa.stop() == 0, fwd.log() + fa.log()
        fwd = None
        # the new slow path answers what the programs hand on (an ICMP error to flannel0's own
        # address reaches no local sender: docs/kernel-path.md), and carried nothing else
        sa = fa.stats()
        assert sa["icmp_ttl_sent"] >= 1 and sa["udp_tx_packets"] == 0, sa

        # the device kept what the first process gave it, the programs still on their hooks
        shown = tb.exec(a, ["ip", "-d", "addr", "show", "flannel0"]).stdout
        assert "persist on" in shown or "persist" in shown, shown
        assert f"{A_TUN}/32" in shown and f"{A_TUN6}/128" in shown, shown

        # with no process left, cleanup removes everything
        tb.kill(p2, sig=signal.SIGKILL)
        r = tb.exec(a, argv, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "remove the kernel path pinned at" in r.stdout and "ip link del flannel0" in r.stdout
        assert not os.path.exists(root), os.listdir(root)
        assert tb.exec(a, ["ip", "link", "show", "flannel0"]).returncode != 0
        assert tb.exec(a, ["tc", "qdisc", "show", "dev", a.iface]).stdout.find("clsact") < 0
        assert tb.exec(a, argv, env=env).stdout.strip().startswith("nothing to clean up")
    finally:
        for s in streams:
            s.stop()
        for p in procs:
            tb.kill(p, sig=signal.SIGKILL)
        if fwd is not None:
            fwd.stop()
        tb.close()
        unmount()
        os.rmdir(bpffs)
