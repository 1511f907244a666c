"""`flannel-udp run` on simulated hosts with a real etcd (root).

::

      h0 (engine E)          h1 (engine E)          h2 (the other engine)     h3/h4 join later
      flannel0 10.5.a.0      flannel0 10.5.b.0      flannel0 10.5.c.0
      veth 192.168.77.1      veth 192.168.77.2      veth 192.168.77.3
           |                      |                       |
      -----+------------- bridge, switch netns 192.168.77.254 (etcd) ---------------

One overlay per engine E (module-scoped, params c and python); h2 runs the other
engine so every run also checks that the two engines interoperate. Tests that
restart daemons put them back as they were.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import sys
import time

import pytest

from tests.conftest import ENGINES, wait_until
from tests.integration.conftest import other_engine, overlay_of, require_iperf3
from tests.integration.traffic import iperf3_server, udp_probe

pytestmark = [pytest.mark.root, pytest.mark.etcd]


@pytest.fixture(scope="module", params=ENGINES)
def ov(request):
    engine = request.param
    yield from overlay_of(engine, (engine, engine, other_engine(engine)))


def _all_pairs_reachable(ov, timeout=10.0):
    for a in ov.hosts:
        for b in ov.hosts:
            if a is not b:
                assert ov.reachable(a, ov.flannel_ip(b), timeout), \
                    f"{a.name} cannot reach {b.name} ({ov.flannel_ip(b)})"


def _joined(ov, new, timeout: float) -> None:
    """Every other host reaches ``new`` (the first ping within ``timeout`` s), and it reaches them."""
    for h in ov.hosts:
        if h is not new:
            assert ov.reachable(h, ov.flannel_ip(new), timeout), f"{h.name} cannot reach {new.name}"
            assert ov.reachable(new, ov.flannel_ip(h), 10)


# -- scripts run inside the namespaces --------------------------------------------------------

UDP_LISTEN = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.settimeout(float(sys.argv[2]))
print("listening", flush=True)
try:
    data, addr = s.recvfrom(2000)
    print("got", data.decode(errors="replace"), addr[0], flush=True)
except TimeoutError:
    print("nothing", flush=True)
"""

# A datagram for host `target` whose payload is an inner IPv4/UDP packet, sent from the
# switch namespace: its outer source (192.168.77.254) is no lease's PublicIP.
INJECT = r"""
import socket, struct, sys
inner_src, inner_dst, dport, target, tport, count = sys.argv[1:7]
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
payload = b"from-a-stranger"
udp = struct.pack("!HHHH", 5555, int(dport), 8 + len(payload), 0) + payload
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                 socket.inet_aton(inner_src), socket.inet_aton(inner_dst))
ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(count)):
    s.sendto(ip + udp, (target, int(tport)))
"""


def stranger_datagram_arrives(ov, host, inner_src) -> bool:
    """Send 3 datagrams from the switch (not a lease) to `host`; True if its UDP listener
    on the flannel0 side got one."""
    port = 7777
    listener = ov.tb.popen(host, [sys.executable, "-c", UDP_LISTEN, str(port), "3"], text=True)
    try:
        assert listener.stdout.readline().strip() == "listening"
        ov.tb.exec("switch", [sys.executable, "-c", INJECT, inner_src, ov.flannel_ip(host),
                              str(port), host.ip, "8285", "3"], timeout=15, check=True)
        out, _ = listener.communicate(timeout=15)
    finally:
        ov.tb.kill(listener)
    return out.startswith("got")


def flannel0_exists(ov, host) -> bool:
    return ov.exec(host, ["ip", "link", "show", "flannel0"]).returncode == 0


# -- the tests -------------------------------------------------------------------------------

def test_three_hosts_ping_each_other(ov, figure):
    _all_pairs_reachable(ov)
    rtts = []
    for a in ov.hosts:
        for b in ov.hosts:
            if a is not b:
                r = ov.ping(a, ov.flannel_ip(b), count=5, interval=0.05)
                assert r["received"] == 5, (a.name, b.name, r)
                rtts.append(r["rtt_avg_ms"])
    figure(f"{ov.kind}: ping rtt avg ms (all pairs)", round(sum(rtts) / len(rtts), 3))


