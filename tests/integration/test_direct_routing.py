"""DirectRouting (control/direct.py, host/direct_routes.py) on simulated hosts, every path (each
engine alone, the kernel path):
the network config says ``"Backend": {"Type": "udp", "DirectRouting": true}``.

::

    h0 192.168.77.1 ---+--- h1 192.168.77.2     one link: direct routes both ways
                       |--- h3 192.168.77.4     a flanneld-like peer on the link: a lease with
                       |                        flanneld's value (no DirectRouting) and a
                       |                        `flannel-udp forward` that encapsulates all
                    switch (router)
                       |--- h2 192.168.78.3     behind the router: encapsulated

The config is dual stack (``EnableIPv6``), and each family is decided on its own: a peer's IPv6
part goes direct when its lease has a PublicIPv6 on the link (the hosts' leases get one here by
a rewrite of their value, as a daemon with an IPv6 address on its interface writes it), else
through flannel0 over the IPv4 underlay, whatever its IPv4 subnet does.

* h0 <-> h1: the kernel route ``<subnet> via <PublicIP> dev <veth> proto 153`` on both, pings
  both ways, and flannel0's counters on both stay still meanwhile; their leases have no
  PublicIPv6 yet: a pod's IPv6 goes through flannel0 while its IPv4 goes direct;
* h1 gets an IPv6 address on the link and a PublicIPv6 in its lease: h0, with no IPv6 prefix on
  the link, keeps encapsulating h1's IPv6 part until it gets one (within a second of the
  address); with both PublicIPv6s, ``<part> via <PublicIPv6> dev <veth> proto 153`` on both,
  the pods' IPv4 and IPv6 past flannel0;
* h2 and h3: no direct route, reachable through flannel0 both ways (its counters move);
* a handover of h0's daemon keeps its direct routes of both families;
* the host's routes change (a route to h1's PublicIP through the router appears on h0): h0
  sends h1's subnet through flannel0 within a second, and back when it goes;
* h1's lease moves (a new subnet): h0's direct route follows within a second of the new lease,
  the old IPv6 part's route goes;
* h1 moves behind the router (new PublicIP in its lease): h0 and h1 encapsulate to each other
  within a second of the lease, and still reach each other; h1 and h2, now on one link, route
  to each other directly;
* a stopped daemon leaves its direct routes; `flannel-udp cleanup` removes them, IPv6 too.
"""
from __future__ import annotations

import datetime
import ipaddress
import json
import re
import subprocess
import time

import pytest

from dataplane.host.child import cli_argv, python_argv
from dataplane.testbed import netns as ns
from dataplane.testbed.overlay import parse_ping
from tests.conftest import require_overlay, wait_until
from tests.integration.daemon_checks import lease_json

pytestmark = [pytest.mark.root, pytest.mark.etcd, pytest.mark.slow]

CONFIG = {"Network": "10.5.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:5::/56",
          "Backend": {"Type": "udp", "DirectRouting": True}}
FLANNELD_LIKE_SUBNET = "10.5.200.0/24"
SWITCH_S = 1.0          # the bound: a route follows a change within a second


@pytest.fixture
def ov(path_kind):
    require_overlay()
    from dataplane.testbed.overlay import Overlay
    overlay = Overlay(hosts=0, engine=path_kind, config=CONFIG, ipv6=True)
    try:
        yield overlay
    finally:
        overlay.close()


def direct_routes(ov, host, family: str = "-4") -> dict:
    """{subnet: gateway} of the host's proto 153 routes of one family (but blackholes)."""
    r = ov.exec(host, ["ip", family, "-j", "route", "show", "proto", "153"])
    return {e["dst"]: e.get("gateway") for e in json.loads(r.stdout or "[]")
            if e.get("type", "unicast") == "unicast"}


def direct_routes6(ov, host) -> dict:
    return direct_routes(ov, host, "-6")


def subnet6(ov, host) -> str:
    return str(ipaddress.IPv6Interface(ov.subnet_env(host)["FLANNEL_IPV6_SUBNET"]).network)


