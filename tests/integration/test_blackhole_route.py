"""--ip-blackhole-route on simulated hosts (root, namespaces, real etcd and TUN), both engines::

      wa 10.5.a.2 ── h0 (engine E, the flag) ══ overlay ══ h1 (the other engine) ── wb 10.5.b.2
                     blackhole 10.5.a.0/24 proto 153 metric 4294967295

The daemon keeps ``blackhole <lease subnet>`` in the main table: added at start, put back within a
--iptables-resync period after it is deleted, left at exit and kept (not added twice) by the next
daemon (restarted, or taking over), moved with the lease, and removed by `flannel-udp cleanup`. Its
metric is the last one, so a workload's connected route of the same prefix (made after it, as a CNI
bridge's would be, or again after its link went down and up) wins, and the workloads of two hosts
with the flag still reach each other; an address of the subnet meets the blackhole instead of
flannel0 when no such route is there. Without the flag a host has none. The logic without a kernel:
tests/unit/test_blackhole_route.py.
"""
from __future__ import annotations

import ipaddress
import signal
import time

import pytest

from dataplane.control.lease import LeaseAttrs
from dataplane.daemon.status import query
from dataplane.demo import lab
from dataplane.host.blackhole import METRIC
from dataplane.host.child import cli_argv
from dataplane.host.direct_routes import PROTO
from dataplane.testbed.overlay import Overlay
from tests.conftest import require_overlay, wait_until
from tests.integration.conftest import other_engine

pytestmark = [pytest.mark.root, pytest.mark.etcd]

RESYNC_S = 2
FLAG = ("--ip-blackhole-route", "--iptables-resync", str(RESYNC_S))
TAKER = "192.168.77.99"       # a node that is no host here: it takes h0's subnet


def _overlay(engine_kind, h1_args):
    """h0 runs ``engine_kind`` with the flag, h1 the other engine with ``h1_args``."""
    require_overlay()
    overlay = Overlay(hosts=0, engine=engine_kind)
    try:
        overlay.add_host(engine=engine_kind, args=FLAG, wait=False)
        overlay.add_host(engine=other_engine(engine_kind), args=h1_args, wait=False)
        for h in overlay.hosts:
            overlay.wait_ready(h)
        yield overlay
    finally:
        overlay.close()


@pytest.fixture
def both(engine_kind):
    """Both hosts with the flag."""
    yield from _overlay(engine_kind, FLAG)


@pytest.fixture
def ov(engine_kind):
    """h1 without the flag."""
    yield from _overlay(engine_kind, ())


def blackholes(ov, host) -> list[tuple[ipaddress.IPv4Network, int, int]]:
    """The host's blackhole routes of the main table as the kernel lists them: (prefix, protocol,
    metric)."""
    out = []
    text = ov.exec(host, ["ip", "-4", "route", "show", "type", "blackhole"], check=True).stdout
    for line in text.splitlines():
        words = line.split()
        assert words[0] == "blackhole", line
        opts = dict(zip(words[2::2], words[3::2]))
        out.append((ipaddress.IPv4Network(words[1]), int(opts.get("proto", "0")),
                    int(opts.get("metric", "0"))))
    return sorted(out)


def route_get(ov, host, addr) -> str:
    """What the kernel does with a packet for ``addr`` (a blackhole answers EINVAL)."""
    r = ov.exec(host, ["ip", "-4", "route", "get", str(addr)])
    return r.stdout.strip() if r.returncode == 0 else f"error: {r.stderr.strip()}"


def pings(w, dst: str) -> bool:
    return w.run(["ping", "-n", "-q", "-c", "1", "-W", "1", dst]).returncode == 0


