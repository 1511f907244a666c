"""open_tun and netconf in a throwaway network namespace (root only; moved here from
tests/unit, which runs without root).

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


def _run(netns: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)


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
