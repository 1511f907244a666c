"""Broken cluster data under running daemons (root, real etcd, both engines).

::

      h0 (engine E)  <-- ping every 0.1 s, the whole test -->  h1 (the other engine)
           |                                                        |
      -----+---------------- bridge, switch netns: etcd ------------+----
                 garbage, truncated, wrongly typed, 1 MB and deeply nested values,
                 subnet keys that do not parse, a config that changes under them

What must hold: the daemons say what is wrong (naming the key and the problem, in a log line of
bounded size), count the lease keys they skip (flannel_udp_bad_leases), keep forwarding between the
hosts they know (no ping lost), and pick a lease up as a route as soon as it is fixed.
"""
from __future__ import annotations

import ipaddress
import json

import pytest

from tests.conftest import ENGINES, wait_until
from tests.integration.conftest import other_engine, overlay_of
from tests.integration.daemon_checks import Pinger, lease_json, logged, longest_log_line, metric
from tests.integration.traffic import udp_probe

pytestmark = [pytest.mark.root, pytest.mark.etcd]

MB = 1 << 20
MAX_LOG_LINE = 2000          # a 1 MB value must never end up in the log


@pytest.fixture(scope="module", params=ENGINES)
def ov(request):
    engine = request.param
    yield from overlay_of(engine, (engine, other_engine(engine)))


def test_bad_leases_are_skipped_logged_counted_and_picked_up_when_fixed(ov):
    h0, h1 = ov.hosts
    s1 = ov.subnet(h1)
    free = [n for n in ipaddress.IPv4Network("10.5.0.0/16").subnets(new_prefix=24)
            if n not in ov.leases() and n.network_address.packed[2] >= 200]
    fixed = free[2]                                   # wrongly typed now, fixed at the end
    # (key under <prefix>/subnets/, value, what the log must say about it)
    bad = [
        (f"{free[0].network_address}-24", "not json{", "not JSON"),
        (f"{free[1].network_address}-24", '{"PublicIP":"192.168.77.9"', "not JSON"),
        (f"{fixed.network_address}-24", '{"PublicIP":5}', "PublicIP"),
        (f"{free[3].network_address}-24", '["192.168.77.9"]', "not a JSON object"),
        (f"{free[4].network_address}-24", '{"PublicIP":"' + "9" * MB + '"}', "PublicIP"),
        (f"{free[5].network_address}-24", '{"PublicIP":"192.168.77.9","x":' + "[" * 5000 +
         "]" * 5000 + "}", "nested too deeply"),
        (f"{free[8].network_address}-24", lease_json("192.168.77.9")[:-1] + ',"x":"' + "a" * MB +
         '"}', "oversized"),
        (f"{free[6].network_address}-24", lease_json("127.0.0.1"), "PublicIP 127.0.0.1"),
        (f"{free[7].network_address}-24", lease_json(str(s1.network_address + 9)),
         "inside the Network"),
        ("10.99.0.0-24", lease_json("192.168.77.9"), "outside the Network"),
        ("not-a-subnet", lease_json("192.168.77.9"), "not a subnet key"),
        ("10.5.300.0-24", lease_json("192.168.77.9"), "not a subnet key"),
        # h1's subnet with host bits set: read leniently, it would hijack h1's route
        (f"{s1.network_address + 7}-24", lease_json("192.168.77.99"), "host bits"),
    ]
    pinger = Pinger(ov, h0, h1, seconds=25)
    try:
        assert pinger.replying(), pinger.stop()["out"]
        for key, value, _ in bad:
            ov.put(f"subnets/{key}", value)
        for h in (h0, h1):
            for key, _, problem in bad:
                wait_until(lambda: logged(ov, h, key, problem), 10, 0.2,
                           f"{h.name}: {problem!r} for {key}")
            assert metric(ov, h, "flannel_udp_bad_leases") == len(bad)
            assert metric(ov, h, "flannel_udp_bad_leases_seen_total") >= len(bad)
            assert metric(ov, h, "flannel_udp_peers") == 1
            assert longest_log_line(ov, h) < MAX_LOG_LINE
        # a skipped lease is no route: the engine answers net unreachable
        assert udp_probe(ov, h0, str(fixed.network_address + 1)) == "ENETUNREACH"

        # A peer's own key overwritten with garbage: the others keep the last valid lease, the
        # owner takes its key back (same subnet, not a new one).
        ov.put(f"subnets/{s1.network_address}-24", "garbage")
        wait_until(lambda: ov.leases().get(s1) == h1.ip, 10, 0.2, "h1 to take its lease key back")
        assert logged(ov, h1, "malformed") and ov.subnet(h1) == s1
        assert logged(ov, h0, f"{s1.network_address}-24", "keeping")

        # a daemon (re)started with all this in etcd starts and forwards
        pinger.kill()
        ov.restart_daemon(h1)
        assert ov.subnet(h1) == s1 and ov.reachable(h0, ov.flannel_ip(h1), 10)
        pinger = Pinger(ov, h0, h1, seconds=8)       # at most: stopped once the leases are fixed

        # fixed: the lease becomes a route (sent to its peer: no ICMP any more); the rest deleted
        ov.put(f"subnets/{fixed.network_address}-24", lease_json("192.168.77.50"))
        wait_until(lambda: metric(ov, h0, "flannel_udp_peers") == 2, 10, 0.2,
                   "the fixed lease as a peer")
        assert udp_probe(ov, h0, str(fixed.network_address + 1), timeout=1.0) == "timeout"
        for key, _, _ in bad:
            if key != f"{fixed.network_address}-24":
                ov.etcdctl("del", f"{ov.prefix}/subnets/{key}")
        for h in (h0, h1):
            wait_until(lambda: metric(ov, h, "flannel_udp_bad_leases") == 0, 10, 0.2,
                       f"{h.name}: no bad lease left")
        r = pinger.stop()
        assert r["sent"] > 0 and r["received"] == r["sent"], r["out"]
    finally:
        pinger.kill()
        ov.etcdctl("del", f"{ov.prefix}/subnets/{fixed.network_address}-24")
    for h in (h0, h1):
        assert ov.daemon(h).running()


