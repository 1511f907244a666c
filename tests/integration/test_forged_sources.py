"""Forged datagrams from the underlay never reach the victim host's own sockets
(docs/threat-model.md), their outer and inner packets IPv4 or IPv6. Root, real etcd, both
engines.

::

      h0: the victim (daemon)     h1: its peer (daemon)       forger: no daemon
      flannel0 10.5.a.0           flannel0 10.5.b.0
               fc00:5:0:x::/128            fc00:5:0:y::/128    (a dual-stack config)
      cni0 10.5.a.1/24 (bridge), fc00:5:0:x::1/64
      and 172.31.9.1/32, fd31:9::1/128 (all added after the daemon started)
      veth 192.168.77.1           veth 192.168.77.2           veth 192.168.77.3
           fd00:99::1                  fd00:99::2                  fd00:99::3
           |                           |                           |
      -----+----------------- bridge, switch netns (etcd) ---------+------------

h0 and h1 have an IPv6 underlay too (their PublicIPv6s), so each daemon has a socket of each
family and h1's IPv6 traffic comes over the IPv6 one. The forger sends, from raw sockets, UDP
datagrams to h0:8285 of both underlays whose outer source is h1's PublicIP (192.168.77.2) or
PublicIPv6 (fd00:99::2) and whose inner packet is UDP to a socket on h0, with an inner source
that is h0's own: its underlay addresses, its flannel0 address, its bridge's address, a pod of
its own subnet; each case with an inner IPv4 packet and with an inner IPv6 one, from the same
kind of address of the other family, each over both underlays. None may arrive
(drop_inner_local counts each), while h1's real traffic of both families does. A datagram whose
outer source is no lease's PublicIP or PublicIPv6 (the forger's own) is dropped before its
inner packet is looked at (drop_bad_source). With --strict-sources, an inner source outside
h1's lease is dropped too (drop_inner_foreign), and so is one inside it that comes over the
underlay its route does not use; one inside it over the right underlay still arrives: a forged
PublicIP cannot be told from the real peer without cryptography (the limit the threat model
names).
"""
from __future__ import annotations

import ipaddress
import itertools
import subprocess
import sys
import time

import pytest

from tests.conftest import ENGINES, wait_until
from tests.integration.conftest import overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]

CONFIG = {"Network": "10.5.0.0/16", "EnableIPv6": True, "IPv6Network": "fc00:5::/56",
          "Backend": {"Type": "udp"}}
PORT = 7788                  # the victim's local UDP socket (bound to ::, both families)
LATE = "172.31.9.1"          # addresses the victim gets after its daemon started
LATE6 = "fd31:9::1"
N = 5                        # forged datagrams per inner source
GRACE_S = 0.5                # after the last datagram, before the listener stops, when some
                             # are to arrive

# In the victim: count the datagrams of either family that reach a socket on [::]:port until the
# caller closes stdin (bounded by a timeout), then print "<count> <source> <source> ..." (an
# IPv4 source as such, not IPv4-mapped).
LISTEN = r"""
import select, socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", int(sys.argv[1])))
print("listening", flush=True)
got = []
import time
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    r, _, _ = select.select([s, sys.stdin], [], [], 0.1)
    if s in r:
        data, addr = s.recvfrom(2000)
        got.append(addr[0].removeprefix("::ffff:"))
    if sys.stdin in r and not sys.stdin.readline():
        break
print(len(got), *got, flush=True)
"""

