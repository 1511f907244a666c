"""The external address flanneld v0.28.9 would take, read from a real kernel in a network namespace
(docs/flannel-compat.md#interface): a DHCP-like address (with lifetimes, added first, so first in
kernel order) loses to a permanent one, a deprecated one (``preferred_lft 0``) is never taken.

Each selection runs in a child process inside the namespace, through the same NetlinkView the daemon
uses, so the flags are the kernel's own."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dataplane.host.iface import IFA_F_DEPRECATED, IFA_F_PERMANENT, IFA_F_SECONDARY
from dataplane.testbed import netns as ns
from tests.conftest import require_root

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# In the child: every link's addresses with their flags, and the outcome of each selection asked for.
CHILD = r"""
import json, sys
from dataplane.host.iface import IfaceError, NetlinkView, select_interface
asks = json.loads(sys.argv[1])
with NetlinkView() as v:
    links = {l.name: [[str(a.ip), a.flags] for a in l.addrs] for l in v.links()}
out = []
for kw in asks:
    try:
        e = select_interface(**kw)
        out.append({"name": e.name, "addr": str(e.iface_addr), "ext": str(e.ext_addr)})
    except IfaceError as err:
        out.append({"error": str(err)})
print(json.dumps({"links": links, "picks": out}))
"""


@pytest.fixture
def host():
    """A namespace with three veths to a peer namespace, named (host netns, [veth names]);
    both namespaces are deleted after, also when the test fails."""
    require_root()
    ns.sweep_stale()
    run = ns.new_run_id()
    here, peer = ns.ns_name(run, "addr"), ns.ns_name(run, "peer")
    tag = ns.short_id(run)
    devs = [f"fu{tag}a{i}" for i in range(3)]
    try:
        ns.create(here)
        ns.create(peer)
        for i, dev in enumerate(devs):
            ns.run_ip(["link", "add", dev, "type", "veth", "peer", "name", f"fu{tag}p{i}",
                       "netns", peer], netns=here)
            ns.run_ip(["link", "set", dev, "up"], netns=here)
            ns.run_ip(["link", "set", f"fu{tag}p{i}", "up"], netns=peer)
        yield here, devs
    finally:
        ns.delete(here)
        ns.delete(peer)


def addr_add(netns: str, dev: str, cidr: str, *lifetimes: str) -> None:
    ns.run_ip(["addr", "add", cidr, "dev", dev, *lifetimes], netns=netns)


def select_in(netns: str, asks: list[dict]) -> dict:
    r = subprocess.run(ns.exec_argv(netns, [sys.executable, "-c", CHILD, json.dumps(asks)]),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_permanent_address_wins_over_dhcp_one_and_deprecated_is_skipped(host):
    netns, (a0, a1, a2) = host
    dhcp = ("valid_lft", "3600", "preferred_lft", "3600")
    # a0: the DHCP-like address first, the static one second, in another subnet
    addr_add(netns, a0, "10.61.1.5/24", *dhcp)
    addr_add(netns, a0, "10.61.2.5/24")
    ns.run_ip(["route", "add", "default", "via", "10.61.1.1", "dev", a0], netns=netns)
    # a1: a deprecated address first (permanent too, so only "deprecated" keeps it out), then a
    # DHCP-like one
    addr_add(netns, a1, "10.62.1.5/24", "preferred_lft", "0")
    addr_add(netns, a1, "10.62.2.5/24", *dhcp)
    # a2: DHCP-like first, then a static one in the same subnet, which the kernel marks secondary
    addr_add(netns, a2, "10.63.1.5/24", *dhcp)
    addr_add(netns, a2, "10.63.1.6/24")

    got = select_in(netns, [
        {},                                       # the default route's interface
        {"ifaces": [a0]}, {"regexes": [f"^{a0}$"]}, {"regexes": [r"^10\.61\."]},
        {"ifaces": [a1]}, {"regexes": [r"^10\.62\.1\."]}, {"ifaces": ["10.62.1.5"]},
        {"ifaces": [a2]},
        {"ifaces": ["10.61.1.5"]},                # an address given as IP is kept as it is
    ])
    flags = {ip: f for dev in (a0, a1, a2) for ip, f in got["links"][dev]}
    # what the kernel says, in the order it says it: the premises of the picks below
    assert [ip for ip, _ in got["links"][a0]] == ["10.61.1.5", "10.61.2.5"]
    assert not flags["10.61.1.5"] & IFA_F_PERMANENT and flags["10.61.2.5"] & IFA_F_PERMANENT
    assert flags["10.62.1.5"] & IFA_F_DEPRECATED and flags["10.62.1.5"] & IFA_F_PERMANENT
    assert not flags["10.62.2.5"] & (IFA_F_PERMANENT | IFA_F_DEPRECATED)
    assert [ip for ip, _ in got["links"][a1]] == ["10.62.1.5", "10.62.2.5"]
    assert flags["10.63.1.6"] & IFA_F_SECONDARY and flags["10.63.1.6"] & IFA_F_PERMANENT

    picks = [(p.get("name"), p.get("addr"), p.get("error")) for p in got["picks"]]
    assert picks[0] == (a0, "10.61.2.5", None)
    assert got["picks"][0]["ext"] == "10.61.2.5"            # the lease's PublicIP
    assert picks[1] == picks[2] == (a0, "10.61.2.5", None)
    assert picks[3] == (a0, "10.61.2.5", None)              # matched in preference order
    assert picks[4] == (a1, "10.62.2.5", None)
    assert picks[5][2] and "could not match pattern" in picks[5][2]   # deprecated: no candidate
    assert picks[6] == (a1, "10.62.1.5", None)              # named by IP: taken whatever its flags
    assert picks[7] == (a2, "10.63.1.6", None)
    assert picks[8] == (a0, "10.61.1.5", None)


def test_only_deprecated_address_is_no_address(host):
    netns, (a0, _, _) = host
    addr_add(netns, a0, "10.64.1.5/24", "preferred_lft", "0")
    got = select_in(netns, [{"ifaces": [a0]}])
    assert got["links"][a0][0][1] & IFA_F_DEPRECATED
    assert f"failed to find an IPv4 address for interface {a0}" in got["picks"][0]["error"]