def add_ipv6(ov, host, addr: str) -> None:
    """An IPv6 address (and so its connected prefix) on the host's link."""
    ov.exec(host, ["ip", "addr", "add", addr, "dev", host.iface, "nodad"], check=True)


def give_public_ipv6(ov, host, public_ipv6: str) -> None:
    """The host's lease value with a PublicIPv6, as a daemon with an IPv6 address on its
    interface writes it; its etcd lease (TTL) kept."""
    net = ov.subnet(host)
    r = ov.etcdctl("get", "--prefix", f"{ov.prefix}/subnets/{net.network_address}-{net.prefixlen}")
    key, value = r.stdout.split("\n")[:2]
    doc = json.loads(value)
    doc["PublicIPv6"] = public_ipv6
    ov.etcdctl("put", "--ignore-lease", key, input=json.dumps(doc, separators=(",", ":")).encode())


def delete_lease(ov, net) -> None:
    """The lease of ``net`` (a dual-stack key names the IPv6 part after it)."""
    net = ipaddress.IPv4Network(net)
    ov.etcdctl("del", "--prefix", f"{ov.prefix}/subnets/{net.network_address}-{net.prefixlen}&")
    ov.delete_lease(net)


def add_pods(ov, host) -> dict:
    """Two workloads off ``host``, as the CNI plugin numbers them: {4: (netns, address), 6: ...}."""
    net, net6 = ov.subnet(host), ipaddress.IPv6Network(subnet6(ov, host))
    pods = {}
    for family, name, net in ((4, "q", net), (6, "p", net6)):
        gateway, addr = net.network_address + 1, net.network_address + 2
        pods[family] = (ov.tb.add_pod(host, name, f"{addr}/{net.prefixlen}", str(gateway)),
                        str(addr))
    return pods


def pod_ping(pod, dst: str, count: int = 3) -> int:
    """Echo replies from ``dst`` to ``pod`` (a netns) of ``count``."""
    r = subprocess.run(ns.exec_argv(pod, ["ping", "-n", "-q", "-c", str(count), "-i", "0.05",
                                          "-W", "1", "-w", "5", dst]),
                       capture_output=True, text=True, timeout=20)
    return parse_ping(r.stdout, r.returncode)["received"]


def tun_packets(ov, host) -> tuple[int, int]:
    r = ov.exec(host, ["ip", "-j", "-s", "link", "show", "flannel0"])
    stats = json.loads(r.stdout)[0]["stats64"]
    return stats["rx"]["packets"], stats["tx"]["packets"]


# a datapath's label in the host's sums (parse_metrics), and its path label of the datagrams
# received from peers: the kernel path's programs count those they deliver into flannel0
RECEIVED = (("", "udp_rx"), ('datapath="engine",', "udp_rx"), ('datapath="kernel",', "tun_tx"))


def udp_packets(ov, host) -> tuple[int, int]:
    """The packets sent to peers and received from them, by the engine and the kernel path's
    programs (flannel0's own counters also see the kernel's MLD reports on it once a host
    forwards IPv6)."""
    m = ov.metrics(host)       # the host's sums over queues and families (parse_metrics)
    return (int(sum(m.get(f'flannel_udp_packets_total{{{dp}path="udp_tx"}}', 0)
                    for dp, _ in RECEIVED)),
            int(sum(m.get(f'flannel_udp_packets_total{{{dp}path="{rx}"}}', 0)
                    for dp, rx in RECEIVED)))


def received_by_family(ov, host) -> dict:
    """The datagrams received from peers, by the inner packet's family (the kernel path's
    programs count both families as one, "all")."""
    m = ov.metrics(host)
    return {f: sum(m.get(f'flannel_udp_packets_total{{{dp}family="{f}",path="{rx}"}}', 0)
                   for dp, rx in RECEIVED)
            for f in ("ipv4", "ipv6", "all")}