# In the forger: `count` datagrams per job "outer_src,outer_dst,inner_src,inner_dst", outer
# source forged, from raw sockets (IPPROTO_RAW: the header is ours in either family); the outer
# and the inner packet IPv4 or IPv6 by their addresses.
FORGE = r"""
import socket, sys, time
from dataplane.engine import ipv4, ipv6
dport, count = int(sys.argv[1]), int(sys.argv[2])
raw = {6: socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW),
       4: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)}
for job in sys.argv[3:]:
    outer_src, outer_dst, inner_src, inner_dst = job.split(",")
    for i in range(count):
        data = b"forged-%d" % i
        if ":" in inner_src:
            inner = ipv6.build(inner_src, inner_dst,
                               ipv6.udp_payload(inner_src, inner_dst, 5555, dport, data))
        else:
            inner = ipv4.build(inner_src, inner_dst, ipv4.udp_payload(5555, dport, data),
                               ident=100 + i)
        if ":" in outer_src:
            outer = ipv6.build(outer_src, outer_dst,
                               ipv6.udp_payload(outer_src, outer_dst, 8285, 8285, inner))
        else:
            outer = ipv4.build(outer_src, outer_dst, ipv4.udp_payload(8285, 8285, inner),
                               ident=200 + i)
        raw[6 if ":" in outer_src else 4].sendto(outer, (outer_dst, 0))
        time.sleep(0.002)
print("sent", count * len(sys.argv[3:]), flush=True)
"""

# In the real peer: ordinary datagrams through the overlay.
SEND = r"""
import socket, sys, time
dst, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET, socket.SOCK_DGRAM)
for i in range(count):
    s.sendto(b"real-%d" % i, (dst, port))
    time.sleep(0.01)
"""


@pytest.fixture(scope="module", params=ENGINES)
def ov(request):
    with pytest.MonkeyPatch.context() as mp:
        # send_real counts each family's datagrams exactly: no probes of the IPv6 underlay
        # beside them (docs/operating.md#ipv6-underlay-fallback), in the daemons started later too
        mp.setenv("FLANNELD_IPV6_UNDERLAY_FALLBACK", "false")
        yield from _overlay(request.param)


def _overlay(engine):
    for overlay in overlay_of(engine, [(engine, {"underlay6": True})] * 2, config=CONFIG,
                              ipv6=True):
        victim = overlay.hosts[0]
        # A bridge address in the own subnet, as a CNI bridge has (the daemon never
        # hears of it: the subnet rule covers it).
        overlay.exec(victim, ["ip", "link", "add", "cni0", "type", "bridge"]).check_returncode()
        for net in (overlay.subnet(victim), subnet6(overlay, victim)):
            overlay.exec(victim, ["ip", "addr", "add", f"{net.network_address + 1}/{net.prefixlen}",
                                  "dev", "cni0", *(["nodad"] if net.version == 6 else [])]
                         ).check_returncode()
        overlay.exec(victim, ["ip", "link", "set", "cni0", "up"]).check_returncode()
        # Outside the subnet: only the daemon's look at the host's addresses (each second)
        # covers them.
        for late in (f"{LATE}/32", f"{LATE6}/128"):
            overlay.exec(victim, ["ip", "addr", "add", late, "dev", "cni0"]).check_returncode()
        overlay.forger = overlay.tb.add_underlay6(overlay.tb.add_host("forger"))
        try:
            yield overlay
        finally:
            overlay.tb.remove_host(overlay.forger)


def subnet6(ov, host) -> ipaddress.IPv6Network:
    return ipaddress.IPv6Interface(ov.subnet_env(host)["FLANNEL_IPV6_SUBNET"]).network


def flannel_ip(ov, host, version: int) -> str:
    """The host's flannel0 address of one family: its lease part's network address."""
    return ov.flannel_ip(host) if version == 4 else str(subnet6(ov, host).network_address)


def counter(ov, host, reason: str) -> int:
    return int(ov.metrics(host).get(f'flannel_udp_drops_total{{reason="{reason}"}}', 0))


def arrivals(ov, victim, send, until=None) -> list[str]:
    """Runs send() while a socket on the victim listens; the sources of what arrived once
    until() holds (at most 5 s), or else once a grace period has passed. An until() that says
    every datagram sent has met its end (a drop counter up by as many) needs no grace: the
    engines count each datagram in one outcome, so a dropped one cannot arrive later."""
    listener = ov.tb.popen(victim, [sys.executable, "-c", LISTEN, str(PORT), "20"], text=True,
                           stdin=subprocess.PIPE)
    try:
        assert listener.stdout.readline().strip() == "listening"
        send()
        if until is not None:
            wait_until(until, 5.0, 0.05, "the victim to have handled what was sent")
        else:
            time.sleep(GRACE_S)
        out, _ = listener.communicate(input="", timeout=25)
    finally:
        ov.tb.kill(listener)
    count, *sources = out.split()
    assert int(count) == len(sources)
    return sources


