"""A short-lived second key for a host's subnet, or for its IPv6 part, cuts nothing (issue 44).

A dual-stack pair, A (the engine under test) and B (the other engine), each with an IPv6 underlay
address. A stray key is put and deleted 2 s later, as a lost dual-key race leaves one behind for a
moment when two hosts start together, or as an operator's stray `etcdctl put` does:

  1. B's IPv4 subnet with another IPv6 part and another PublicIP;
  2. B's IPv6 part with another IPv4 subnet and another PublicIP.

B's key was created first, so it holds both its parts (control/peers.py: the key with the lowest
create revision holds a subnet or a part); the stray key is a conflict, logged once and counted,
and neither its put nor its delete moves a route: the engines' route tables are not swapped once
on either host, and afterwards every ping, A to B and B to A, IPv4 and IPv6, gets through. Before
the rule the peers' table was kept by subnet: the put replaced B's lease and the delete removed
B's subnet (case 1: 0 of 4 pings; case 2: the 2 IPv6 pings lost) until B's next renewal. A
daemon started while the first stray key is there routes to B as well (its first list).
"""
from __future__ import annotations

import ipaddress
import os
import time

import pytest

from dataplane.testbed.wait import wait_for
from dataplane.testbed.overlay import parse_ping
from tests.integration.conftest import other_engine, overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.66.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:66::/56",
          "Backend": {"Type": "udp"}}
STRAY_IP = "192.168.77.66"          # on the underlay's link, no host: what goes there is lost
STRAY_VALUE = '{"PublicIP":"%s","PublicIPv6":null,"ForwardsIPv6":true}' % STRAY_IP
SWAPS = "flannel_udp_route_swaps_total"


@pytest.fixture
def ov(engine_kind):
    yield from overlay_of(engine_kind, ((kind, {"underlay6": True})
                                        for kind in (engine_kind, other_engine(engine_kind))),
                          config=CONFIG, ipv6=True)


def subnet6(ov, h) -> ipaddress.IPv6Network:
    return ipaddress.IPv6Interface(ov.subnet_env(h)["FLANNEL_IPV6_SUBNET"]).network


def key_of(ov, net: ipaddress.IPv4Network, net6: ipaddress.IPv6Network) -> str:
    return (f"{ov.prefix}/subnets/{net.network_address}-{net.prefixlen}"
            f"&{net6.network_address}-{net6.prefixlen}")


def pings(ov) -> dict:
    """Each host to the other's flannel0, over IPv4 and IPv6, all at once: {what: replies of 3}."""
    a, b = ov.hosts
    procs = {}
    for src, dst in ((a, b), (b, a)):
        for version, addr in ((4, ov.subnet(dst).network_address),
                              (6, subnet6(ov, dst).network_address)):
            procs[f"{src.name}->{dst.name} IPv{version}"] = ov.tb.popen(
                src, ["ping", f"-{version}", "-n", "-q", "-c", "3", "-i", "0.2", "-W", "1",
                      "-w", "5", str(addr)])
    out = {}
    for what, proc in procs.items():
        stdout, _ = proc.communicate(timeout=20)
        out[what] = parse_ping(stdout, proc.returncode)["received"]
    return out


def test_a_stray_key_put_and_deleted_moves_no_route(ov):
    a, b = ov.hosts
    b_net, b_net6 = ov.subnet(b), subnet6(ov, b)
    b_key = key_of(ov, b_net, b_net6)
    assert wait_for(lambda: all(n == 3 for n in pings(ov).values()), 15, interval=0.5), pings(ov)
    before = {h.name: ov.metrics(h) for h in (a, b)}
    other = next(n for n in ipaddress.IPv4Network(CONFIG["Network"]).subnets(new_prefix=24)
                 if n.network_address.packed[2] >= 200 and n not in (ov.subnet(a), b_net))
    strays = {"B's IPv4 subnet, another IPv6 part": key_of(ov, b_net, ipaddress.IPv6Network(
                  "fc00:66:0:ee::/64")),
              "B's IPv6 part, another IPv4 subnet": key_of(ov, other, b_net6)}
    for what, stray in strays.items():
        ov.put(stray, STRAY_VALUE)
        time.sleep(2)
        ov.etcdctl("del", stray)
        time.sleep(1)
        got = pings(ov)
        assert all(n == 3 for n in got.values()), (what, got)
        # each host said it once, with the key to delete, and it is no conflict any more
        for h in (a, b):
            said = ov.daemon(h).log_text().count(f"Skipping subnet lease {stray}")
            assert said == 1, (what, h.name, said)
    for h in (a, b):
        after = ov.metrics(h)
        assert wait_for(lambda: ov.metrics(h).get("flannel_udp_bad_leases") == 0, 5), h.name
        # not one route table handed to the engines: nothing routed moved, either family
        assert after.get(SWAPS) == before[h.name].get(SWAPS), (h.name, before[h.name].get(SWAPS),
                                                              after.get(SWAPS))
        assert after["flannel_udp_bad_leases_seen_total"] - \
            before[h.name]["flannel_udp_bad_leases_seen_total"] == 2, h.name
        assert after["flannel_udp_peers"] == 1 and after["flannel_udp_peers_ipv6"] == 1
    # B kept its own key all along (not lost, not taken again)
    assert ov.etcdctl("get", b_key, "--print-value-only").stdout.strip()
    assert before[b.name].get("flannel_udp_lease_reacquisitions_total", 0) == \
        ov.metrics(b).get("flannel_udp_lease_reacquisitions_total", 0)

    # A daemon starting while a stray key is there decides alike from its first list (B's IPv6
    # part is among the first hundred, so its key sorts before the stray's: a list read in
    # order would end on the stray)
    stray = strays["B's IPv4 subnet, another IPv6 part"]
    ov.put(stray, STRAY_VALUE)
    engine = ov.daemon(a).engine
    ov.stop_daemon(a)
    with open(os.path.join(ov.tb.workdir, a.name, "daemon.log"), errors="replace") as f:
        said_before = f.read().count(f"Skipping subnet lease {stray}")
    ov.start_daemon(a, engine=engine)
    got = pings(ov)
    assert all(n == 3 for n in got.values()), ("A restarted beside the stray key", got)
    assert ov.daemon(a).log_text().count(f"Skipping subnet lease {stray}") == said_before + 1
