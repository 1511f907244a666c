"""DirectRouting's routes made in bulk (host/netlink_batch.py, host/direct_routes.py) against a
real kernel, in a namespace of their own: the routes are those pyroute2 makes one by one
(``ip route show`` the same, both families), a route the kernel refuses comes back with its
subnet and errno while the others go in, removals (those gone already are no error), our
routes listed back, and the on-link decision done in Python from one dump
(host/route_lookup.py) the kernel's own answer, also past a host route and a more specific
route through a gateway.
"""
from __future__ import annotations

import errno
import json
import subprocess

import pytest

from dataplane.host.child import python_argv
from dataplane.testbed import netns as ns
from tests.veth_ns import veth_namespace

pytestmark = [pytest.mark.root]

PEERS = 300
CHILD = """
import json, socket, subprocess
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from pyroute2.netlink.exceptions import NetlinkError
from dataplane.host import direct_routes as dr

def shown():
    return [subprocess.run(["ip"] + f + ["route", "show", "table", "main", "proto", "153"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
            for f in (["-4"], ["-6"])]

ifindex = socket.if_nametoindex("e0")
routes = [(IPv4Network(((10 << 24) + (1 << 16) + (i << 8), 24)), IPv4Address("172.16.0.1") + i)
          for i in range(PEERS)]
routes += [(IPv6Network(f"fc00:5:0:{i:x}::/64"), IPv6Address(f"fd00:1::{i + 10:x}"))
           for i in range(3)]
bad = (IPv4Network("10.9.0.0/24"), IPv4Address("10.99.0.1"))       # no route to its gateway
out = {"refused": [[str(s), str(v), code] for s, v, code in
                   dr.replace_all(routes[:100] + [bad] + routes[100:], ifindex)]}
out["batch"] = shown()
out["installed"] = sorted([str(s), str(v)] for s, v in dr.installed().items())
gone = [s for s, _ in routes[:PEERS // 2]]
out["delete_refused"] = dr.delete_all(gone + [bad[0]])
out["after_delete"] = shown()
out["delete_again"] = dr.delete_all(gone)
dr.delete_all(s for s, _ in routes)
for subnet, via in [bad] + routes:                                  # the old way, one by one
    try:
        dr.replace(subnet, via, ifindex)
    except NetlinkError as e:
        out["old_refused"] = [str(subnet), str(via), e.code]
out["old"] = shown()
ips = [IPv4Address("172.16.0.1") + 37 * i for i in range(200)] + [
    IPv4Address(a) for a in ("172.31.255.254", "172.20.0.5", "172.21.0.9", "192.168.9.5",
                             "8.8.8.8", "127.0.0.1")] + [
    IPv6Address("fd00:1::5") + i for i in range(40)] + [IPv6Address("fd00:2::5")]
out["python"] = sorted(map(str, dr.on_link_all(ips, ifindex)))
out["kernel"] = sorted(str(ip) for ip in ips if dr.on_link(ip, ifindex))
print(json.dumps(out))
""".replace("PEERS", str(PEERS))


@pytest.fixture
def netns():
    with veth_namespace(
            "nlbatch",
            "addr add 172.31.255.254/12 dev e0",
            "addr add 192.168.9.1/24 dev e1",
            "route add default via 192.168.9.254",
            "route add 172.20.0.0/16 via 192.168.9.7",      # inside e0's prefix, via a gateway
            "route add 172.21.0.9 dev e1",                  # a host route on another link
            "addr add fd00:1::1/64 dev e0 nodad",
            "route add fd00:2::/64 via fd00:1::9") as name:
        yield name


def test_routes_in_bulk_are_the_old_ones_and_refusals_name_their_route(netns):
    r = subprocess.run(ns.exec_argv(netns, python_argv(CHILD)), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    # the refused route, with its errno, and only it; the others all in, as pyroute2 makes them
    refused = ["10.9.0.0/24", "10.99.0.1", errno.ENETUNREACH]
    assert out["refused"] == [refused] and out["old_refused"] == refused
    v4, v6 = out["batch"]
    assert len(v4) == PEERS and len(v6) == 3
    assert v4[0].startswith("10.1.0.0/24 via 172.16.0.1 dev e0")
    assert out["batch"] == out["old"]
    assert len(out["installed"]) == PEERS + 3
    assert ["fc00:5:0:2::/64", "fd00:1::c"] in out["installed"]
    # removals: the half asked for goes, one never there is no error, nor a second delete
    assert out["delete_refused"] == [] and out["delete_again"] == []
    assert sum(map(len, out["after_delete"])) == PEERS - PEERS // 2 + 3, out["after_delete"]
    # on the link, as the kernel answers it
    assert out["python"] == out["kernel"]
    assert "172.16.0.1" in out["python"] and "fd00:1::5" in out["python"]
    for not_on in ("172.31.255.254", "172.20.0.5", "172.21.0.9", "8.8.8.8", "fd00:2::5"):
        assert not_on not in out["python"]


WATCH_CHILD = """
import socket, subprocess, time
from ipaddress import IPv4Address, IPv4Network
from dataplane.host import direct_routes as dr

ifindex = socket.if_nametoindex("e0")
routes = [(IPv4Network(((10 << 24) + (i << 8), 24)), IPv4Address("172.16.0.1") + i)
          for i in range(5000)]
subprocess.run(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"], check=True)
calls = []
watch = dr.HostRouteWatch(lambda: calls.append(1), quiet=0.1)
# a small buffer: what a busy daemon's reader, late by a few hundred events, has left
watch._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
watch.start()
time.sleep(1.0)                         # the namespace's own events settle
before = len(calls)
dr.replace_all(routes, ifindex)
time.sleep(0.6)
dr.delete_all(s for s, _ in routes)
time.sleep(0.6)
ours = len(calls) - before
subprocess.run(["ip", "route", "add", "172.23.0.0/16", "via", "192.168.9.8"], check=True)
time.sleep(0.6)
watch.close()
print(ours, len(calls) - before - ours)
"""


def test_the_route_watch_ignores_our_routes_in_bulk_and_sees_another(netns):
    """5,000 of our routes added and removed at once: the watch of the host's routes does not
    re-decide the peers (before, its socket overflowed, ENOBUFS, and every peer was decided
    again); a route of someone else's still makes it."""
    r = subprocess.run(ns.exec_argv(netns, python_argv(WATCH_CHILD)), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["0", "1"]
