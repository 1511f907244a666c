"""Forged datagrams from the underlay never reach the victim host's own sockets
(docs/threat-model.md). Root, real etcd, both engines.

::

      h0: the victim (daemon)     h1: its peer (daemon)       forger: no daemon
      flannel0 10.5.a.0           flannel0 10.5.b.0
      cni0 10.5.a.1/24 (bridge)
      and 172.31.9.1/32 (both added after the daemon started)
      veth 192.168.77.1           veth 192.168.77.2           veth 192.168.77.3
           |                           |                           |
      -----+----------------- bridge, switch netns (etcd) ---------+------------

The forger sends, from a raw socket, UDP datagrams to h0:8285 whose outer source is h1's
PublicIP (192.168.77.2) and whose inner packet is UDP to a socket on h0, with an inner source
that is h0's own: its underlay address, its flannel0 address, its bridge's address, a pod of
its own subnet. None may arrive (drop_inner_local counts each), while h1's real traffic does.
With --strict-sources, an inner source outside h1's lease is dropped too (drop_inner_foreign);
one inside it still arrives: a forged PublicIP cannot be told from the real peer without
cryptography (the limit the threat model names).
"""
from __future__ import annotations

import ipaddress
import subprocess
import sys
import time

import pytest

from tests.conftest import ENGINES, wait_until
from tests.integration.conftest import overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]

PORT = 7788                  # the victim's local UDP socket (bound to 0.0.0.0)
LATE = "172.31.9.1"          # an address the victim gets after its daemon started
N = 5                        # forged datagrams per inner source
GRACE_S = 0.5                # after the last datagram, before the listener stops

# In the victim: count the datagrams that reach a socket on 0.0.0.0:port until the caller
# closes stdin (bounded by a timeout), then print "<count> <source> <source> ...".
LISTEN = r"""
import select, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
print("listening", flush=True)
got = []
import time
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    r, _, _ = select.select([s, sys.stdin], [], [], 0.1)
    if s in r:
        data, addr = s.recvfrom(2000)
        got.append(addr[0])
    if sys.stdin in r and not sys.stdin.readline():
        break
print(len(got), *got, flush=True)
"""

# In the forger: `count` datagrams, outer source forged, from a raw socket (IP_HDRINCL).
FORGE = r"""
import socket, sys, time
from dataplane.engine import ipv4
outer_src, outer_dst, inner_src, inner_dst, dport, count = sys.argv[1:7]
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for i in range(int(count)):
    inner = ipv4.build(inner_src, inner_dst, ipv4.udp_payload(5555, int(dport), b"forged-%d" % i),
                       ident=100 + i)
    outer = ipv4.build(outer_src, outer_dst, ipv4.udp_payload(8285, 8285, inner), ident=200 + i)
    s.sendto(outer, (outer_dst, 0))
    time.sleep(0.01)
print("sent", count, flush=True)
"""

# In the real peer: ordinary datagrams through the overlay.
SEND = r"""
import socket, sys, time
dst, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(count):
    s.sendto(b"real-%d" % i, (dst, port))
    time.sleep(0.01)
"""


@pytest.fixture(scope="module", params=ENGINES)
def ov(request):
    engine = request.param
    for overlay in overlay_of(engine, (engine, engine)):
        victim = overlay.hosts[0]
        # A bridge address in the own subnet, as a CNI bridge has (the daemon never
        # hears of it: the subnet rule covers it).
        bridge = f"{overlay.subnet(victim).network_address + 1}/{overlay.subnet(victim).prefixlen}"
        overlay.exec(victim, ["ip", "link", "add", "cni0", "type", "bridge"]).check_returncode()
        overlay.exec(victim, ["ip", "addr", "add", bridge, "dev", "cni0"]).check_returncode()
        overlay.exec(victim, ["ip", "link", "set", "cni0", "up"]).check_returncode()
        # Outside the subnet: only the daemon's look at the host's addresses (each second)
        # covers it.
        overlay.exec(victim, ["ip", "addr", "add", f"{LATE}/32", "dev", "cni0"]).check_returncode()
        overlay.forger = overlay.tb.add_host("forger")
        try:
            yield overlay
        finally:
            overlay.tb.remove_host(overlay.forger)


def counter(ov, host, reason: str) -> int:
    return int(ov.metrics(host).get(f'flannel_udp_drops_total{{reason="{reason}"}}', 0))