@pytest.mark.parametrize("pair", [(0, 1), (0, 2)], ids=["same-engine", "c-python"])
def test_tcp_transfer_crosses(ov, pair, figure):
    require_iperf3()
    a, b = ov.hosts[pair[0]], ov.hosts[pair[1]]
    dst = ov.flannel_ip(b)
    with iperf3_server(ov.tb, b, dst):
        r = ov.exec(a, ["iperf3", "-c", dst, "-t", "2", "-J", "--connect-timeout", "3000"],
                    timeout=30)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    res = json.loads(r.stdout)["end"]
    received = res["sum_received"]["bytes"]
    assert received > 1_000_000, res
    figure(f"{ov.kind}: tcp {a.name}->{b.name} ({ov.daemon(a).engine}->{ov.daemon(b).engine}) "
           "Mbit/s", round(res["sum_received"]["bits_per_second"] / 1e6, 1))


def test_subnet_env_matches_flanneld_format(ov):
    for h in ov.hosts:
        with open(ov.daemon(h).subnet_file) as f:
            text = f.read()
        m = re.fullmatch(r"FLANNEL_NETWORK=10\.5\.0\.0/16\n"
                         r"FLANNEL_SUBNET=(10\.5\.\d+\.1)/24\n"
                         r"FLANNEL_MTU=1472\n"
                         r"FLANNEL_IPMASQ=false\n", text)
        assert m, text
        subnet = ipaddress.IPv4Interface(m.group(1) + "/24").network
        assert ov.leases()[subnet] == h.ip        # the lease in etcd is this host's
        # flannel0: <lease network>/32, MTU 1472, and the one kernel route
        addr = ov.exec(h, ["ip", "-o", "-4", "addr", "show", "dev", "flannel0"]).stdout
        assert f"inet {subnet.network_address}/32" in addr
        link = ov.exec(h, ["ip", "-o", "link", "show", "flannel0"]).stdout
        assert "mtu 1472" in link
        routes = ov.exec(h, ["ip", "route", "show", "dev", "flannel0"]).stdout
        assert "10.5.0.0/16" in routes


def test_healthz_and_metrics(ov):
    h = ov.hosts[0]
    assert ov.healthz(h) == (200, "flanneld is running")
    assert ov.healthz(h, "/nothing")[0] == 404
    ov.ping(h, ov.flannel_ip(ov.hosts[1]), count=2, interval=0.05)
    m = ov.metrics(h)
    assert m["flannel_udp_peers"] == len(ov.hosts) - 1
    assert m['flannel_udp_packets_total{path="udp_tx"}'] > 0
    assert m['flannel_udp_packets_total{path="tun_tx"}'] > 0
    assert 'flannel_udp_drops_total{reason="bad_source"}' in m
    assert m['flannel_udp_syscalls_total{kind="udp_sends"}'] > 0
    # the build and the standard process series, next to the daemon's own
    assert any(k.startswith("flannel_udp_build_info{") for k in m)
    assert m["process_open_fds"] > 0 and m["process_cpu_seconds_total"] > 0
    info = [k for k in m if k.startswith("flannel_udp_engine_info")]
    assert len(info) == 1 and f'engine="{ov.kind}"' in info[0]
    expiry = [v for k, v in m.items() if k.startswith("flannel_udp_lease_expiry_timestamp")]
    assert expiry and abs(expiry[0] - (time.time() + 86400)) < 3600


def test_no_lease_subnet_gets_icmp_net_unreachable(ov):
    h = ov.hosts[0]
    taken = set(ov.leases())
    free = next(n for n in ipaddress.IPv4Network("10.5.0.0/16").subnets(new_prefix=24)
                if n not in taken and n.network_address != ipaddress.IPv4Address("10.5.0.0"))
    before = ov.metrics(h)['flannel_udp_icmp_sent_total{type="net_unreachable"}']
    assert udp_probe(ov, h, str(free.network_address + 1)) == "ENETUNREACH"
    after = ov.metrics(h)['flannel_udp_icmp_sent_total{type="net_unreachable"}']
    assert after == before + 1
    # flanneld never answers ICMP with ICMP: a ping to the same place is just lost
    assert ov.ping(h, str(free.network_address + 1), count=1, wait=0.5)["received"] == 0


def test_accept_from_leases_drops_strangers_and_any_accepts(ov):
    h = ov.hosts[0]
    peer_net = ov.subnet(ov.hosts[1])
    inner_src = str(peer_net.network_address + 5)
    bad = 'flannel_udp_drops_total{reason="bad_source"}'
    before = ov.metrics(h)[bad]
    assert not stranger_datagram_arrives(ov, h, inner_src)
    assert ov.metrics(h)[bad] >= before + 3
    # the daemon said so, naming the flag that relaxes it
    wait_until(lambda: "--accept-from any" in ov.daemon(h).log_text(), 3, 0.2,
               "a log line naming --accept-from any")
    ov.restart_daemon(h, args=("--accept-from", "any"))
    try:
        assert stranger_datagram_arrives(ov, h, inner_src)
        assert ov.metrics(h)[bad] == 0
    finally:
        ov.restart_daemon(h, args=())
    _all_pairs_reachable(ov)