def forge(ov, victim, pairs, n=N):
    """``n`` forged datagrams per (outer source, inner source) of ``pairs``, from the outer one
    to the victim's underlay address of its family, from the inner one to the victim's flannel0
    address of its family."""
    jobs = []
    for outer_src, inner_src in pairs:
        outer_dst = victim.ip6 if ":" in outer_src else victim.ip
        version = ipaddress.ip_address(inner_src).version
        jobs.append(f"{outer_src},{outer_dst},{inner_src},{flannel_ip(ov, victim, version)}")
    r = ov.tb.exec(ov.forger, [sys.executable, "-c", FORGE, str(PORT), str(n), *jobs],
                   timeout=20)
    assert r.returncode == 0 and r.stdout.split() == ["sent", str(n * len(jobs))], r.stderr


def send_real(ov, victim, peer, n=3):
    """``n`` datagrams of each family from the peer's flannel0 addresses; each family's goes
    over the underlay of that family: the peer's kernel counts the datagrams sent to flannel0
    and the engine's (a UDP_SEGMENT send counts once) in that family, none in the other."""
    for version in (4, 6):
        before = ov.tb.udp_out(peer)
        r = ov.exec(peer, [sys.executable, "-c", SEND, flannel_ip(ov, victim, version), str(PORT),
                           str(n)], timeout=20)
        assert r.returncode == 0, r.stderr
        v4, v6 = (b - a for b, a in zip(ov.tb.udp_out(peer), before))
        same, other = (v4, v6) if version == 4 else (v6, v4)
        assert same > n and other == 0, (version, v4, v6)


def real_sources(ov, peer, n=3) -> list[str]:
    """What send_real's datagrams arrive from: the peer's flannel0 addresses."""
    return [flannel_ip(ov, peer, 4)] * n + [flannel_ip(ov, peer, 6)] * n


def own_sources(ov, victim) -> dict[str, tuple]:
    """Each kind of the victim's own address, IPv4 and IPv6."""
    net, net6 = ov.subnet(victim), subnet6(ov, victim)
    return {"underlay": (victim.ip, victim.ip6),
            "flannel0": (str(net.network_address), str(net6.network_address)),
            "bridge": (str(net.network_address + 1), str(net6.network_address + 1)),
            "pod": (str(net.network_address + 9), str(net6.network_address + 9)),
            "added-later": (LATE, LATE6)}


def forged_drops(ov, victim, pairs, reason) -> tuple[list[str], int]:
    """N forged datagrams per (outer source, inner source): the sources of those that arrived,
    and how many the victim's engine counted in drop_<reason>."""
    before = counter(ov, victim, reason)
    want = before + N * len(pairs)
    got = arrivals(ov, victim, lambda: forge(ov, victim, pairs),
                   lambda: counter(ov, victim, reason) >= want)
    return got, counter(ov, victim, reason) - before


def every(outer_srcs, inner_srcs) -> list[tuple[str, str]]:
    """Each inner source forged from each outer one."""
    return list(itertools.product(outer_srcs, inner_srcs))


def public_ips(host) -> tuple[str, str]:
    """The host's underlay addresses, one per family: what a forger claims to be."""
    return host.ip, host.ip6


@pytest.mark.parametrize("which", ["underlay", "flannel0", "bridge", "pod", "added-later"])
def test_forged_own_source_never_arrives(ov, which, figure):
    victim, peer = ov.hosts[0], ov.hosts[1]
    inner_srcs = own_sources(ov, victim)[which]
    if which == "added-later":
        assert ov.wait_log(victim, LATE) and ov.wait_log(victim, LATE6), \
            "the daemon never noticed the new addresses"
    got, dropped = forged_drops(ov, victim, every(public_ips(peer), inner_srcs), "inner_local")
    sent = 2 * N * len(inner_srcs)
    figure(f"{ov.kind}: forged inner source {which} ({', '.join(inner_srcs)}) over both "
           "underlays: sent, arrived, drop_inner_local", f"{sent}, {len(got)}, {dropped}")
    assert got == [] and dropped == sent
    # flannel0 keeps accept_local (the engine's ICMP errors need it): the check makes it safe.
    r = ov.exec(victim, ["cat", "/proc/sys/net/ipv4/conf/flannel0/accept_local"])
    assert r.stdout.strip() == "1"


