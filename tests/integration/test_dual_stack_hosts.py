"""Three dual-stack hosts, one of them behind a router, pods made by the real CNI plugins:
every pair of pods reaches the other over both families (issue 37, "measured, not assumed").
Both engines in each setup; the router's host runs each in turn. Every host has an IPv6 underlay
address too (its PublicIPv6), h2's one router away as its IPv4 one is. The config has
DirectRouting, so h0 and h1, on one link, route to each other directly, both families (IPv6 via
the PublicIPv6), while h2 is encapsulated from both: its pods' IPv4 over the IPv4 underlay, their
IPv6 over the IPv6 one, through the router.

::

      h0 (engine)              h1 (the other engine)       h2 (engine), behind the router
      pod p (bridge+host-local from subnet.env's two ranges, as flannel's CNI plugin delegates)
      cni0 10.66.a.1/24        cni0 10.66.b.1/24           cni0 10.66.c.1/24
           fc00:66:0:x::1/64        fc00:66:0:y::1/64           fc00:66:0:z::1/64
      flannel0, flannel-udp run --ip-masq on each host
      veth 192.168.77.1        veth 192.168.77.2           veth 192.168.79.3
           fd00:99::1               fd00:99::2                  fd00:79::3
           |                        |                           |
      -----+---- bridge, switch netns (etcd) ---- router netns --+-- its own link

Each host gives flannel0 its lease's IPv6 part's network address as a /128 and the route of the
IPv6Network, writes FLANNEL_IPV6_* into subnet.env as flanneld does and marks its lease value
`ForwardsIPv6` (control/lease.py). Each pod pings every other over IPv6 and IPv4 and sends one of
them 20 MiB over TCPv6, the hash compared at both ends, and the kernel's UDP counters of the
sending host say which way it went (none for the direct pair, IPv6 datagrams to and from h2);
the hosts ping each other's flannel0 over IPv6; then the plugins' DEL gives the addresses back.
The daemons run with --ip-masq as flannel's manifests run flanneld, so the bridge masquerades
nothing (FLANNEL_IPMASQ=true) and the pods' own addresses cross the overlay. A lease written as
flanneld's udp backend writes it (no mark) gets no IPv6 route.
"""
from __future__ import annotations

import ipaddress
import itertools
import json
import os
import time

import pytest

from dataplane.testbed import cni
from dataplane.testbed.wait import wait_for
from dataplane.testbed.overlay import parse_ping
from tests.conftest import require
from tests.integration.conftest import other_engine, overlay_of
from tests.integration.traffic import hashed_transfer

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.66.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:66::/56",
          "Backend": {"Type": "udp", "DirectRouting": True}}
NET6 = ipaddress.IPv6Network(CONFIG["IPv6Network"])
NBYTES = 20 << 20


@pytest.fixture
def ov(path_kind):
    require(cni.plugins_present(), f"needs the CNI plugins bridge and host-local in {cni.CNI_PATH} "
            "(apt-get install containernetworking-plugins)")
    # each daemon's PublicIPv6 is its veth's IPv6 underlay address (no --public-ipv6 needed)
    on = {"args": ("--ip-masq",), "underlay6": True}
    yield from overlay_of(path_kind, [
        {"engine": path_kind, **on},
        {"engine": other_engine(path_kind), **on},
        {"engine": path_kind, **on, "behind_router": True},
    ], config=CONFIG, ipv6=True)