def subnet(ov, host) -> str:
    return str(ov.subnet(host))


def last_lease_acquired(ov, host) -> float:
    """The wall-clock time of the host's last "Lease acquired" log line (its log spans
    restarts)."""
    found = re.findall(r"^(\d{4}-\d\d-\d\d \S+) \S+ \S+: Lease acquired",
                       ov.daemon(host).log_text(), re.M)
    return datetime.datetime.fromisoformat(found[-1]).timestamp()


def switched_within(ov, host, predicate, what: str) -> float:
    """Seconds until ``predicate()`` held (polled every 20 ms), asserted under SWITCH_S."""
    t0 = time.monotonic()
    wait_until(predicate, 10, 0.02, what)
    took = time.monotonic() - t0
    assert took <= SWITCH_S, f"{what} took {took:.2f} s"
    return took


def test_direct_on_the_link_encapsulated_otherwise(ov, path_kind, figure):
    h0 = ov.add_host(wait=False)
    h1 = ov.add_host(wait=False)
    h2 = ov.add_host(start=False)
    ov.tb.put_behind_router(h2)
    ov.start_daemon(h2, wait=False)
    # h3: flanneld's udp backend on the link, as far as h0 and h1 can tell: its lease value is
    # exactly flanneld's, its forwarder encapsulates everything
    h3 = ov.add_host(start=False)
    for h in (h0, h1, h2):
        ov.wait_ready(h)
    ov.put(f"subnets/{FLANNELD_LIKE_SUBNET.replace('/', '-')}", lease_json(h3.ip))
    from dataplane.testbed.forwarder import Forwarder
    fl = Forwarder(ov.tb, h3, tun_addr="10.5.200.0/32", engine=path_kind,
                   routes=[f"{subnet(ov, h)}={h.ip}" for h in (h0, h1, h2)]).wait_ready()
    try:
        s0, s1, s2 = subnet(ov, h0), subnet(ov, h1), subnet(ov, h2)
        wait_until(lambda: direct_routes(ov, h0) == {s1: h1.ip}
                   and direct_routes(ov, h1) == {s0: h0.ip}, 10, 0.05,
                   "h0 and h1 to route to each other directly, and to nobody else")
        assert direct_routes(ov, h2) == {}
        # h0 <-> h1: plain routed packets; flannel0 sees none of them
        before = tun_packets(ov, h0), tun_packets(ov, h1)
        for a, b in ((h0, h1), (h1, h0)):
            assert ov.ping(a, ov.flannel_ip(b), count=5, interval=0.05)["received"] == 5
        assert (tun_packets(ov, h0), tun_packets(ov, h1)) == before

        # IPv6: no PublicIPv6 in the leases, so the pods' IPv6 goes through flannel0 (the
        # engine routes the IPv6 part of a peer whose IPv4 goes direct) and their IPv4 not
        s6_0, s6_1 = subnet6(ov, h0), subnet6(ov, h1)
        pods0, pods1 = add_pods(ov, h0), add_pods(ov, h1)
        assert direct_routes6(ov, h0) == direct_routes6(ov, h1) == {}
        assert wait_until(lambda: pod_ping(pods0[6][0], pods1[6][1], 1), 10, 0.1,
                          "pod0 -> pod1 over IPv6 through flannel0")
        # h0 (its engine, or its programs) sees every encapsulated packet between the two: IPv6's, none of IPv4
        # (and its metrics say which family each was)
        counts, by_family = [udp_packets(ov, h0)], [received_by_family(ov, h0)]
        for family in (4, 6):
            assert pod_ping(pods0[family][0], pods1[family][1]) == 3
            assert pod_ping(pods1[family][0], pods0[family][1]) == 3
            counts.append(udp_packets(ov, h0))
        assert counts[1] == counts[0] and min(a - b for a, b in zip(counts[2], counts[1])) >= 6, \
            counts
        by_family.append(received_by_family(ov, h0))
        assert by_family[1]["ipv4"] == by_family[0]["ipv4"] and \
            by_family[1]["ipv6"] + by_family[1]["all"] - by_family[0]["ipv6"] - \
            by_family[0]["all"] >= 6, by_family
        assert f"its IPv6 part {s6_1} through flannel0: its lease has no PublicIPv6" \
            in ov.daemon(h0).log_text()

        # h1's PublicIPv6: h0 has no IPv6 prefix on the link, so h1's part stays in its engine
        # until an address of that prefix comes (the watch of the host's IPv6 addresses)
        add_ipv6(ov, h1, "fd77::2/64")
        give_public_ipv6(ov, h1, "fd77::2")
        assert ov.wait_log(h0, f"its IPv6 part {s6_1} through flannel0: its PublicIPv6 fd77::2 "
                               "is reached through a gateway")
        assert direct_routes6(ov, h0) == {}
        add_ipv6(ov, h0, "fd77::1/64")
        took6 = switched_within(ov, h0, lambda: direct_routes6(ov, h0) == {s6_1: "fd77::2"},
                                "h0 to route h1's IPv6 part directly once it has the prefix")
        give_public_ipv6(ov, h0, "fd77::1")
        wait_until(lambda: direct_routes6(ov, h1) == {s6_0: "fd77::1"}, 10, 0.05,
                   "h1 to route h0's IPv6 part directly")
        assert direct_routes(ov, h0) == {s1: h1.ip} and direct_routes(ov, h1) == {s0: h0.ip}
        route = ov.exec(h0, ["ip", "-6", "route", "show", s6_1]).stdout
        # by nexthop object where the kernel has them (host/nexthops.py): `nhid I` before it
        assert re.search(rf"^{re.escape(s6_1)} (nhid \d+ )?via fd77::2 dev {h0.iface} proto 153",
                         route, re.M), route
        # both families of the pods past flannel0, both ways
        before = udp_packets(ov, h0)
        for family in (4, 6):
            assert pod_ping(pods0[family][0], pods1[family][1]) == 3
            assert pod_ping(pods1[family][0], pods0[family][1]) == 3
        assert udp_packets(ov, h0) == before
        assert f"Subnet {s1}: its IPv6 part {s6_1} now a direct route via fd77::2" \
            in ov.daemon(h0).log_text()
        figure(f"{path_kind}: IPv6 prefix added -> IPv6 part direct", f"{took6 * 1000:.0f} ms")
        # h2 (behind the router) and h3 (no DirectRouting): through flannel0, both ways (sent
        # by the engine, or by the programs on flannel0's egress, before its counters)
        for a in (h0, h1):
            for b_ip in (ov.flannel_ip(h2), "10.5.200.0"):
                tx, _ = udp_packets(ov, a)
                assert ov.reachable(a, b_ip), f"{a.name} -> {b_ip}"
                assert udp_packets(ov, a)[0] > tx
        assert ov.reachable(h2, ov.flannel_ip(h0)) and ov.reachable(h2, ov.flannel_ip(h1))
        log0 = ov.daemon(h0).log_text()
        assert re.search(rf"Subnet added: {s1} via {h1.ip}, a direct route", log0), log0[-3000:]
        assert re.search(rf"Subnet added: {s2} via {h2.ip}:8285, encapsulated: its PublicIP "
                         rf"{h2.ip} is reached through a gateway", log0), log0[-3000:]
        assert re.search(rf"Subnet added: {FLANNELD_LIKE_SUBNET} via {h3.ip}:8285, "
                         "encapsulated: the peer does not route directly", log0), log0[-3000:]
        m = ov.metrics(h0)
        assert m['flannel_udp_peers_by_mode{mode="direct"}'] == 1
        assert m['flannel_udp_peers_by_mode{mode="encapsulated"}'] == 2
        assert m["flannel_udp_peers"] == 3
        # the IPv6 parts: h1's direct, h2's through flannel0; h3's lease has none
        assert m["flannel_udp_peers_ipv6"] == 2
        assert m['flannel_udp_peers_ipv6_by_mode{mode="direct"}'] == 1
        assert m['flannel_udp_peers_ipv6_by_mode{mode="encapsulated"}'] == 1

        # a handover (an upgrade in place): the new daemon takes the direct routes as they are
        ov.handover_daemon(h0)
        assert direct_routes(ov, h0) == {s1: h1.ip}
        assert direct_routes6(ov, h0) == {s6_1: "fd77::2"}
        assert ov.ping(h0, ov.flannel_ip(h1), count=3, interval=0.05)["received"] == 3
        assert ov.ping(h0, ov.flannel_ip(h2), count=3, interval=0.05)["received"] == 3
        assert pod_ping(pods0[6][0], pods1[6][1]) == 3

        # the host's routes change: h1's PublicIP through the router, then not
        ov.exec(h0, ["ip", "route", "add", f"{h1.ip}/32", "via", ov.tb.switch_ip], check=True)
        took = switched_within(ov, h0, lambda: s1 not in direct_routes(ov, h0),
                               "h0 to send h1's subnet through flannel0 again")
        ov.exec(h0, ["ip", "route", "del", f"{h1.ip}/32"], check=True)
        back = switched_within(ov, h0, lambda: direct_routes(ov, h0).get(s1) == h1.ip,
                               "h0 to route h1's subnet directly again")
        figure(f"{path_kind}: route change -> way switched", f"{took * 1000:.0f} ms, back "
                                                             f"{back * 1000:.0f} ms")

        # h1's lease moves to another subnet
        ov.stop_daemon(h1)
        delete_lease(ov, s1)
        # a subnet neither h1 nor h0 holds (their leases were random: either may be 10.5.77.0,
        # and h0's would make h1 take a random one again)
        held = {str(s1), str(subnet(ov, h0))}
        new = next(n for n in ("10.5.77.0/24", "10.5.78.0/24", "10.5.79.0/24") if n not in held)
        # and another IPv6 part: a random pick could be the old one again (1 in 100), whose
        # direct route would then rightly stay
        held6 = {str(s6_1), str(subnet6(ov, h0))}
        new6 = next(n for n in ("fc00:5:0:fe::/64", "fc00:5:0:fd::/64", "fc00:5:0:fc::/64")
                    if n not in held6)
        ov.prefer_subnet(h1, new, new6)
        ov.start_daemon(h1, wait=False)
        wait_until(lambda: direct_routes(ov, h0).get(new) == h1.ip, 15, 0.02,
                   lambda: f"h0 to route h1's new subnet directly: {direct_routes(ov, h0)}, "
                           f"{ov.leases()}, h1: {ov.daemon(h1).log_text()[-3000:]}")
        routed_at = time.time()
        # the old IPv6 part's route is gone with the old lease; the new part's follows h1's
        # PublicIPv6 (written again: its daemon wrote the new lease's value)
        wait_until(lambda: s6_1 not in direct_routes6(ov, h0), 10, 0.02,
                   "h0 to drop the direct route of h1's old IPv6 part")
        # h0 may see the lease before h1 has logged it: wait for h1's line of this lease
        wait_until(lambda: f"Lease acquired: {new}" in ov.daemon(h1).log_text(), 15, 0.02,
                   "h1 to log its new lease")
        moved = routed_at - last_lease_acquired(ov, h1)
        assert moved <= SWITCH_S, f"h0's route followed {moved:.2f} s after the lease"
        ov.wait_ready(h1)
        assert s1 not in direct_routes(ov, h0)
        assert ov.reachable(h0, ov.flannel_ip(h1)) and ov.reachable(h1, ov.flannel_ip(h0))
        give_public_ipv6(ov, h1, "fd77::2")
        s6_1 = subnet6(ov, h1)
        wait_until(lambda: direct_routes6(ov, h0) == {s6_1: "fd77::2"}, 10, 0.02,
                   "h0 to route h1's new IPv6 part directly")

        # h1 moves behind the router: the same subnet with a new PublicIP in its lease (its
        # old key deleted, as once its TTL ran out, so that it takes its subnet.env's back)
        s1 = subnet(ov, h1)
        ov.stop_daemon(h1)
        delete_lease(ov, s1)
        ov.tb.put_behind_router(h1)
        ov.start_daemon(h1)
        assert subnet(ov, h1) == s1
        took = switched_within(ov, h0, lambda: s1 not in direct_routes(ov, h0),
                               "h0 to encapsulate to h1 behind the router")
        # its lease has no PublicIPv6 now (nor the link an IPv6 address of it)
        wait_until(lambda: direct_routes6(ov, h0) == {}, 10, 0.02,
                   "h0 to encapsulate h1's IPv6 part behind the router")
        # and, on h2's link now, h1 and h2 route to each other directly
        wait_until(lambda: direct_routes(ov, h1) == {s2: h2.ip}
                   and direct_routes(ov, h2) == {s1: h1.ip}, 10, 0.05,
                   "h1 and h2, behind the router together, to route to each other directly")
        assert ov.reachable(h0, ov.flannel_ip(h1)) and ov.reachable(h1, ov.flannel_ip(h0))
        figure(f"{path_kind}: lease moved -> direct route", f"in place {moved:.2f} s after "
                                                             "the lease was acquired (at most)")

        # IPv6 on their link too: h2 routes h1's IPv6 part directly
        add_ipv6(ov, h1, "fd78::2/64")
        add_ipv6(ov, h2, "fd78::3/64")
        give_public_ipv6(ov, h1, "fd78::2")
        s6_1 = subnet6(ov, h1)
        wait_until(lambda: direct_routes6(ov, h2) == {s6_1: "fd78::2"}, 10, 0.05,
                   "h2 to route h1's IPv6 part directly")

        # a stopped daemon leaves its direct routes (they carry on, as flanneld's rules do);
        # `flannel-udp cleanup` removes them
        run_flags = ov.daemon_command(h2, path_kind)[1:]
        ov.stop_daemon(h2)
        assert direct_routes(ov, h2) == {s1: h1.ip}
        assert direct_routes6(ov, h2) == {s6_1: "fd78::2"}
        r = ov.exec(h2, cli_argv("cleanup", *run_flags, "--status-socket", ov.status_socket(h2),
                                 "--handover-socket", ov.handover_socket(h2)), timeout=60)
        assert r.returncode == 0 and f"ip route del {s1} via {h1.ip} proto 153" in r.stdout, \
            r.stdout + r.stderr
        assert f"ip route del {s6_1} via fd78::2 proto 153" in r.stdout, r.stdout
        assert direct_routes(ov, h2) == direct_routes6(ov, h2) == {}
    finally:
        fl.stop()


def test_deleting_a_direct_route_leaves_a_blackhole_of_the_same_prefix(testbed):
    """Both are ours (one protocol number): a lease that moved into the subnet a peer of the
    link held has its --ip-blackhole-route there, and the peer's stale direct route is deleted
    after. The delete must name its route type, or the kernel takes the blackhole."""
    h0, h1 = testbed.hosts
    code = ("import socket\n"
            "from ipaddress import IPv4Address, IPv4Network as N\n"
            "from dataplane.host import blackhole, direct_routes\n"
            f"direct_routes.replace(N('10.5.7.0/24'), IPv4Address('{h1.ip}'), "
            f"socket.if_nametoindex('{h0.iface}'))\n"
            "assert blackhole.add(N('10.5.7.0/24'))\n"
            "direct_routes.delete(N('10.5.7.0/24'))\n"
            "direct_routes.delete(N('10.5.7.0/24'))\n")
    r = h0.exec(python_argv(code))
    assert r.returncode == 0, r.stderr
    routes = h0.exec(["ip", "-4", "route", "show", "10.5.7.0/24", "table", "main"]).stdout
    assert routes.startswith("blackhole 10.5.7.0/24") and "via" not in routes, routes