def arrivals(ov, victim, send, until=lambda: True) -> list[str]:
    """Runs send() while a socket on the victim listens; the sources of what arrived once
    until() holds (at most 5 s) and a grace period has passed."""
    listener = ov.tb.popen(victim, [sys.executable, "-c", LISTEN, str(PORT), "20"], text=True,
                           stdin=subprocess.PIPE)
    try:
        assert listener.stdout.readline().strip() == "listening"
        send()
        wait_until(until, 5.0, 0.05, "the victim to have handled what was sent")
        time.sleep(GRACE_S)
        out, _ = listener.communicate(input="", timeout=25)
    finally:
        ov.tb.kill(listener)
    count, *sources = out.split()
    assert int(count) == len(sources)
    return sources


def forge(ov, victim, peer, inner_src, n=N):
    r = ov.tb.exec(ov.forger, [sys.executable, "-c", FORGE, peer.ip, victim.ip, inner_src,
                               ov.flannel_ip(victim), str(PORT), str(n)], timeout=20)
    assert r.returncode == 0 and r.stdout.split() == ["sent", str(n)], r.stderr


def send_real(ov, victim, peer, n=3):
    r = ov.exec(peer, [sys.executable, "-c", SEND, ov.flannel_ip(victim), str(PORT), str(n)],
                timeout=20)
    assert r.returncode == 0, r.stderr


def own_sources(ov, victim) -> dict[str, str]:
    net = ov.subnet(victim)
    return {"underlay": victim.ip, "flannel0": str(net.network_address),
            "bridge": str(net.network_address + 1), "pod": str(net.network_address + 9),
            "added-later": LATE}


def forged_drops(ov, victim, peer, inner_src, reason) -> tuple[list[str], int]:
    """N forged datagrams: the sources of those that arrived, and how many the victim's
    engine counted in drop_<reason>."""
    before = counter(ov, victim, reason)
    got = arrivals(ov, victim, lambda: forge(ov, victim, peer, inner_src),
                   lambda: counter(ov, victim, reason) >= before + N)
    return got, counter(ov, victim, reason) - before


@pytest.mark.parametrize("which", ["underlay", "flannel0", "bridge", "pod", "added-later"])
def test_forged_own_source_never_arrives(ov, which, figure):
    victim, peer = ov.hosts[0], ov.hosts[1]
    inner_src = own_sources(ov, victim)[which]
    if which == "added-later":
        assert ov.wait_log(victim, LATE), "the daemon never noticed the new address"
    got, dropped = forged_drops(ov, victim, peer, inner_src, "inner_local")
    figure(f"{ov.kind}: forged inner source {which} ({inner_src}): sent, arrived, "
           "drop_inner_local", f"{N}, {len(got)}, {dropped}")
    assert got == [] and dropped == N
    # flannel0 keeps accept_local (the engine's ICMP errors need it): the check makes it safe.
    r = ov.exec(victim, ["cat", "/proc/sys/net/ipv4/conf/flannel0/accept_local"])
    assert r.stdout.strip() == "1"


def test_real_peer_still_arrives(ov, figure):
    victim, peer = ov.hosts[0], ov.hosts[1]
    before = {r: counter(ov, victim, r) for r in ("inner_local", "inner_foreign")}
    got = arrivals(ov, victim, lambda: send_real(ov, victim, peer))
    figure(f"{ov.kind}: real peer datagrams: sent, arrived", f"3, {len(got)}")
    assert got == [ov.flannel_ip(peer)] * 3
    assert {r: counter(ov, victim, r) for r in before} == before


def test_strict_sources_drops_what_is_not_the_senders(ov, figure):
    victim, peer = ov.hosts[0], ov.hosts[1]
    stray = str(ipaddress.IPv4Network("10.5.0.0/16")[-10])          # in no lease
    assert ipaddress.IPv4Address(stray) not in ov.subnet(peer)
    # Off (the default): forwarded, as flanneld does.
    got = arrivals(ov, victim, lambda: forge(ov, victim, peer, stray))
    assert got == [stray] * N
    ov.restart_daemon(victim, args=("--strict-sources",))
    try:
        got, dropped = forged_drops(ov, victim, peer, stray, "inner_foreign")
        figure(f"{ov.kind}: --strict-sources, forged inner source outside the sender's lease: "
               "sent, arrived, drop_inner_foreign", f"{N}, {len(got)}, {dropped}")
        assert got == [] and dropped == N
        # The limit: a source inside the forged peer's own lease is the peer's to send.
        inside = str(ov.subnet(peer).network_address + 7)
        got = arrivals(ov, victim, lambda: forge(ov, victim, peer, inside))
        figure(f"{ov.kind}: --strict-sources, forged inner source inside the sender's lease: "
               "sent, arrived", f"{N}, {len(got)}")
        assert got == [inside] * N
        got = arrivals(ov, victim, lambda: send_real(ov, victim, peer))
        assert got == [ov.flannel_ip(peer)] * 3
    finally:
        ov.restart_daemon(victim, args=())