def test_sigterm_keeps_lease_and_restart_gets_same_subnet(ov):
    h = ov.hosts[1]
    subnet = ov.subnet(h)
    rc = ov.stop_daemon(h)
    assert rc == 0
    assert not flannel0_exists(ov, h)                               # TUN went with the fd
    assert "FLANNEL-FWD" in ov.exec(h, ["iptables-save"]).stdout      # rules kept, as flanneld
    assert ov.leases()[subnet] == h.ip                              # lease kept, as flanneld
    # Delete the lease too: only the subnet file can bring the same subnet back.
    ov.delete_lease(subnet)
    d = ov.start_daemon(h, engine=ov.kind)
    assert ov.subnet(h) == subnet
    assert "Found previously leased subnet" in d.log_text()
    _all_pairs_reachable(ov)


def test_sighup_and_revoked_lease_reacquire_without_dropping_peers(ov):
    h = ov.hosts[0]
    subnet = ov.subnet(h)
    peer = ov.flannel_ip(ov.hosts[1])
    d = ov.daemon(h)
    # Only a handled SIGHUP acquires the lease again: the daemon says it got the signal, finds
    # its lease by PublicIP and reports one more "Lease acquired". Ignoring the signal (or a
    # handler that does nothing) leaves the count as it was; the default action kills it.
    acquired = f"Lease acquired: {subnet} (PublicIP {h.ip})"
    before = d.log_text().count(acquired)
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: d.log_text().count(acquired) > before or not d.running(), 10,
               what="the lease acquired again after SIGHUP")
    log = d.log_text()
    assert d.running(), log[-3000:]
    assert log.count(acquired) == before + 1, log[-3000:]
    assert "Received SIGHUP: re-acquiring the lease (peers are kept)" in log
    assert f"Found lease (ip: {subnet} ipv6: ::/0) for current IP ({h.ip}), reusing" in log
    assert ov.subnet(h) == subnet and ov.leases()[subnet] == h.ip
    assert ov.metrics(h)["flannel_udp_peers"] == len(ov.hosts) - 1
    ov.delete_lease(subnet)                                 # revoked behind its back
    wait_until(lambda: ov.leases().get(subnet) == h.ip, 10, 0.2, "the revoked lease re-acquired")
    assert d.running()
    assert ov.ping(h, peer, count=3, interval=0.1)["received"] == 3


def test_host_joins_later_and_leaves(ov, figure):
    t0 = time.monotonic()
    new = ov.add_host(engine=ov.kind)
    ip = ov.flannel_ip(new)
    _joined(ov, new, 10)
    figure(f"{ov.kind}: new host reachable from all (s, from daemon start)",
           round(time.monotonic() - t0, 2))
    subnet = ov.subnet(new)
    h0 = ov.hosts[0]
    peers_before = ov.metrics(h0)["flannel_udp_peers"]
    assert ov.stop_daemon(new) == 0
    ov.delete_lease(subnet)                                 # the host leaves for good
    wait_until(lambda: ov.metrics(h0)["flannel_udp_peers"] == peers_before - 1, 5, 0.1,
               "the peer removed")
    assert udp_probe(ov, h0, ip) == "ENETUNREACH"           # route gone: no lease, no route
    assert f"Subnet removed: {subnet}" in ov.daemon(h0).log_text()
    ov.remove_host(new, delete_lease=False)


def test_ip_masq_rules_installed_kept_and_removed_when_turned_off(ov):
    h = ov.hosts[2]
    ov.restart_daemon(h, args=("-ip-masq", "-iptables-resync=1"))   # Go spelling
    try:
        jump = "-A POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG"
        rules = ov.exec(h, ["iptables-save", "-t", "nat"]).stdout
        net, sub = "10.5.0.0/16", str(ov.subnet(h))
        assert jump in rules
        assert f"-A FLANNEL-POSTRTG ! -s {net} -d {sub} " in rules
        assert ov.subnet_env(h)["FLANNEL_IPMASQ"] == "true"
        # someone flushes the jump: the resync puts it back
        ov.exec(h, ["iptables", "-t", "nat", "-D", "POSTROUTING", "-m", "comment", "--comment",
                    "flanneld masq", "-j", "FLANNEL-POSTRTG"], check=True)
        wait_until(lambda: jump in ov.exec(h, ["iptables-save", "-t", "nat"]).stdout, 5, 0.2,
                   "the resync to put the jump back")
    finally:
        ov.restart_daemon(h, args=())
    # kept at exit; the next start without --ip-masq removes them (subnet.env said it was on)
    assert "FLANNEL-POSTRTG" not in ov.exec(h, ["iptables-save", "-t", "nat"]).stdout


