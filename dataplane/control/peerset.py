"""The peer set the watcher hands out: immutable, so a reader never sees it change under it.

A peer is any valid lease that holds its subnet and IPv6 part (control/claims.py) but our own:
``PeerSnapshot.of`` is the one place that drops our own subnet. ``PeerChange`` is what the watcher reports after each batch of etcd events (all the events
that arrived within a few milliseconds, control/peers.py): the new snapshot and how it differs from
the previous one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv4Network
from types import MappingProxyType
from typing import Iterable, Mapping, Optional, Union

from .lease import Lease


@dataclass(frozen=True)
class PeerSnapshot:
    """The other nodes' leases by subnet (read-only), and the subnet they exclude: ours."""
    own: Optional[IPv4Network] = None
    peers: Mapping[IPv4Network, Lease] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, leases: Union[Iterable[Lease], Mapping[IPv4Network, Lease]],
           own: Optional[IPv4Network], skip: Iterable[IPv4Network] = ()) -> "PeerSnapshot":
        """Every lease in ``leases`` (a later one of the same subnet wins; a mapping is keyed by
        the leases' subnets) except ``own``'s and those of ``skip`` (leases in conflict)."""
        if isinstance(leases, Mapping):
            peers = dict(leases)        # a copy in C: with many peers, no key is hashed again
        else:
            peers = {lease.subnet: lease for lease in leases}
        if own is not None:
            peers.pop(own, None)
        for subnet in skip:
            peers.pop(subnet, None)
        return cls(own, MappingProxyType(peers))

    def __len__(self) -> int:
        return len(self.peers)


@dataclass(frozen=True)
class PeerChange:
    """One report of the peer watcher: the peers now, and the difference from the last report.

    ``added`` holds new peers and peers whose attributes (PublicIP) or IPv6 part changed (a key
    reshaped for the same IPv4 subnet: its value may be the same bytes), ``removed`` the peers
    that are gone; both sorted by subnet."""
    snapshot: PeerSnapshot
    added: tuple = ()
    removed: tuple = ()

    @classmethod
    def between(cls, before: PeerSnapshot, after: PeerSnapshot,
                subnets: Optional[Iterable[IPv4Network]] = None) -> "PeerChange":
        """The difference, looked for in ``subnets`` only when the caller knows which subnets
        a batch of events touched (the cost is then the batch's, not the peer set's)."""
        if subnets is None:
            if not before.peers:        # a first listing: all of it is new
                return cls(after, tuple(lease for _, lease in in_subnet_order(after.peers)))
            subnets = set(before.peers) | set(after.peers)
        added, removed = [], []
        for subnet in sorted(subnets, key=_subnet_order):
            old, new = before.peers.get(subnet), after.peers.get(subnet)
            if new is not None and (old is None or old.attrs != new.attrs
                                    or old.ipv6_subnet != new.ipv6_subnet):
                added.append(new)
            elif new is None and old is not None:
                removed.append(old)
        if not (added or removed) and after.own == before.own and len(after) == len(before):
            # the same peers (a renewal, our own key's put): ``before`` stays the snapshot, which
            # the daemon holds, not a second copy of the whole table until the next change
            after = before
        return cls(after, tuple(added), tuple(removed))

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


def in_subnet_order(peers: Mapping[IPv4Network, Lease]) -> list:
    """``peers.items()`` in their subnets' order (:func:`_subnet_order`), from one int each
    rather than a key function's calls per peer (a first listing of thousands); no two
    subnets share one, so the items themselves are never compared."""
    order = [(subnet.network_address._ip << 6 | subnet._prefixlen) for subnet in peers]
    return [item for _, item in sorted(zip(order, peers.items()))]


def _subnet_order(subnet: IPv4Network) -> tuple:
    """IPv4Network's own order (address, then prefix length), without its Python-level compare."""
    return int(subnet.network_address), subnet.prefixlen