def test_kept_on_the_host_and_workloads_still_reach_each_other(both, engine_kind):
    ov = both
    h0, h1 = ov.hosts
    s0, s1 = ov.subnet(h0), ov.subnet(h1)
    d0 = ov.daemon(h0)
    ours = [(s0, PROTO, METRIC)]
    assert blackholes(ov, h0) == ours, d0.log_text()[-3000:]
    assert blackholes(ov, h1) == [(s1, PROTO, METRIC)]
    # an address of the subnet that nothing holds: dropped here, not sent into flannel0
    unheld = s0.network_address + 200
    assert "Invalid argument" in route_get(ov, h0, unheld)

    # workloads made after the blackhole, as a CNI bridge comes after flanneld: theirs wins
    workloads = []
    try:
        wa = lab.add_workload(ov, h0, "wa", ov.subnet_env(h0))
        workloads.append(wa)
        wb = lab.add_workload(ov, h1, "wb", ov.subnet_env(h1))
        workloads.append(wb)
        assert f"dev {wa.host_iface}" in route_get(ov, h0, wa.ip)
        wait_until(lambda: pings(wa, wb.ip) and pings(wb, wa.ip), timeout=10,
                   what="the workloads to reach each other")
        for src, dst in ((wa, wb), (wb, wa)):
            r = src.run(["ping", "-n", "-q", "-c", "5", "-i", "0.2", "-W", "1", dst.ip])
            assert " 5 received" in r.stdout, r.stdout
        # the whole subnet is the workloads' link's now (as a bridge's): nothing leaves the host
        assert f"dev {wa.host_iface}" in route_get(ov, h0, unheld)
        # their link down: the kernel drops its route and the blackhole takes the subnet; back
        # up, the route comes again after the blackhole and still wins (at flanneld's metric 0
        # the blackhole, there first, would win over it)
        ov.exec(h0, ["ip", "link", "set", wa.host_iface, "down"], check=True)
        assert "Invalid argument" in route_get(ov, h0, wa.ip)
        ov.exec(h0, ["ip", "link", "set", wa.host_iface, "up"], check=True)
        assert f"dev {wa.host_iface}" in route_get(ov, h0, wa.ip)
        wait_until(lambda: pings(wb, wa.ip), timeout=10, what="wb to reach wa once its link is up")

        # deleted by hand: back within a resync period, plus the daemon's tick (a second) and
        # some slack for a busy machine
        ov.exec(h0, ["ip", "route", "del", "blackhole", str(s0)], check=True)
        gone = time.monotonic()
        wait_until(lambda: blackholes(ov, h0) == ours, timeout=RESYNC_S + 4, interval=0.05,
                   what="the blackhole route to come back")
        assert time.monotonic() - gone <= RESYNC_S + 2
        # the line follows the route's add: with the Python engine in the same process, a loaded
        # machine can put a moment between them
        wait_until(lambda: "added it again" in d0.log_text(), timeout=5, what="the log line")

        # SIGTERM: it stays, and the log says how to remove it
        assert ov.stop_daemon(h0, sig=signal.SIGTERM) == 0
        assert blackholes(ov, h0) == ours
        assert f"ip route del blackhole {s0}" in d0.log_text()

        # the next daemon keeps it: one route, also after a resync period; so does one that
        # takes over (--handover), and the one it took over from says nothing of it at exit
        kept = "is in place already: kept"
        d0 = ov.start_daemon(h0, engine=engine_kind, args=FLAG)
        assert ov.subnet(h0) == s0
        time.sleep(RESYNC_S + 1)
        assert blackholes(ov, h0) == ours
        assert d0.log_text().count(kept) == 1
        d0, rc = ov.handover_daemon(h0)
        assert rc == 0
        time.sleep(RESYNC_S + 1)
        assert blackholes(ov, h0) == ours
        assert d0.log_text().count(kept) == 2           # one log file for the host's daemons
        assert d0.log_text().count(f"ip route del blackhole {s0}") == 1
        wait_until(lambda: pings(wb, wa.ip), timeout=10, what="wb to reach wa again")
    finally:
        for w in workloads:
            lab.remove_workload(w)


def test_follows_a_lease_move_and_leaves_none_on_the_old_subnet(ov):
    h0, h1 = ov.hosts
    old = ov.subnet(h0)
    assert blackholes(ov, h0) == [(old, PROTO, METRIC)]
    # without the flag: none, and an address of the subnet that nothing holds goes to flannel0
    assert blackholes(ov, h1) == []
    assert "dev flannel0" in route_get(ov, h1, ov.subnet(h1).network_address + 200)
    ov.put(f"subnets/{old.network_address}-{old.prefixlen}",
           LeaseAttrs(ipaddress.IPv4Address(TAKER)).to_json())
    wait_until(lambda: ov.subnet(h0) != old, timeout=15, what="subnet.env to name a new subnet")
    new = ov.subnet(h0)
    wait_until(lambda: blackholes(ov, h0) == [(new, PROTO, METRIC)], timeout=5,
               what=lambda: f"only the new subnet's blackhole: {blackholes(ov, h0)}")
    # the old subnet is the taker's now: h0 sends its traffic into the overlay, not into a hole
    assert "dev flannel0" in route_get(ov, h0, old.network_address + 5)
    assert "Invalid argument" in route_get(ov, h0, new.network_address + 5)
    # flannel0's own address is local (the local table comes first): still answered
    assert ov.reachable(h1, str(new.network_address), 10), ov.daemon(h0).log_text()[-4000:]
    assert "Removed the blackhole route of " + str(old) in ov.daemon(h0).log_text()
    # `flannel-udp status --json` says so; nothing on the host without the flag
    doc = query(ov.status_socket(h0))["blackhole_route"]
    assert doc["subnet"] == str(new) and doc["present"] and doc["stale"] == [], doc
    assert query(ov.status_socket(h1))["blackhole_route"] is None

    # the host leaves the overlay: `flannel-udp cleanup` lists it, then removes it
    assert ov.stop_daemon(h0) == 0
    assert blackholes(ov, h0) == [(new, PROTO, METRIC)]
    dry = cleanup(ov, h0, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"would: ip route del blackhole {new}" in dry.stdout, dry.stdout
    assert blackholes(ov, h0) == [(new, PROTO, METRIC)]
    done = cleanup(ov, h0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"done: ip route del blackhole {new}" in done.stdout, done.stdout
    assert blackholes(ov, h0) == []


def cleanup(ov, host, *args):
    """`flannel-udp cleanup` inside the host, with the daemon's command line and socket paths."""
    run_flags = ov.daemon_command(host, "c", FLAG)[1:]
    return ov.exec(host, cli_argv("cleanup", *run_flags, "--status-socket",
                                  ov.status_socket(host), "--handover-socket",
                                  ov.handover_socket(host), *args), timeout=60)
