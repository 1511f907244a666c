"""The route table: peer leases -> routes, with no I/O.

The daemon calls ``route_table`` once per peer change (and once when its own lease moves) and
hands the result to the engine in one swap. Every peer's subnet goes as UDP to its PublicIP on
the network config's backend port, flanneld's udp backend's one port for every node.
"""
from __future__ import annotations

from ..engine.api import Route
from .peerset import PeerSnapshot


def route_table(snapshot: PeerSnapshot, port: int) -> tuple[Route, ...]:
    """One route per peer in ``snapshot``, sorted by subnet; our own subnet is not a peer."""
    return tuple(Route.make(subnet, lease.public_ip, port)
                 for subnet, lease in sorted(snapshot.peers.items()))
