"""`flannel-udp run` on a host whose subnet is a reservation another flannel's operator wrote (root).

The reservation is a key with no etcd lease, in the vxlan backend's shape, on a subnet that is not the
one in the host's subnet.env: the daemon must take it by PublicIP, keep it without a TTL across
restarts and never delete it, and its peer (the other engine) must route to it.
"""
from __future__ import annotations

import base64
import json

import pytest

from tests.conftest import ENGINES
from tests.integration.conftest import other_engine, overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]


@pytest.fixture(scope="module", params=ENGINES)
def ov(request):
    engine = request.param
    yield from overlay_of(engine, (engine, other_engine(engine)))


def key_state(ov, subnet) -> "tuple[int, dict] | None":
    """(etcd lease id, decoded value) of the subnet's key, or None if it is absent."""
    key = f"{ov.prefix}/subnets/{subnet.network_address}-{subnet.prefixlen}"
    kvs = json.loads(ov.etcdctl("get", key, "-w", "json").stdout).get("kvs", [])
    if not kvs:
        return None
    return int(kvs[0].get("lease", 0)), json.loads(base64.b64decode(kvs[0]["value"]))


def both_ways(ov, timeout=10.0) -> None:
    a, b = ov.hosts
    assert ov.reachable(a, ov.flannel_ip(b), timeout), f"{a.name} cannot reach {ov.flannel_ip(b)}"
    assert ov.reachable(b, ov.flannel_ip(a), timeout), f"{b.name} cannot reach {ov.flannel_ip(a)}"


def test_reserved_subnet_taken_kept_and_routed_to(ov):
    h, peer = ov.hosts
    old = ov.subnet(h)
    taken = set(ov.leases())
    reserved = next(n for n in ov.network.subnets(new_prefix=24)
                    if n not in taken and int(n.network_address) > int(old.network_address) + 2 * 256)
    assert ov.stop_daemon(h) == 0
    ov.delete_lease(old)
    ov.put(f"subnets/{reserved.network_address}-24",
           json.dumps({"PublicIP": h.ip, "PublicIPv6": None, "BackendType": "vxlan",
                       "BackendData": {"VtepMAC": "7a:1c:4e:02:9b:10"}}))
    try:
        for run in range(2):                                  # the first start, then a restart
            d = ov.start_daemon(h, engine=ov.kind)
            assert ov.subnet(h) == reserved, f"run {run}: took {ov.subnet(h)}, not the reservation"
            assert "Found reservation" in d.log_text()
            both_ways(ov)
            assert ov.metrics(peer)["flannel_udp_peers"] == 1
            lease_id, value = key_state(ov, reserved)
            assert lease_id == 0 and value == {"PublicIP": h.ip, "PublicIPv6": None}, f"run {run}"
            assert ov.stop_daemon(h) == 0
            assert key_state(ov, reserved)[0] == 0, f"run {run}: reservation changed at stop"
    finally:
        # Back to an ordinary lease (the subnet.env now names the reserved subnet: it comes back).
        ov.stop_daemon(h)
        ov.delete_lease(reserved)
        ov.start_daemon(h, engine=ov.kind)
    assert ov.subnet(h) == reserved and key_state(ov, reserved)[0] != 0
    both_ways(ov)
