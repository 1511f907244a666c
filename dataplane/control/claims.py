"""Which etcd key holds a subnet: the valid leases by key, and per IPv4 subnet and per IPv6 part
the one key that holds it; no I/O.

etcd keys a lease by its whole key, `10.5.2.0-24&fc00:5:0:2::-64`, so two keys can claim one
IPv4 subnet, or one IPv6 part: a dual-stack key lost in a race when two hosts start together
stays for a moment (control/lease_manager.py: the later key yields), and an operator's stray
`etcdctl put` stays until it is deleted. Kept by subnet, the later put would replace the holder and
its delete remove the subnet, both families, until the holder's next renewal, a day later.

Here the holder of a subnet or part is the key created first (the lowest create revision; one
not known comes last; then by key, so every host decides alike), the rule of the lease code's own
race (control/allocate.py ``earlier_rival``). A key that holds every part it names is the lease
of its IPv4 subnet in ``held``; a key that loses one is a conflict, no route at all. Each part
is decided on its own: a senior key in conflict over one part still holds its others, which then
have no route (nothing cascades, so the outcome depends on the keys alone, never on the order
they came in). When the holder goes, the next key may hold. So a put or a delete of a key in conflict, and a holder's
renewal (the same key, the same create revision) change no other key's standing.

Conflicts are logged once per key and reason, with the key to delete, and counted (``seen``).
"""
from __future__ import annotations

import logging
from ipaddress import IPv4Network, IPv6Network
from typing import Iterable, Optional, Union

from .lease import Lease, subnet_key_name

log = logging.getLogger(__name__)

Part = Union[IPv4Network, IPv6Network]