def test_config_broken_and_changed_while_running(ov):
    h0, h1 = ov.hosts
    key = f"{ov.prefix}/config"
    good = ov.config
    cases = [
        ("garbage", "not json", "invalid JSON"),
        ("truncated", '{"Network":"10.5.0.0/16","Backend":{"Type":', "invalid JSON"),
        ("wrong type", '{"Network":5}', "cannot unmarshal"),
        ("a list", '["10.5.0.0/16"]', "cannot unmarshal array"),
        ("1 MB", '{"Network":"' + "1" * MB + '"}', "invalid CIDR"),
        ("nested", "[" * 100000 + "]" * 100000, "nested too deeply"),
        ("Network changed", json.dumps({"Network": "10.6.0.0/16", "Backend": {"Type": "udp"}}),
         "Network 10.5.0.0/16 -> 10.6.0.0/16"),
        ("Backend type changed", json.dumps({"Network": "10.5.0.0/16",
                                             "Backend": {"Type": "vxlan"}}),
         "unknown backend type: vxlan"),
        ("port changed", json.dumps({"Network": "10.5.0.0/16",
                                     "Backend": {"Type": "udp", "Port": 8300}}),
         "Port 8285 -> 8300"),
    ]
    pinger = Pinger(ov, h0, h1, seconds=40)          # at most: stopped once the config is back
    try:
        assert pinger.replying(), pinger.stop()["out"]
        for what, value, problem in cases:
            ov.put_config(value)
            for h in (h0, h1):
                wait_until(lambda: logged(ov, h, key, problem), 10, 0.2,
                           f"{h.name}: {what}: {problem!r}")
        for h in (h0, h1):
            assert logged(ov, h, key, "keeps running with")
            assert metric(ov, h, "flannel_udp_config_mismatch") == 1
            assert longest_log_line(ov, h) < MAX_LOG_LINE
        ov.etcdctl("del", key)
        for h in (h0, h1):
            wait_until(lambda: logged(ov, h, key, "deleted"), 10, 0.2, f"{h.name}: config deleted")
        ov.put_config(good)
        for h in (h0, h1):
            wait_until(lambda: logged(ov, h, key, "matches the running config again"), 10, 0.2,
                       f"{h.name}: config restored")
            assert metric(ov, h, "flannel_udp_config_mismatch") == 0
        r = pinger.stop()
        # the ping ran the whole time: all of it, or still running when stopped
        assert (r["sent"] == pinger.count or r["stopped"]) and r["sent"] > 0 \
            and r["received"] == r["sent"], r["out"]
    finally:
        pinger.kill()
        ov.put_config(good)
    for h in (h0, h1):
        assert ov.daemon(h).running()
    assert ov.reachable(h1, ov.flannel_ip(h0), 10)
