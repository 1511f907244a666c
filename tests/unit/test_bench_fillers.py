"""The bench's filler routes (`bench --routes N`): distinct subnets and peers, none of them the
bench's own, in the format of `forward --route-file`."""
from __future__ import annotations

import ipaddress

import pytest

from dataplane.bench.paths import FILLER_MAX, filler_routes
from dataplane.bench.topo import NETWORK
from dataplane.cli.forward import _route


def test_fillers_are_distinct_and_apart_from_the_bench():
    lines = filler_routes(10_000)
    routes = [_route(line) for line in lines]
    assert len({net for net, _, _ in routes}) == 10_000
    assert len({peer for _, peer, _ in routes}) == 10_000
    underlay = ipaddress.IPv4Network("192.168.0.0/16")
    for net, peer, port in routes:
        assert net.prefixlen == 24 and not net.overlaps(NETWORK)
        assert ipaddress.IPv4Address(peer) not in underlay and port is None


@pytest.mark.parametrize("n", [-1, FILLER_MAX + 1])
def test_out_of_range_is_refused(n):
    with pytest.raises(ValueError):
        filler_routes(n)


def test_zero_and_the_maximum():
    assert filler_routes(0) == []
    assert len(set(filler_routes(FILLER_MAX))) == FILLER_MAX
