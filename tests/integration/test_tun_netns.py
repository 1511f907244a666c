"""open_tun and netconf in a throwaway network namespace (root only; moved here from
tests/unit, which runs without root), and the engines on a TUN that is deleted under them.

The device is created in the namespace of the calling thread, so each check
runs as a small child process under `ip netns exec`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import require_root

pytestmark = [pytest.mark.root, pytest.mark.timeout(60)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHILD = r"""
import errno, json, os, subprocess
from dataplane.host import netconf
from dataplane.host.tun import open_tun

def links():
    return {l["ifname"]: l for l in json.loads(subprocess.check_output(["ip", "-j", "link"]))}

out = {}
fd, name = open_tun()
out["name"] = name
out["nonblock"] = bool(os.get_blocking(fd) is False)
l = links()[name]
out["flags"] = l["flags"]
out["link_type"] = l.get("link_type")
fd2, name2 = open_tun()
out["name2"] = name2
fd3, name3 = open_tun("futest%d")
out["name3"] = name3
os.close(fd2); os.close(fd3)
netconf.configure_tun(name, "10.5.84.0/32", 1472)
netconf.configure_tun(name, "10.5.84.0/32", 1472)  # idempotent
out["added"] = netconf.add_network_route("10.5.0.0/16", name)
out["added_again"] = netconf.add_network_route("10.5.0.0/16", name)
out["addr"] = subprocess.check_output(["ip", "-4", "-br", "addr", "show", "dev", name], text=True).split()
out["route"] = subprocess.check_output(["ip", "route", "show", "10.5.0.0/16"], text=True).strip()
out["mtu"] = netconf.iface_mtu(name)
out["mtu_for_addr"] = netconf.mtu_for_addr("10.5.84.0")
out["tun_mtu_lo"] = netconf.tun_mtu_for_addr("127.0.0.1")
try:
    netconf.iface_mtu("nosuchdev0")
except OSError as e:
    out["nodev"] = e.errno
l = links()
out["up"] = "UP" in l[name]["flags"]
out["before_close"] = sorted(l)
os.close(fd)
out["after_close"] = sorted(links())
print(json.dumps(out))
"""


@pytest.fixture
def netns():
    require_root()
    from dataplane.testbed import netns as ns
    name = ns.ns_name(ns.new_run_id(), "tun")
    ns.create(name)
    try:
        yield name
    finally:
        ns.delete(name)


def _run(netns: str, code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)


def test_open_tun_configure_and_close_removes(netns):
    r = _run(netns, _CHILD)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["name"] == "flannel0" and out["name2"] == "flannel1" and out["name3"] == "futest0"
    assert out["nonblock"]
    assert "POINTOPOINT" in out["flags"] and "NOARP" in out["flags"]
    assert out["link_type"] == "none"               # IFF_TUN: no link-layer header
    assert out["addr"][2:] == ["10.5.84.0/32"]
    assert out["route"].startswith("10.5.0.0/16 dev flannel0")
    assert "proto" not in out["route"]              # proto boot, shown as nothing
    assert out["added"] is True and out["added_again"] is False
    assert out["mtu"] == 1472 and out["mtu_for_addr"] == 1472
    assert out["tun_mtu_lo"] == 65536 - 28
    assert out["nodev"] == 19                        # ENODEV
    assert out["up"]
    assert "flannel0" in out["before_close"] and "flannel1" not in out["before_close"]
    assert out["after_close"] == ["lo"]


# An engine of each queue on flannel0 (as the daemon runs them), idle, then
# `ip link del flannel0`: how long until the engine says so (on_end), and why.
_GONE_CHILD = r"""
import json, os, socket, subprocess, sys, threading, time
from dataplane.engine import engine_class, multi
from dataplane.host import netconf
from dataplane.host.tun import open_tun_queues

kind, queues = sys.argv[1], int(sys.argv[2])
fds, name = open_tun_queues("flannel%d", queues)
netconf.configure_tun(name, "10.5.84.0/32", 1472)
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in fds]
for s in socks:
    s.bind(("127.0.0.1", 0))
engine = multi.create(engine_class(kind), fds, [s.fileno() for s in socks],
                      tun_addr="10.5.84.0", mtu=1472)
told = threading.Event()
engine.on_end(lambda e: told.set())
engine.start()
time.sleep(0.3)
out = {"running_before": engine.ended() == {}}
t0 = time.monotonic()
subprocess.run(["ip", "link", "del", name], check=True)
out["told"] = told.wait(5)
out["ms"] = (time.monotonic() - t0) * 1000
out["all_ended"] = engine.join(5)
out["ended"] = {i: [e.why, e.err] for i, e in engine.ended().items()}
engine.close()
for fd in fds:
    os.close(fd)
print(json.dumps(out))
"""


@pytest.mark.parametrize("queues", [1, 2])
def test_engine_reports_its_tun_deleted_at_once(netns, engine_kind, queues):
    """The loop sees EPOLLERR and EBADFD on the fd and ends with "tun_gone":
    within 100 ms of `ip link del` (which itself takes part of that), every
    queue, without traffic and without anyone polling the device."""
    import errno
    r = _run(netns, _GONE_CHILD, engine_kind, str(queues))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["running_before"] and out["told"] and out["all_ended"], out
    assert out["ended"] == {str(i): ["tun_gone", errno.EBADFD] for i in range(queues)}, out
    assert out["ms"] < 100, out
    print(f"{engine_kind}, {queues} queue(s): told {out['ms']:.1f} ms after `ip link del`")


# The daemon reads this host's addresses every second (host/own_sources.py) over one socket
# kept open: it must see addresses added and removed later, keep one fd, and recover from close.
_READER_CHILD = r"""
import json, os, subprocess
from dataplane.host.netconf import AddressReader, host_addresses
def fds():
    return len(os.listdir("/proc/self/fd"))
r = AddressReader()
out = {"first": sorted(map(str, r()))}
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "addr", "add", "172.31.9.1/32", "dev", "lo"], check=True)
out["added"] = sorted(map(str, r()))
before = fds()
for _ in range(50):
    r()
out["fds_grew"] = fds() - before
subprocess.run(["ip", "addr", "del", "172.31.9.1/32", "dev", "lo"], check=True)
out["removed"] = sorted(map(str, r()))
r.close()
out["after_close"] = fds() - before
out["reopened"] = sorted(map(str, r()))
out["same_as_one_shot"] = sorted(map(str, r())) == sorted(map(str, host_addresses()))
print(json.dumps(out))
"""


def test_address_reader_follows_changes_on_one_socket(netns):
    r = _run(netns, _READER_CHILD)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "172.31.9.1" in out["added"] and "172.31.9.1" not in out["removed"]
    assert out["fds_grew"] == 0, "a socket per call"
    assert out["after_close"] < 0, "close() kept the netlink socket"
    assert out["reopened"] == out["removed"] and out["same_as_one_shot"]
