"""DirectRouting's routes by nexthop object (host/nexthops.py, host/direct_routes.py put_all,
remove_all, listing) against a real kernel, in a namespace of their own: ``<subnet> nhid I``
with ``id I via <PublicIP> dev e0 proto 153`` in our id block, both families; removal takes
nexthop and route; the plain form when forced (as on a kernel without nexthop objects); a
plain route of an older daemon replaced in place by a route by nexthop (and back); orphans
listed; a restarted process finds its ids; `flannel-udp cleanup`'s steps remove both forms.
"""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from dataplane.host.child import python_argv
from dataplane.testbed import netns as ns
from tests.veth_ns import veth_namespace

pytestmark = [pytest.mark.root]

PRELUDE = """
import json, os, socket, subprocess, sys
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from dataplane.host import direct_routes as dr, nexthops

def ip(*args):
    return subprocess.run(["ip"] + list(args), capture_output=True, text=True,
                          check=True).stdout

def shown():
    return {"v4": ip("-4", "-j", "route", "show", "proto", "153"),
            "v6": ip("-6", "-j", "route", "show", "proto", "153"),
            "nh": ip("-j", "nexthop", "show")}

ifindex = socket.if_nametoindex("e0")
routes = [(IPv4Network(((10 << 24) + (1 << 16) + (i << 8), 24)), IPv4Address("172.16.0.1") + i)
          for i in range(200)]
routes += [(IPv6Network(f"fc00:5:0:{i:x}::/64"), IPv6Address(f"fd00:1::{i + 10:x}"))
           for i in range(3)]
bad = (IPv4Network("10.9.0.0/24"), IPv4Address("10.99.0.1"))       # no route to its gateway
out = {}
"""

NEXTHOPS = PRELUDE + """
out["refused"] = [[str(s), str(v), c] for s, v, c in dr.put_all(routes[:50] + [bad] + routes[50:],
                                                                ifindex)]
out["put"] = shown()
have, other, orphans = dr.listing()
out["listing"] = [sorted([str(s), str(v)] for s, v in have.items()), len(other), orphans]
subprocess.run(["sysctl", "-qw", "net.ipv4.nexthop_compat_mode=0"], check=True)
out["listing_compat_off"] = sorted([str(s), str(v)] for s, v in dr.listing()[0].items())
subprocess.run(["sysctl", "-qw", "net.ipv4.nexthop_compat_mode=1"], check=True)
# a PublicIP that changed
dr.put_all([(routes[0][0], IPv4Address("172.16.5.5"))], ifindex)
out["moved"] = ip("-4", "route", "show", str(routes[0][0]))
# a route deleted by hand leaves its nexthop: an orphan
ip("route", "del", str(routes[1][0]), "proto", "153")
out["orphans"] = dr.listing()[2]
out["removed_refused"] = dr.remove_all([s for s, _ in routes[:100]] + [bad[0]])
out["removed"] = shown()
out["orphans_refused"] = dr.delete_nexthops(dr.listing()[2])       # what a reconcile does
out["no_orphans"] = shown()
print(json.dumps(out))
"""

PLAIN = PRELUDE + """
nexthops.FORCE_PLAIN = True
out["refused"] = dr.put_all(routes, ifindex)
out["put"] = shown()
out["listing"] = [len(dr.listing()[0]), len(dr.listing()[1])]
out["removed_refused"] = dr.remove_all(s for s, _ in routes)
out["removed"] = shown()
print(json.dumps(out))
"""

# An older daemon's plain routes (or a forced plain one), then a daemon with nexthops: the
# listing says which are in the other form, a put_all replaces them in place; then back.
HANDOVER = PRELUDE + """
dr.replace_all(routes, ifindex)
have, other, orphans = dr.listing()
out["before"] = [len(have), len(other), sorted(set(other.values()))]
out["put_refused"] = dr.put_all([(s, have[s]) for s in other], ifindex)
out["after"] = shown()
have, other, orphans = dr.listing()
out["after_listing"] = [len(have), len(other), len(orphans)]
"""

RESTART = PRELUDE + """
if sys.argv[1] == "put":
    dr.put_all(routes, ifindex)
    print(json.dumps(sorted(nexthops.table(dict).ids.values())))
else:
    dr.put_all(routes[:10], ifindex)    # a fresh process: takes the ids it finds
    tab = nexthops.table(dict)
    print(json.dumps([sorted(tab.ids.values()), len(json.loads(shown()["nh"])),
                      dr.listing()[2]]))
"""


@pytest.fixture
def netns():
    with veth_namespace("nexthops", "addr add 172.31.255.254/12 dev e0",
                        "addr add fd00:1::1/64 dev e0 nodad") as name:
        yield name