class Claims:
    """The valid leases by key (``keys``), the lease of each held IPv4 subnet (``held``), the
    keys in conflict with why (``conflicts``). ``put`` and ``delete`` return the held subnets
    that changed, each with the lease it had before (None: none). ``prefix``: the
    keys' (``<prefix>/subnets/``), which names a lease that carries no key (built by hand)."""

    def __init__(self, prefix: str = ""):
        self.prefix = prefix
        self.keys: dict[str, Lease] = {}
        self.held: dict[IPv4Network, Lease] = {}
        self.conflicts: dict[str, str] = {}
        self.seen = 0                               # conflicts said since start
        # part (its _pk) -> the key that names it, or the keys when several do (rare: no set
        # for each)
        self._claimants: dict[int, Union[str, set[str]]] = {}

    def put(self, lease: Lease) -> dict[IPv4Network, Optional[Lease]]:
        key = self.key_of(lease)
        old = self.keys.get(key)
        self.keys[key] = lease
        if old is None:
            for part in _parts(lease):
                named = self._claimants.setdefault(_pk(part), key)
                if named is not key:
                    self._name(part, named, key)
        return self._settle(_parts(lease))

    def delete(self, key: str) -> dict[IPv4Network, Optional[Lease]]:
        lease = self.keys.pop(key, None)
        if lease is None:
            return {}
        for part in _parts(lease):
            pk = _pk(part)
            named = self._claimants.get(pk)
            if named == key:
                del self._claimants[pk]
            elif isinstance(named, set):
                named.discard(key)
                if len(named) == 1:
                    self._claimants[pk] = named.pop()
        if self.conflicts.pop(key, None) is not None:
            log.info("Subnet lease %s, in conflict, is gone", key)
        return self._settle(_parts(lease))

    def replace(self, leases: Iterable[Lease]) -> None:
        """Every lease at once (a list, a re-list): the same outcome as putting them one by one;
        conflicts said before and still there are not said again. The caller compares the whole
        of ``held`` with what it had."""
        self.keys = keys = {lease.key or self.key_of(lease): lease for lease in leases}
        self._claimants = claimants = {}
        contested = set()
        for key, lease in keys.items():
            part = lease.subnet          # _pk(part), inline: one call less a lease of thousands
            named = claimants.setdefault(part.network_address._ip << 8 | part._prefixlen, key)
            if named is not key:
                self._name(part, named, key)
                contested.add(part)
            part = lease.ipv6_subnet
            if part is not None:
                named = claimants.setdefault(_pk(part), key)
                if named is not key:
                    self._name(part, named, key)
                    contested.add(part)
        # Only parts named twice are decided: a list of thousands costs one pass over them.
        holders = {part: self._holder(part) for part in contested}
        rivals = {key for part in contested for key in claimants[_pk(part)]}
        for key in rivals:
            self._stand(key, keys[key], self._why(key, keys[key], holders))
        for key in [k for k in self.conflicts if k not in rivals]:
            del self.conflicts[key]
            log.info("Subnet lease %s, in conflict, is gone" if key not in keys else
                     "Subnet lease %s is no longer in conflict", key)
        # a key in no conflict holds each of its parts, its subnet among them
        self.held = {lease.subnet: lease for key, lease in keys.items()
                     if key not in self.conflicts}

    def key_of(self, lease: Lease) -> str:
        """The lease's etcd key (the one its parts make when it carries none)."""
        return lease.key or self.prefix + subnet_key_name(lease.subnets)

    # -- internals ------------------------------------------------------------------------------
    def _name(self, part: Part, named: Union[str, set], key: str) -> None:
        """``key`` names ``part`` too, which ``named`` (a key or keys) named already."""
        if isinstance(named, str):
            self._claimants[_pk(part)] = {named, key}
        else:
            named.add(key)

    def _named(self, part: Part) -> Iterable[str]:
        named = self._claimants.get(_pk(part))
        return () if named is None else (named,) if isinstance(named, str) else named

    def _holder(self, part: Part) -> Optional[str]:
        named = self._claimants.get(_pk(part))
        if named is None or isinstance(named, str):
            return named
        return min(named, key=lambda k: _seniority(k, self.keys[k]))

    def _settle(self, parts: Iterable[Part]) -> dict[IPv4Network, Optional[Lease]]:
        """Decide again the standing of every key claiming one of ``parts`` and the lease of
        every subnet it can move: only those can change when ``parts`` gained or lost a key."""
        parts = list(parts)
        holders = {part: self._holder(part) for part in parts}
        keys = {k for part in parts for k in self._named(part)}
        subnets = {part for part in parts if part.version == 4}
        for key in keys:
            lease = self.keys[key]
            subnets.add(lease.subnet)
            self._stand(key, lease, self._why(key, lease, holders))
        changed: dict[IPv4Network, Optional[Lease]] = {}
        for subnet in subnets:
            key = holders[subnet] if subnet in holders else self._holder(subnet)
            lease = self.keys[key] if key is not None and key not in self.conflicts else None
            old = self.held.get(subnet)
            if lease is old:
                continue
            changed[subnet] = old
            if lease is None:
                del self.held[subnet]
            else:
                self.held[subnet] = lease
        return changed

    def _why(self, key: str, lease: Lease, holders: dict) -> Optional[str]:
        for part in _parts(lease):
            holder = holders[part] if part in holders else self._holder(part)
            if holder != key:
                senior = self.keys[holder]
                what = "subnet" if part.version == 4 else "IPv6 part"
                return (f"conflict: {what} {part} is held by {holder}, created first (revision "
                        f"{senior.create_revision or 'unknown'}); each subnet and IPv6 part has "
                        "one holder, so this key is no route")
        return None

    def _stand(self, key: str, lease: Lease, why: Optional[str]) -> None:
        if why is None:
            if self.conflicts.pop(key, None) is not None:
                log.info("Subnet lease %s is no longer in conflict", key)
            return
        if self.conflicts.get(key) == why:
            return
        self.conflicts[key] = why
        self.seen += 1
        log.warning("Skipping subnet lease %s: %s; delete the key that is wrong (etcdctl del %s)",
                    key, why, key, extra={**skipped_fields(key, lease.subnet, why),
                                          "public_ip": str(lease.public_ip)})


def skipped_fields(key: str, subnet: Optional[IPv4Network], reason: str) -> dict:
    """A skipped key's fields for json log lines (``--log-format json``)."""
    return {"event": "lease_skipped", "key": key, "subnet": str(subnet) if subnet else None,
            "reason": reason}


def _pk(part: Part) -> int:
    """``part``'s key in ``_claimants``: its address and prefix length in one int, an IPv6
    part's negative (an int hashes in C, an ipaddress network in Python: ~0.5 us a lookup,
    perf/README.md#peer-table)."""
    key = part.network_address._ip << 8 | part._prefixlen
    return key if part._version == 4 else ~key


def _parts(lease: Lease) -> tuple:
    return (lease.subnet,) if lease.ipv6_subnet is None else (lease.subnet, lease.ipv6_subnet)


def _seniority(key: str, lease: Lease) -> tuple:
    return (lease.create_revision or float("inf"), key)
