"""The peer watcher: the set of other nodes' leases, kept equal to what etcd holds.

Unlike flanneld v0.20.2 (one event per watch call, events between calls lost; FLANNEL_COMPAT.md §3.6),
this loses nothing:
  1. snapshot: list `<prefix>/subnets/` at revision R and diff it against what we knew;
  2. one long-lived watch from R + 1; every event of every response is applied, so several leases
     created or deleted in one transaction all arrive;
  3. a broken stream or an etcd restart resumes from the last applied revision + 1 (Registry.WatchLoop);
  4. a compacted revision re-lists (back to 1) and diffs, so removals that happened meanwhile show up.

Each batch of events becomes one `on_change(added, removed)` call with the net difference: `added` holds
new peers and peers whose attributes (PublicIP) changed, `removed` peers that are gone. A renewal (a put
of the same value) changes nothing and is not reported. Our own subnet is filtered out. A malformed key
or value is logged and skipped; a key whose value turns malformed counts as removed.

`_lock` guards `_peers` and `_own`; on_change runs in the watcher thread, outside the lock, in order.
"""
from __future__ import annotations

import logging
import threading
from ipaddress import IPv4Network
from typing import Callable, Optional

from .lease import Lease, LeaseFormatError, lease_from_kv, parse_subnet_key
from .registry import Registry, RegistryClosedError, RegistryError, WatchLoop

log = logging.getLogger(__name__)

OnChange = Callable[[list, list], None]


class PeerWatcher:
    def __init__(self, registry: Registry, own_subnet: Optional[IPv4Network], on_change: Optional[OnChange],
                 *, retry_interval: float = 1.0):
        self.registry = registry
        self.on_change = on_change
        self.retry_interval = retry_interval
        self._lock = threading.Lock()
        self._peers: dict[IPv4Network, Lease] = {}
        self._own = own_subnet
        self._stop = threading.Event()
        self._watch: Optional[WatchLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._emit_lock = threading.RLock()    # serialises state changes with their on_change calls
        self.ready = threading.Event()         # set after the first snapshot
        self.snapshots = 0
        self.revision = 0                      # last revision applied

    # -- public ---------------------------------------------------------------------------------
    def peers(self) -> dict[IPv4Network, Lease]:
        with self._lock:
            return dict(self._peers)

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="peer-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.cancel()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        return self.ready.wait(timeout)

    def set_own_subnet(self, subnet: Optional[IPv4Network]) -> None:
        """Our lease changed (re-acquired): stop filtering the old one, filter the new one, re-list."""
        with self._lock:
            self._own = subnet
        try:
            self._snapshot()
        except RegistryError as exc:       # the watch's next compaction or restart will re-list
            log.warning("re-listing peers after own subnet change failed: %s", exc)

    # -- internals ------------------------------------------------------------------------------
    @property
    def watch_loop(self) -> Optional[WatchLoop]:
        return self._watch

    def _run(self) -> None:
        rev = None
        while rev is None and not self._stop.is_set():
            try:
                rev = self._snapshot()
            except RegistryClosedError:
                return
            except RegistryError as exc:
                log.warning("Watch subnets: listing leases failed, retrying in %gs: %s", self.retry_interval, exc)
                self._stop.wait(self.retry_interval)
        if self._stop.is_set():
            return
        self._watch = self.registry.watch_loop(
            self.registry.subnets_prefix, prefix=True, start_revision=rev + 1, on_events=self._on_events,
            on_compacted=self._snapshot, retry_interval=self.retry_interval, name="subnets")
        if not self._stop.is_set():
            self._watch.run()

    def _snapshot(self) -> int:
        leases, rev = self.registry.list_leases()
        fresh: dict[IPv4Network, Lease] = {}
        for lease in leases:
            fresh[lease.subnet] = lease
        with self._emit_lock:
            with self._lock:
                own = self._own
                if own is not None:
                    fresh.pop(own, None)
                before = self._peers
                self._peers = fresh
                self.revision = rev
                added, removed = _diff(before, fresh, set(before) | set(fresh))
            self.snapshots += 1
            self._emit(added, removed)
        self.ready.set()
        return rev

    def _on_events(self, events: list, revision: int) -> None:
        with self._emit_lock:
            self._apply_events(events, revision)

    def _apply_events(self, events: list, revision: int) -> None:
        with self._lock:
            own = self._own
            before = dict(self._peers)
            touched: set[IPv4Network] = set()
            for ev in events:
                try:
                    subnet, _ = parse_subnet_key(ev.key)
                except LeaseFormatError as exc:
                    log.warning("Watch subnets: skipping event for malformed key: %s", exc)
                    continue
                if own is not None and subnet == own:
                    continue
                touched.add(subnet)
                if ev.kind == "delete":
                    self._peers.pop(subnet, None)
                    continue
                try:
                    self._peers[subnet] = lease_from_kv(ev.key, ev.value, lease_id=ev.lease_id,
                                                        mod_revision=ev.mod_revision)
                except LeaseFormatError as exc:
                    log.warning("Watch subnets: skipping malformed lease %s: %s", ev.key, exc)
                    self._peers.pop(subnet, None)
            self.revision = revision
            added, removed = _diff(before, self._peers, touched)
        self._emit(added, removed)

    def _emit(self, added: list[Lease], removed: list[Lease]) -> None:
        """Report one change; called with _emit_lock held so that reports keep their order."""
        if not (added or removed) or self.on_change is None:
            return
        for lease in added:
            log.info("Subnet added: %s via %s", lease.subnet, lease.attrs.public_ip)
        for lease in removed:
            log.info("Subnet removed: %s", lease.subnet)
        try:
            self.on_change(added, removed)
        except Exception:
            log.exception("peer on_change callback failed")


def _diff(before: dict, after: dict, keys) -> tuple[list[Lease], list[Lease]]:
    added, removed = [], []
    for subnet in sorted(keys):
        old, new = before.get(subnet), after.get(subnet)
        if new is not None and (old is None or old.attrs != new.attrs):
            added.append(new)
        elif new is None and old is not None:
            removed.append(old)
    return added, removed
