"""The route table: peer leases -> routes, with no I/O.

Every peer's subnet goes as UDP to its PublicIP on the network config's backend port, flanneld's
udp backend's one port for every node. ``route_table`` is the whole table of a snapshot;
``route_changes`` is what one peer change does to it, which the daemon applies to the table it
keeps (``table.updated(removed, added)``, engine/route_array.py and engine/pytable.py) and hands to
the engine in one swap: a change costs its own size, not the peer set's.
"""
from __future__ import annotations

from ipaddress import IPv4Network

from ..engine.api import Route
from .peerset import PeerChange, PeerSnapshot


def route_table(snapshot: PeerSnapshot, port: int) -> tuple[Route, ...]:
    """One route per peer in ``snapshot``, sorted by subnet; our own subnet is not a peer."""
    return tuple(Route.make(subnet, lease.public_ip, port)
                 for subnet, lease in sorted(snapshot.peers.items()))


def route_changes(change: PeerChange, port: int) -> tuple[tuple[IPv4Network, ...], tuple[Route, ...]]:
    """``(removed subnets, added routes)``: applied to the table of the snapshot before ``change``,
    they give ``route_table(change.snapshot, port)``; a peer whose PublicIP changed is added again."""
    return (tuple(lease.subnet for lease in change.removed),
            tuple(Route(lease.subnet, lease.public_ip, port) for lease in change.added))
