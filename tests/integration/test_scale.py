"""Issue 47's scenarios at a small N, as behaviour (perf/scale.py measures them, at 16,000 peers):
1,000 peer leases, each its own PublicIP, two real daemons h0 and h1, then

* a burst from 700 to 1,000 leases (300 puts, each its own revision): h0 and h1 count every new
  peer, and h0's engine routes each of them;
* a fresh daemon h2 started beside them: READY, h0 and h1 reach it and it reaches h0 (pinged
  from before its start), its ``flannel_udp_peers`` is every lease but its own, and its engine
  routes every peer: one datagram to each subnet, none dropped for want of a route
  (dataplane/testbed/route_sweep.py; a control address no lease covers must be dropped, so
  the sweep sees a miss when there is one);
* /metrics and the status socket, asked every ~100 ms in each host throughout, answer every
  question, during the burst and h2's own start too; a ping stream h0 -> h1 throughout loses
  nothing.

Once per path (c, python, and kernel: the kernel path's maps swept too: no subnet handed to the
engine for want of a route). No figure of time is asserted: the waits are bounds, not targets.
"""
from __future__ import annotations

import ipaddress
import threading
import time

import pytest

from tests.conftest import require_etcd, require_path, require_root

pytestmark = pytest.mark.etcd

PEERS, BURST = 1000, 300
CONFIG = {"Network": "10.0.0.0/8", "SubnetLen": 24, "SubnetMin": "10.250.0.0",
          "SubnetMax": "10.250.255.0", "Backend": {"Type": "udp"}}
NEW_HOST_SUBNET = ipaddress.IPv4Network("10.250.200.0/24")     # h0, h1 take random ones
NO_LEASE = "10.249.0.1"
BOUND_S = 30.0


def test_a_fresh_start_a_new_host_and_a_burst_at_1000_peers(path_kind, figure):
    require_root()
    require_etcd()
    require_path(path_kind)
    engine_kind = path_kind
    from dataplane.testbed.answer_times import AnswerTimes
    from dataplane.testbed.lease_writer import fake_leases
    from dataplane.testbed.overlay import Overlay
    from dataplane.testbed.peer_count import PeerCount
    from dataplane.testbed.ping_stream import MIN_INTERVAL_S, PingStream
    from dataplane.testbed.route_sweep import sweep
    preload = fake_leases("10.1.0.0", PEERS - BURST)
    burst = fake_leases("10.128.0.0", BURST, first_ip=100_000)
    with Overlay(hosts=0, engine=engine_kind, config=CONFIG) as ov:
        writer = ov.lease_writer()
        writer.put(preload, txn=100)
        h0, h1 = ov.add_host(wait=False), ov.add_host(wait=False)
        ov.wait_ready(h0)
        ov.wait_ready(h1)
        h2 = ov.add_host(start=False)
        ov.prefer_subnet(h2, NEW_HOST_SUBNET)
        asks = {h.name: AnswerTimes(ov, h) for h in (h0, h1, h2)}
        # the stream counts from its first reply: both hosts route each other first
        for src, dst in ((h0, h1), (h1, h0)):
            assert ov.first_reply(src, ov.flannel_ip(dst), BOUND_S) is not None, (src.name, dst.name)
        stream = PingStream(ov, h0, ov.flannel_ip(h1), MIN_INTERVAL_S, 4 * BOUND_S)

        counts = [PeerCount(ov, h, "ge", PEERS + 1, timeout=BOUND_S) for h in (h0, h1)]
        assert all(c.wait_first() for c in counts), "no /metrics answer"
        res = writer.put(burst)
        assert res["results"] == BURST
        absorbed = [c.reached(BOUND_S) for c in counts]
        assert None not in absorbed, f"not every new peer counted: {[c.seen[-1:] for c in counts]}"
        during = (res["t_first"], max(absorbed))
        figure(f"{engine_kind}: {BURST} puts absorbed after the last (h0, h1), s",
               [round(t - res["t_last"], 3) for t in absorbed])

        ip2 = str(NEW_HOST_SUBNET.network_address)
        aims = {"h0->h2": (h0, ip2), "h1->h2": (h1, ip2), "h2->h0": (h2, ov.flannel_ip(h0))}
        replied: dict = {}
        pingers = [threading.Thread(target=lambda k=k, src=src, dst=dst: replied.update(
            {k: ov.first_reply(src, dst, timeout=BOUND_S)})) for k, (src, dst) in aims.items()]
        for t in pingers:
            t.start()
        t_start = time.time()
        ov.start_daemon(h2)
        for t in pingers:
            t.join()
        assert None not in replied.values(), f"not reached both ways: {replied}"
        figure(f"{engine_kind}: new host reached after its start, s",
               {k: round(t - t_start, 3) for k, t in sorted(replied.items())})
        time.sleep(0.5)                     # h2 answers a few questions once it listens

        lost = stream.stop()
        assert lost["replies"] > 0 and lost["lost"] == 0, lost
        for name, a in asks.items():
            # h2's from its own start on: every phase answers (tests/unit/test_status_answers.py)
            whole = a.summary(0, time.time())
            a.close()
            for kind, s in whole.items():
                assert s["asked"] > 0 and s["failed"] == 0, (name, kind, s)
        for h in (h0, h1):
            for kind, s in asks[h.name].summary(*during).items():
                assert s["asked"] > 0 and s["failed"] == 0, ("during the burst", h.name, kind, s)

        assert ov.metrics(h2)["flannel_udp_peers"] == PEERS + 2
        for h in (h2, h0):                  # h2 from its start, h0 after the burst
            swept = sweep(ov, h, preload | burst, NO_LEASE)
            assert swept["read"] >= swept["sent"], (h.name, swept)
            assert swept["missing"] == 0, (h.name, swept)
            if path_kind == "kernel":       # the programs' maps hold every peer too
                assert swept["kernel_missing"] == 0, (h.name, swept)
        for d in ov.daemons.values():
            text = d.log_text()
            assert " ERROR " not in text and "Traceback" not in text, text[-3000:]