def test_etcd_outage_keeps_forwarding_and_late_joiner_arrives(ov, figure):
    a, b = ov.hosts[0], ov.hosts[1]
    count, interval = 130, 0.1                              # 13 s of pings
    ping = ov.tb.popen(a, ["ping", "-n", "-q", "-c", str(count), "-i", str(interval), "-W", "1",
                           ov.flannel_ip(b)], text=True)
    joiner = None
    try:
        time.sleep(1)
        ov.stop_etcd()
        t_stop = time.monotonic()
        joiner = ov.add_host(engine=other_engine(ov.kind), wait=False)   # joins while etcd is away
        time.sleep(max(0.0, 10 - (time.monotonic() - t_stop)))
        ov.start_etcd()
        t_back = time.monotonic()
        out, _ = ping.communicate(timeout=30)
    finally:
        ov.tb.kill(ping)
    from dataplane.testbed.overlay import parse_ping
    r = parse_ping(out)
    assert r["sent"] == count and r["received"] == count, out
    ov.wait_ready(joiner, timeout=30)
    _joined(ov, joiner, 20)
    figure(f"{ov.kind}: late joiner reachable after etcd back (s)",
           round(time.monotonic() - t_back, 2))
    ov.remove_host(joiner)



def _fifo_threads(pid: int) -> dict:
    """{thread id: SCHED_FIFO priority} of a process's real-time threads."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if os.sched_getscheduler(int(tid)) == os.SCHED_FIFO:
                out[int(tid)] = os.sched_getparam(int(tid)).sched_priority
        except OSError:
            continue
    return out


def test_realtime_priority_makes_only_the_loops_fifo(ov):
    h = ov.hosts[0]
    assert _fifo_threads(ov.daemon(h).pid) == {}
    ov.restart_daemon(h, args=("--realtime-priority", "2"))
    try:
        pid = ov.daemon(h).pid
        fifo = _fifo_threads(pid)
        # the engine loop threads (one per queue), at the priority asked; not the daemon's
        # main thread nor its control threads
        assert 1 <= len(fifo) <= 8 and set(fifo.values()) == {2}, fifo
        assert pid not in fifo and len(os.listdir(f"/proc/{pid}/task")) > len(fifo)
        _all_pairs_reachable(ov)
    finally:
        ov.restart_daemon(h, args=())


def _peer_watch_children(pid: int) -> list[int]:
    """The daemon's child processes named as control/peer_process.py names its child."""
    from dataplane.control.peer_process import CHILD_NAME
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            for child in map(int, f.read().split()):
                try:
                    with open(f"/proc/{child}/comm") as c:
                        if c.read().strip() == CHILD_NAME:
                            out.append(child)
                except (FileNotFoundError, ProcessLookupError):
                    pass            # gone meanwhile: a killed child's comm answers ESRCH
    return out


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"    # exited, not reaped yet
    except FileNotFoundError:
        return True


def test_peer_watch_process_with_the_python_engine_only(ov):
    """The Python engine's daemon watches peers in a child process (its interpreter stays free
    for forwarding), niced, replaced when it dies, ended with the daemon; the C engine's in a
    thread."""
    h = ov.hosts[0]
    pid = ov.daemon(h).pid
    kids = _peer_watch_children(pid)
    if ov.kind == "c":
        assert kids == []
        return
    assert len(kids) == 1 and os.getpriority(os.PRIO_PROCESS, kids[0]) == 10
    try:
        os.kill(kids[0], signal.SIGKILL)
        assert wait_until(lambda: _peer_watch_children(pid) not in ([], kids), timeout=10)
        assert ov.wait_log(h, "peer watch process exited (killed by SIGKILL)", 5)
        # The new one watches: a host that joins now is reachable, both ways.
        new = ov.add_host(engine=ov.kind)
        assert ov.reachable(h, ov.flannel_ip(new), 10) and ov.reachable(new, ov.flannel_ip(h), 10)
        ov.remove_host(new)
        # Killed with the daemon (SIGKILL: no shutdown of its own): the kernel closes the
        # daemon's end of the socket and the child ends.
        kids = _peer_watch_children(pid)
        ov.stop_daemon(h, sig=signal.SIGKILL)
        assert wait_until(lambda: all(_gone(k) for k in kids), timeout=10)
    finally:
        if h.name not in ov.daemons:
            ov.start_daemon(h)
    _all_pairs_reachable(ov)
