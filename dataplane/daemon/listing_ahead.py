"""A fresh start's lease listing made in a thread while the start chooses its engine.

The lease's acquisition lists every lease (one Range of the subnets' prefix, then a parse of
each key and value: ~0.3 s at 16,000 leases) and the peer watch starts from that listing
(LeaseManager.take_listing). Nothing of it needs the engine: so once the network config is
read, the listing begins in a thread, and the engine's choice runs beside it (the C engine's
imports; the kernel path's load, whose verifier runs in C without the interpreter's lock, on
the other core: daemon/early_load.py). The lease manager's first listing is then this one
(:class:`FirstListing`), taken when it asks; everything after it asks etcd, as before. The
listing is a read: no etcd write comes before the engine's choice, as before
(perf/README.md#listing-ahead).

A listing that failed (etcd away, refused) is not used: the manager lists again, and says
what fails in its own words, as without this. A takeover lists nothing ahead (it keeps its
lease; a failed check acquires the usual way).
"""
from __future__ import annotations

import threading


class ListingAhead:
    """``registry.list_leases(malformed=...)`` run in a thread from now."""

    def __init__(self, registry):
        self._registry = registry
        self._result = None
        self._thread = threading.Thread(target=self._run, name="lease-listing", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        bad: list = []
        try:
            leases, rev = self._registry.list_leases(malformed=bad)
        except Exception:       # noqa: BLE001 -- the manager lists again and says why
            return
        self._result = (leases, bad, rev)

    def take(self):
        """(leases, malformed keys, revision) once the thread is done, or None when it failed
        (or was taken already)."""
        self._thread.join()
        result, self._result = self._result, None
        return result


class FirstListing:
    """``registry`` as the lease manager uses it, but its first ``list_leases`` (the
    acquisition's, which the peer watch starts from) is ``ahead``'s listing when it has one."""

    def __init__(self, registry, ahead: ListingAhead):
        self._registry, self._ahead = registry, ahead

    def __getattr__(self, name):
        return getattr(self._registry, name)

    def list_leases(self, with_ttl: bool = False, malformed=None):
        ahead, self._ahead = self._ahead, None
        listed = ahead.take() if ahead is not None and not with_ttl else None
        if listed is None:
            return self._registry.list_leases(with_ttl, malformed)
        leases, bad, rev = listed
        if malformed is not None:
            malformed.extend(bad)
        return leases, rev


def start(registry, inherited) -> ListingAhead | None:
    """The listing ahead for a fresh start (``inherited`` None); None for a takeover."""
    return ListingAhead(registry) if inherited is None else None


def registry_for(registry, ahead: ListingAhead | None):
    """What the lease manager is given: ``registry``, whose first listing is ``ahead``'s."""
    return registry if ahead is None else FirstListing(registry, ahead)