def run(netns, code: str, *args) -> dict:
    r = subprocess.run(ns.exec_argv(netns, python_argv(code) + list(args)), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def routes_of(shown: dict) -> list:
    return json.loads(shown["v4"]) + json.loads(shown["v6"])


def test_routes_by_nexthop_installed_listed_and_removed(netns):
    from dataplane.host import nexthops
    out = run(netns, NEXTHOPS)
    assert out["refused"] == [["10.9.0.0/24", "10.99.0.1", 101]]        # ENETUNREACH
    routes, nhs = routes_of(out["put"]), json.loads(out["put"]["nh"])
    assert len(routes) == 203 and len(nhs) == 203
    assert all(nexthops.ID_FIRST <= r["nhid"] <= nexthops.ID_LAST for r in routes), routes[:3]
    by_id = {nh["id"]: nh for nh in nhs}
    assert all(nh["protocol"] == "153" or nh["protocol"] == 153 for nh in nhs), nhs[:2]
    first = next(r for r in routes if r["dst"] == "10.1.0.0/24")
    assert by_id[first["nhid"]]["gateway"] == "172.16.0.1" and first["gateway"] == "172.16.0.1"
    six = next(r for r in routes if r["dst"] == "fc00:5:0:2::/64")
    assert by_id[six["nhid"]]["gateway"] == "fd00:1::c"
    have, other, orphans = out["listing"]
    assert len(have) == 203 and ["fc00:5:0:2::/64", "fd00:1::c"] in have
    assert other == 0 and orphans == []
    # without the gateway beside the id in the dump (nexthop_compat_mode off): the same
    assert out["listing_compat_off"] == have
    # a new gateway, a new id (not a replace of one in use); the old one went: the only orphan
    # is the nexthop of the route deleted by hand
    assert re.match(r"10.1.0.0/24 nhid (\d+) via 172.16.5.5 dev e0", out["moved"]), out["moved"]
    assert f"nhid {first['nhid']} " not in out["moved"]
    assert len(out["orphans"]) == 1
    # removed: each nexthop with its route; the orphan of the route deleted by hand stays
    # until a reconcile removes it
    assert out["removed_refused"] == []
    assert len(routes_of(out["removed"])) == 103 and len(json.loads(out["removed"]["nh"])) == 104
    assert out["orphans_refused"] == [] and len(json.loads(out["no_orphans"]["nh"])) == 103


def test_plain_routes_where_nexthops_are_off(netns):
    out = run(netns, PLAIN)
    assert out["refused"] == []
    routes = routes_of(out["put"])
    assert len(routes) == 203 and not any("nhid" in r for r in routes)
    assert json.loads(out["put"]["nh"] or "[]") == []
    assert out["listing"] == [203, 0]
    assert out["removed_refused"] == [] and routes_of(out["removed"]) == []


def test_plain_routes_of_an_older_daemon_replaced_in_place(netns):
    out = run(netns, HANDOVER + "print(json.dumps(out))\n")
    assert out["before"] == [203, 203, [0]]
    assert out["put_refused"] == []
    routes = routes_of(out["after"])
    assert len(routes) == 203 and all("nhid" in r for r in routes)      # one route a subnet
    assert out["after_listing"] == [203, 0, 0]


def test_a_restarted_process_finds_its_nexthops(netns):
    made = run(netns, RESTART, "put")
    ids, count, orphans = run(netns, RESTART, "again")
    assert ids == made and count == len(made) == 203 and orphans == []


def test_cleanup_steps_remove_both_forms(netns):
    """A plain route, routes by nexthop and an orphan nexthop: cleanup's steps remove all."""
    code = HANDOVER + """
dr.delete_all([routes[0][0]])
dr.replace_all(routes[:1], ifindex)             # one plain route among them
ip("route", "del", str(routes[1][0]), "proto", "153")         # an orphan nexthop
from types import SimpleNamespace
from dataplane.cli import cleanup
steps = cleanup._host_steps(SimpleNamespace(subnet_file="/nonexistent/subnet.env",
                                            status_socket=None, handover_socket=None))
out["steps"] = [what for what, _ in steps]
for _, action in steps:
    action()
out["left"] = shown()
print(json.dumps(out))
"""
    out = run(netns, code)
    steps = out["steps"]
    assert "ip route del 10.1.0.0/24 via 172.16.0.1 proto 153    # DirectRouting" in steps
    assert sum(s.startswith("ip route del") for s in steps) == 202
    assert sum(s.startswith("ip nexthop del id") for s in steps) == 203
    assert routes_of(out["left"]) == [] and json.loads(out["left"]["nh"] or "[]") == []


LOOKUP = """
import json, socket, subprocess
from ipaddress import IPv4Address
from dataplane.host import direct_routes as dr
for line in ("nexthop add id 7 via 192.168.9.7 dev e1",      # another program's, by id
             "route add 172.22.0.0/16 nhid 7",               # inside e0's prefix, via a gateway
             "nexthop add id 8 dev e0", "route add 10.200.0.0/16 nhid 8",   # on e0's link
             "nexthop add id 9 dev e1", "route add 10.201.0.0/16 nhid 9",   # another link
             "nexthop add id 10 blackhole", "route add 172.24.0.0/16 nhid 10"):
    subprocess.run(["ip"] + line.split(), check=True)
ifindex = socket.if_nametoindex("e0")
ips = [IPv4Address(a) + i for a in ("172.22.0.5", "10.200.0.5", "10.201.0.5", "172.24.0.5",
                                    "172.16.0.5") for i in range(10)]
out = {}
for mode in ("1", "0"):
    subprocess.run(["sysctl", "-qw", f"net.ipv4.nexthop_compat_mode={mode}"], check=True)
    out[mode] = [sorted(map(str, dr.on_link_all(ips, ifindex))),
                 sorted(str(ip) for ip in ips if dr.on_link(ip, ifindex))]
print(json.dumps(out))
"""


def test_on_the_link_past_other_programs_routes_by_nexthop(netns):
    """The on-link answers done in Python (host/route_lookup.py) read another program's routes
    by nexthop object as the kernel does, with the nexthop beside the id in the dump and without
    (net.ipv4.nexthop_compat_mode off)."""
    ns.run_ip(["-batch", "-"], netns=netns, input="addr add 192.168.9.1/24 dev e1\n")
    out = run(netns, LOOKUP)
    for mode in ("1", "0"):
        python, kernel = out[mode]
        assert python == kernel, (mode, python, kernel)
        assert "10.200.0.5" in python and "172.16.0.5" in python
        assert not {"172.22.0.5", "10.201.0.5", "172.24.0.5"} & set(python)