@pytest.mark.parametrize("version", [4, 6])
def test_forged_lease_holder_dropped_first(ov, version, figure):
    """The outer source is the forger's own, of either family, no lease's PublicIP or
    PublicIPv6: whatever the inner packet (here the real peer's flannel0 address, which would
    pass every later rule)."""
    victim, peer = ov.hosts[0], ov.hosts[1]
    inner = flannel_ip(ov, peer, version)
    got, dropped = forged_drops(ov, victim, every(public_ips(ov.forger), (inner,)), "bad_source")
    figure(f"{ov.kind}: outer source no lease's (IPv4, IPv6), inner IPv{version} from the peer: "
           "sent, arrived, drop_bad_source", f"{2 * N}, {len(got)}, {dropped}")
    assert got == [] and dropped == 2 * N


def test_real_peer_still_arrives(ov, figure):
    victim, peer = ov.hosts[0], ov.hosts[1]
    before = {r: counter(ov, victim, r) for r in ("inner_local", "inner_foreign", "bad_source")}
    got = arrivals(ov, victim, lambda: send_real(ov, victim, peer))
    figure(f"{ov.kind}: real peer datagrams, IPv4 and IPv6: sent, arrived", f"6, {len(got)}")
    assert sorted(got) == sorted(real_sources(ov, peer))
    assert {r: counter(ov, victim, r) for r in before} == before


def test_strict_sources_drops_what_is_not_the_senders(ov, figure):
    victim, peer = ov.hosts[0], ov.hosts[1]
    # in no lease, one of each family
    strays = (str(ipaddress.IPv4Network(CONFIG["Network"])[-10]),
              str(ipaddress.IPv6Network(CONFIG["IPv6Network"])[-10]))
    assert not any(ipaddress.ip_address(s) in n for s in strays
                   for n in (ov.subnet(peer), subnet6(ov, peer)))
    # Off (the default): forwarded, as flanneld does, over either underlay.
    got = arrivals(ov, victim, lambda: forge(ov, victim, every(public_ips(peer), strays)))
    assert sorted(got) == sorted(strays * 2 * N)
    ov.restart_daemon(victim, args=("--strict-sources",))
    try:
        got, dropped = forged_drops(ov, victim, every(public_ips(peer), strays), "inner_foreign")
        figure(f"{ov.kind}: --strict-sources, forged inner sources (IPv4, IPv6) outside the "
               "sender's lease, over both underlays: sent, arrived, drop_inner_foreign",
               f"{4 * N}, {len(got)}, {dropped}")
        assert got == [] and dropped == 4 * N
        # The limit: a source inside the forged peer's own lease is the peer's to send, over
        # the underlay its route takes (IPv4 for its subnet, IPv6 for its IPv6 part), but not
        # over the other one
        inside = (str(ov.subnet(peer).network_address + 7),
                  str(subnet6(ov, peer).network_address + 7))
        before = counter(ov, victim, "inner_foreign")
        got = arrivals(ov, victim, lambda: forge(ov, victim, every(public_ips(peer), inside)))
        wait_until(lambda: counter(ov, victim, "inner_foreign") >= before + 2 * N, 5.0, 0.05,
                   "the victim to have dropped the datagrams over the other underlay")
        dropped = counter(ov, victim, "inner_foreign") - before
        figure(f"{ov.kind}: --strict-sources, forged inner sources (IPv4, IPv6) inside the "
               "sender's lease, over both underlays: sent, arrived, drop_inner_foreign",
               f"{4 * N}, {len(got)}, {dropped}")
        assert sorted(got) == sorted(inside * N) and dropped == 2 * N
        got = arrivals(ov, victim, lambda: send_real(ov, victim, peer))
        assert sorted(got) == sorted(real_sources(ov, peer))
    finally:
        ov.restart_daemon(victim, args=())