def test_cni_pods_on_three_hosts_talk_over_both_families(ov, figure):
    h0, h1, h2 = ov.hosts[:3]
    # h2 is one router away: on none of the others' links, its lease names its own address
    assert ipaddress.ip_address(h2.ip) not in ipaddress.ip_network(f"{h0.ip}/24", strict=False)
    assert f"via {ov.tb.switch_ip} " in ov.exec(h0, ["ip", "route", "get", h2.ip]).stdout
    assert ov.leases()[ov.subnet(h2)] == h2.ip
    # and so is its IPv6 underlay address
    assert " via " in ov.exec(h0, ["ip", "-6", "route", "get", h2.ip6]).stdout
    # h0 and h1 route to each other directly, both families; to and from h2 nothing is direct
    for a, b in ((h0, h1), (h1, h0)):
        assert wait_for(lambda: direct_routes(ov, a).get(str(ov.subnet(b))) == b.ip
                        and direct_routes(ov, a, 6).get(str(subnet6(ov, b))) == b.ip6, 10), \
            (a.name, direct_routes(ov, a), direct_routes(ov, a, 6))
    assert not direct_routes(ov, h2) and not direct_routes(ov, h2, 6)
    assert not {str(ov.subnet(h2)), str(subnet6(ov, h2))} & \
        (direct_routes(ov, h0).keys() | direct_routes(ov, h0, 6).keys())

    for h in ov.hosts:
        env, six = ov.subnet_env(h), subnet6(ov, h)
        # flanneld's lines (docs/flannel-compat.md#subnet-env): the IPv6Network, the part + 1
        assert env["FLANNEL_IPV6_NETWORK"] == str(NET6)
        assert env["FLANNEL_IPV6_SUBNET"] == f"{six.network_address + 1}/64" and six.subnet_of(NET6)
        value = ov.etcdctl("get", "--prefix", f"{ov.prefix}/subnets/{ov.subnet(h).network_address}-",
                           "--print-value-only").stdout.strip()
        assert json.loads(value) == {"PublicIP": h.ip, "PublicIPv6": h.ip6, "DirectRouting": True,
                                     "ForwardsIPv6": True}
        addrs = ov.exec(h, ["ip", "-6", "-o", "addr", "show", "dev", "flannel0"]).stdout
        assert f"inet6 {six.network_address}/128" in addrs and "fe80" not in addrs, addrs
        route = ov.exec(h, ["ip", "-6", "route", "show", str(NET6)]).stdout
        assert "dev flannel0" in route, route
        mtu = int(ov.exec(h, ["cat", "/sys/class/net/flannel0/mtu"]).stdout)
        assert mtu == int(env["FLANNEL_MTU"]) >= 1280
        assert f"flannel0 carries IPv6: address {six.network_address}/128" in ov.daemon(h).log_text()

    pods = {}
    for h in ov.hosts:
        conf = cni.flannel_conf(ov.subnet_env(h), os.path.join(ov.tb.workdir, "cni", h.name))
        assert not conf["ipMasq"] and len(conf["ipam"]["ranges"]) == 2, conf
        pod = pods[h.name] = cni.add(ov.tb, h, "p", conf)
        env = ov.subnet_env(h)
        for version, key in ((4, "FLANNEL_SUBNET"), (6, "FLANNEL_IPV6_SUBNET")):
            assert ipaddress.ip_address(pod.ip(version)) in \
                ipaddress.ip_interface(env[key]).network, (pod.result, env)
            # as under flannel's own netconf (docs/flannel-compat.md#cni-plugin): the bridge,
            # subnet.env's address, is the pod's gateway to its network and its default route
            gateway = ipaddress.ip_interface(env[key]).ip
            routes = ov.tb.exec(pod.netns, ["ip", f"-{version}", "route"]).stdout
            network = env["FLANNEL_NETWORK" if version == 4 else "FLANNEL_IPV6_NETWORK"]
            assert f"{network} via {gateway} " in routes and f"default via {gateway} " in routes, \
                routes

    # every pair of pods, both families, and every pair of hosts to each other's flannel0 over
    # IPv6 (from flannel0's address through flannel0, from the veth's on the direct pair's
    # route), all at once: three replies each within 10 s. The first requests may be lost or
    # late (neighbour discovery on the way waits for the new bridges' IPv6 DAD), and the pings
    # wait for it together.
    def ping(where, dst, version):
        return ov.tb.popen(where, ["ping", f"-{version}", "-n", "-q", "-c", "3", "-i", "0.2",
                                   "-W", "2", "-w", "10", dst])
    kernel = 'flannel_udp_packets_total{datapath="kernel",path="%s"}'
    carried = (ov.metrics(h2).get(kernel % "udp_tx", 0), ov.tb.udp_out(h2)[1])
    pings = [(f"{a.host.name}'s pod -> {b.host.name}'s pod over IPv{version}",
              ping(a.netns, b.ip(version), version))
             for a, b in itertools.combinations(pods.values(), 2) for version in (6, 4)]
    pings += [(f"{a.name} -> {b.name}'s flannel0 over IPv6",
               ping(a.netns, str(subnet6(ov, b).network_address), 6))
              for a, b in itertools.combinations(ov.hosts, 2)]
    for what, proc in pings:
        out, _ = proc.communicate(timeout=20)
        got = parse_ping(out, proc.returncode)
        assert got["received"] >= 3, f"{what}: {got}"
    if ov.kind == "kernel":
        # h2's programs carried its replies, its pods' IPv4 over the IPv4 underlay (6) and
        # IPv6 over the IPv6 one (12: two pods' and two hosts' pings), and its engine sent
        # no IPv6 datagram for them
        m = ov.metrics(h2)
        assert m[kernel % "udp_tx"] - carried[0] >= 18 and m[kernel % "tun_tx"] >= 18, m
        assert ov.tb.udp_out(h2)[1] - carried[1] < 3, (carried, ov.tb.udp_out(h2))
    # 20 MiB over TCPv6 along every pair, each pod sending once and receiving once; the sending
    # host's UDP datagrams say the way: the direct pair's none (the kernel routes it), h2's
    # over the IPv6 underlay (a UDP_SEGMENT send counts once: a few hundred at least)
    for a, b in zip(pods.values(), list(pods.values())[1:] + list(pods.values())[:1]):
        way = "direct" if h2 not in (a.host, b.host) else "over the IPv6 underlay"
        before = ov.tb.udp_out(a.host)
        t0 = time.monotonic()
        hashed_transfer(ov.tb, a.netns, b.netns, b.ip(6), NBYTES)
        took = time.monotonic() - t0
        v4, v6 = (n - m for n, m in zip(ov.tb.udp_out(a.host), before))
        figure(f"{ov.kind}: {a.host.name} ({ov.daemon(a.host).engine}) -> {b.host.name} "
               f"({ov.daemon(b.host).engine}), h2 behind the router: 20 MiB over TCPv6, pod to "
               f"pod, {way}", f"{took:.2f} s, intact; UDP datagrams sent: {v4} IPv4, {v6} IPv6")
        assert v4 < 10 and (v6 < 10 if way == "direct" else v6 >= 200), (a.host.name, way, v4, v6)

    # A lease as flanneld's udp backend writes it (a dual-stack key, no mark): its IPv4 subnet is
    # a route, its IPv6 part none (flanneld would drop what we sent it).
    ov.put(f"{ov.prefix}/subnets/10.66.200.0-24&fc00:66:0:c8::-64",
           '{"PublicIP":"192.168.99.9","PublicIPv6":null}')

    for pod in pods.values():
        cni.delete(ov.tb, pod)
        assert cni.leased(pod.conf) == [], f"{pod.host.name}: host-local still holds addresses"
        links = ov.tb.exec(pod.netns, ["ip", "-o", "link", "show"]).stdout
        assert pod.ifname not in links, links
    assert ov.wait_log(h0, "its IPv6 part fc00:66:0:c8::/64 gets no route: the lease does not "
                           "say ForwardsIPv6")


def direct_routes(ov, host, version: int = 4) -> dict:
    """{subnet: gateway} of the host's direct routes of one family (the daemon's protocol,
    153)."""
    r = ov.exec(host, ["ip", f"-{version}", "-j", "route", "show", "proto", "153"])
    return {e["dst"]: e.get("gateway") for e in json.loads(r.stdout or "[]")}


def subnet6(ov, h) -> ipaddress.IPv6Network:
    return ipaddress.IPv6Interface(ov.subnet_env(h)["FLANNEL_IPV6_SUBNET"]).network
