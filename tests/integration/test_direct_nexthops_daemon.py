"""DirectRouting's two forms of route with real daemons (host/nexthops.py): two hosts on one
link, DirectRouting on, every path (each engine alone, the kernel path).

* h0 starts with the plain form forced (``FLANNEL_UDP_DIRECT_PLAIN=1``, as on a kernel without
  nexthop objects): its route to h1 is ``<subnet> via <PublicIP>``, no nexthop object of ours;
  h1's to h0 is ``<subnet> nhid I`` with ``id I via <PublicIP> proto 153``; each log says which;
  pings cross both ways past flannel0;
* a handover of h0 to a daemon with nexthop objects: the plain route is replaced in place by one
  by nexthop (one route of that subnet), before READY;
* a restart of h0 with the plain form again: the route plain again, the nexthop gone;
* h0's lease deleted: h1's route and its nexthop both go;
* h0 stopped with a plain route and h1 stopped with one by nexthop: `flannel-udp cleanup`
  removes both forms.
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from dataplane.host.child import cli_argv
from dataplane.host.nexthops import FORCE_PLAIN_ENV, ID_FIRST, ID_LAST
from tests.conftest import require_overlay, wait_until

pytestmark = [pytest.mark.root, pytest.mark.etcd, pytest.mark.slow]

CONFIG = {"Network": "10.5.0.0/16", "Backend": {"Type": "udp", "DirectRouting": True}}
PLAIN = {FORCE_PLAIN_ENV: "1"}


@pytest.fixture
def ov(path_kind):
    require_overlay()
    from dataplane.testbed.overlay import Overlay
    overlay = Overlay(hosts=0, engine=path_kind, config=CONFIG)
    try:
        yield overlay
    finally:
        overlay.close()


def routes(ov, host) -> dict:
    """{subnet: (gateway, nhid or None)} of the host's proto 153 unicast routes."""
    r = ov.exec(host, ["ip", "-4", "-j", "route", "show", "proto", "153"], check=True)
    return {e["dst"]: (e.get("gateway"), e.get("nhid")) for e in json.loads(r.stdout or "[]")
            if e.get("type", "unicast") == "unicast"}


def nexthops(ov, host) -> dict:
    """{id: gateway} of the host's proto 153 nexthop objects."""
    r = ov.exec(host, ["ip", "-j", "nexthop", "show", "proto", "153"], check=True)
    return {e["id"]: e.get("gateway") for e in json.loads(r.stdout or "[]")}


def by_nexthop(ov, host, subnet: str, gateway: str) -> bool:
    route = routes(ov, host)
    if set(route) != {subnet}:
        return False
    gw, nhid = route[subnet]
    return gw == gateway and nhid is not None and nexthops(ov, host) == {nhid: gateway} \
        and ID_FIRST <= nhid <= ID_LAST


def plain(ov, host, subnet: str, gateway: str) -> bool:
    return routes(ov, host) == {subnet: (gateway, None)} and nexthops(ov, host) == {}


def test_both_forms_handover_restart_removal_and_cleanup(ov, path_kind):
    h0 = ov.add_host(start=False)
    ov.start_daemon(h0, env=PLAIN, wait=False)
    h1 = ov.add_host(wait=False)
    ov.wait_ready(h0)
    ov.wait_ready(h1)
    s0, s1 = str(ov.subnet(h0)), str(ov.subnet(h1))
    wait_until(lambda: plain(ov, h0, s1, h1.ip) and by_nexthop(ov, h1, s0, h0.ip), 10, 0.05,
               lambda: f"h0's plain route, h1's by nexthop: {routes(ov, h0)} "
                       f"{routes(ov, h1)} {nexthops(ov, h1)}")
    assert f"plain routes ({FORCE_PLAIN_ENV} is set)" in ov.daemon(h0).log_text()
    assert "DirectRouting's routes: by nexthop objects" in ov.daemon(h1).log_text()
    for a, b in ((h0, h1), (h1, h0)):
        assert ov.ping(a, ov.flannel_ip(b), count=3, interval=0.05)["received"] == 3

    # a handover to a daemon with nexthop objects: in place, before it is READY
    ov.handover_daemon(h0)
    assert by_nexthop(ov, h0, s1, h1.ip), (routes(ov, h0), nexthops(ov, h0))
    assert ov.ping(h0, ov.flannel_ip(h1), count=3, interval=0.05)["received"] == 3

    # and back to the plain form: the nexthop, an orphan now, goes too
    ov.stop_daemon(h0)
    ov.start_daemon(h0, env=PLAIN)
    assert plain(ov, h0, s1, h1.ip), (routes(ov, h0), nexthops(ov, h0))
    assert ov.ping(h0, ov.flannel_ip(h1), count=3, interval=0.05)["received"] == 3

    # a peer gone: its route and nexthop both
    ov.stop_daemon(h0)
    ov.delete_lease(s0)
    wait_until(lambda: routes(ov, h1) == {} and nexthops(ov, h1) == {}, 10, 0.05,
               lambda: f"h1 to drop h0's route and nexthop: {routes(ov, h1)} {nexthops(ov, h1)}")

    # h0 back (plain), h1 by nexthop; both stopped: cleanup removes either form
    ov.start_daemon(h0, env=PLAIN)
    s0 = str(ov.subnet(h0))
    wait_until(lambda: by_nexthop(ov, h1, s0, h0.ip), 10, 0.05, "h1's route to h0 again")
    for h in (h0, h1):
        flags = ov.daemon_command(h, path_kind)[1:]
        ov.stop_daemon(h)
        r = ov.exec(h, cli_argv("cleanup", *flags, "--status-socket", ov.status_socket(h),
                                "--handover-socket", ov.handover_socket(h)), timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert routes(ov, h) == {} and nexthops(ov, h) == {}, (h.name, r.stdout)
    assert "ip nexthop del id" in r.stdout, r.stdout


def test_a_restart_keeps_the_direct_routes_it_finds(ov, path_kind):
    # a daemon started beside its direct routes (a restart) lists them first and leaves those
    # that are as it wants them: the kernel sees no route or nexthop made again
    h0, h1 = ov.add_host(wait=False), ov.add_host(wait=False)
    ov.wait_ready(h0)
    ov.wait_ready(h1)
    s0 = str(ov.subnet(h0))
    wait_until(lambda: by_nexthop(ov, h1, s0, h0.ip), 10, 0.05,
               lambda: f"h1's route to h0: {routes(ov, h1)} {nexthops(ov, h1)}")
    before = (routes(ov, h1), nexthops(ov, h1))
    ov.stop_daemon(h1)
    assert (routes(ov, h1), nexthops(ov, h1)) == before     # a stop leaves them
    monitor = ov.tb.popen(h1, ["ip", "-o", "monitor", "route", "nexthop"])
    out = ""
    try:
        time.sleep(0.2)                                         # listening before the start
        assert monitor.poll() is None, monitor.stderr.read()
        ov.start_daemon(h1)
        assert ov.ping(h1, ov.flannel_ip(h0), count=3, interval=0.05)["received"] == 3
        monitor.terminate()
        out = monitor.communicate(timeout=5)[0]
    finally:
        ov.tb.kill(monitor)
    seen = [line for line in out.splitlines() if "proto 153" in line]
    assert seen == [], seen
    assert (routes(ov, h1), nexthops(ov, h1)) == before
