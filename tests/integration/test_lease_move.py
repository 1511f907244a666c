"""A running daemon whose subnet is taken moves to another one (root, real etcd).

::

      h0 (engine E)                 h1 (the other engine)
      flannel0 10.5.a.0 -> 10.5.c.0 flannel0 10.5.b.0
      veth 192.168.77.1             veth 192.168.77.2

Another node (192.168.77.99, not a host here) overwrites h0's lease: h0 acquires another subnet
and moves flannel0's address, subnet.env and its engines, keeps its peers, and counts the taken
subnet as a peer. Its new engines get their route table once.
"""
from __future__ import annotations

import ipaddress
import time

import pytest

from dataplane.control.lease import LeaseAttrs
from tests.conftest import PATHS, require_path, wait_until
from tests.integration.conftest import other_engine, overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]

TAKER = "192.168.77.99"


@pytest.fixture(scope="module", params=PATHS)
def ov(request):
    """Each engine alone, and the kernel path (whose programs' config and maps follow the
    move: its new engines are put behind the same programs)."""
    engine = request.param
    require_path(engine)
    yield from overlay_of(engine, (engine, other_engine(engine)))


def test_taken_lease_moves_the_host_to_another_subnet(ov):
    h, peer = ov.hosts
    old = ov.subnet(h)
    d = ov.daemon(h)
    ov.put(f"subnets/{old.network_address}-{old.prefixlen}",
           LeaseAttrs(ipaddress.IPv4Address(TAKER)).to_json())
    wait_until(lambda: ov.subnet(h) != old, timeout=15, what="subnet.env names a new subnet")
    new = ov.subnet(h)
    assert d.running()
    assert ov.leases()[new] == h.ip and ov.leases()[old] == TAKER
    addrs = ov.exec(h, ["ip", "-4", "-o", "addr", "show", "dev", "flannel0"]).stdout
    assert f"{new.network_address}/32" in addrs and f"{old.network_address}/32" not in addrs
    assert ov.reachable(peer, str(new.network_address), 10), d.log_text()[-6000:] + ov.daemon(peer).log_text()[-3000:]
    assert ov.reachable(h, ov.flannel_ip(peer), 10)
    # Our old subnet is someone else's now: a peer like any other (the peer and the taker).
    wait_until(lambda: ov.metrics(h)["flannel_udp_peers"] == 2, timeout=5, what="two peers")
    # said as the outage it is: the workloads keep addresses of the old subnet
    assert f"Lease {old} is now held by another host (PublicIP {TAKER})" in d.log_text()
    assert "The new lease has another subnet" in d.log_text()
    assert "cut off until they are restarted" in d.log_text()
    # The new engines got one table, each queue swapping it in once.
    time.sleep(1.0)
    m = ov.metrics(h)
    queues = int(m["flannel_udp_queues"])
    assert [m[f'flannel_udp_route_swaps_total{{queue="{q}"}}'] for q in range(queues)] == \
        [1] * queues, m
    if ov.kind == "kernel":     # the pings above went through the programs
        assert m['flannel_udp_packets_total{datapath="kernel",path="udp_tx"}'] > 0, m
        assert "kernel path: the tc programs forward" in d.log_text()
