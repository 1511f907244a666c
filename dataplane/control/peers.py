"""The peer watcher: the set of other nodes' leases, kept equal to what etcd holds.

Unlike flanneld v0.20.2 (one event per watch call, the rest lost; docs/flannel-compat.md#peer-watch),
this loses nothing:
  1. snapshot: list `<prefix>/subnets/` at revision R and diff it against what we knew;
  2. one long-lived watch from R + 1; every event of every response is applied, so several leases
     created or deleted in one transaction all arrive;
  3. a broken stream or an etcd restart resumes from the last applied revision + 1 (etcd_watch.WatchLoop);
  4. a compacted revision re-lists (back to 1) and diffs, so removals that happened meanwhile show up.

Events are coalesced: the watch thread only applies each event to the lease dict and notes the subnet
it touched; a publisher thread waits `coalesce` seconds (5 ms) after the first unreported event, or ten
times what the last report took if that is longer (a report copies the peer set and the route table,
perf/README.md#report-cost; so reports never take more than a tenth of the time), so that
the rest of a burst (an autoscaling group joining, an etcd restore: a thousand puts, each its own
revision and response) arrives meanwhile, then reports everything applied so far in one
`on_change(change)` call: a `PeerChange` (control/peerset.py) holding the new immutable `PeerSnapshot`
and the net difference, `added` (new peers and peers whose attributes, the PublicIP, changed) and
`removed` (peers that are gone), computed over the touched subnets only. So a burst costs one snapshot
copy and one route table per batch instead of per event, and one event costs the same whether the
cluster has ten peers or ten thousand. A renewal (a put of the same value) changes nothing and is not
reported. The watcher keeps every valid lease by its etcd key, ours included; the snapshot leaves
ours out, so `set_own_subnet` needs no re-read to stop filtering the old subnet and filter the new
one. The first list, a re-list and `set_own_subnet` report synchronously, with whatever events
were still pending.

Everything in etcd is input. A key that is no lease (its key or value does not parse, or, given the
`network`, a subnet outside it or a PublicIP that cannot carry the overlay) is skipped, logged once per
key and problem (not at every re-list), and kept in `bad()` until the key is fixed or deleted. A peer's
key whose value turns malformed keeps the peer's last valid lease, as flanneld does (it ignores an event
it cannot parse): the owner will write it again, and the route it had is still the best guess.

A subnet and an IPv6 part have one holder: of two keys that name one (a dual-stack key lost in a
race, a stray put), the key created first holds it and the other is a conflict, skipped, whose put
and delete move nothing (control/claims.py). The same rule decides the first list, a re-list and
each event. The peers are the holders' leases, by IPv4 subnet.

One host holds one subnet. A second key that claims a PublicIP already holding a subnet (a copy-paste,
a broken tool) is a conflict, not a route: the key that has held the address longest (the lowest
etcd create revision) keeps it, the others are skipped like a bad key (logged once, counted in
``bad()``) until one of them goes. A lease that names this host's own PublicIP (``own_ips``) is
never a route: sent to ourselves, a packet would come back into flannel0 until its TTL ran out.

`_lock` guards `_claims`, `_touched`, `_current` and `_own`, and is held only for the work of a batch;
with the Python engine, which would share the interpreter, the daemon runs this watcher in a child
process (control/peer_process.py) and the report's duration includes the daemon applying it.
on_change runs in the publisher thread (or in the thread that listed: the watcher's, or the caller of
`set_own_subnet`), outside `_lock`, in order.

One piece at over 450 lines: the list, the events and the report change the same state (the claims,
the PublicIP index, the conflicts, the bad keys) under one lock; split, each part would reach into
the others' fields.
"""
from __future__ import annotations

import logging
import threading
import time
from ipaddress import IPv4Address, IPv4Network
from typing import Callable, Iterable, Optional, Union

from .claims import Claims, skipped_fields
from .lease import Lease, LeaseFormatError, lease_from_kv, parse_subnet_key, peer_problem
from .peerset import PeerChange, PeerSnapshot
from .etcd_errors import RegistryError
from .etcd_watch import WatchLoop, read_then_watch
from .registry import Registry

log = logging.getLogger(__name__)

OnChange = Callable[[PeerChange], None]

COALESCE_S = 0.005      # how long a batch waits for the rest of a burst, at least
REPORT_SHARE = 10       # ... and at least this many times what the last report took,
COALESCE_MAX_S = 0.1    # but never longer than this


class PeerWatcher:
    """The watch in this process's threads; a PeerWatch (control/peer_watch.py). See the module's
    docstring."""

    def __init__(self, registry: Registry, own_subnet: Optional[IPv4Network], on_change: Optional[OnChange],
                 *, retry_interval: float = 1.0, network: Optional[IPv4Network] = None,
                 coalesce: float = COALESCE_S, own_ips: Iterable[IPv4Address] = (),
                 listing: Optional[tuple] = None):
        """``listing``: a listing of the subnets prefix made already, in Registry.scan_leases'
        shape (leases, bad keys, revision), e.g. the lease allocation's: the first report is
        made of it, and the watch starts after its revision (one listing for both)."""
        self.registry = registry
        self._listing = listing
        self.network = network
        # The PublicIPs here are ints (IPv4Address's own value): an int hashes in C, an
        # IPv4Address in Python (~0.5 us a lookup, 16,000 at a first list:
        # perf/README.md#peer-table).
        self._own_ips = frozenset(IPv4Address(ip)._ip for ip in own_ips)
        # PublicIP -> the subnet it holds, or a set of them (a conflict, rare: no set for each)
        self._by_ip: dict[int, Union[IPv4Network, set[IPv4Network]]] = {}
        self._touched_ips: set[int] = set()
        # subnet -> (its key, PublicIP, why): valid leases that are no route (a PublicIP claimed twice)
        self._conflicts: dict[IPv4Network, tuple[str, int, str]] = {}
        self._bad: dict[str, str] = {}         # key -> problem, for keys that are no usable lease
        # bad()'s answer, replaced whole under _lock: /metrics needs no _lock, which a 16,000-lease
        # listing holds for a quarter of a second (perf/README.md#answers-during-start)
        self._bad_view: dict[str, str] = {}
        self._bad_seen = 0                     # distinct (key, problem) seen since start
        self.on_change = on_change
        self.retry_interval = retry_interval
        self._lock = threading.Lock()
        # every valid lease by key, ours included; the held subnets
        self._claims = Claims(registry.subnets_prefix)
        self._own = own_subnet
        self._current = PeerSnapshot.of((), own_subnet)
        self._touched: set[IPv4Network] = set()      # subnets events changed since the last report
        self.coalesce = coalesce
        self._kick = threading.Event()               # set when events wait to be reported
        self._stop = threading.Event()
        self._watch: Optional[WatchLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._publisher: Optional[threading.Thread] = None
        self._report_s = 0.0                         # what the last report took
        self._emit_lock = threading.RLock()    # serialises state changes with their on_change calls
        self.ready = threading.Event()         # set after the first snapshot
        self.snapshots = 0
        self.batches = 0                       # reports of watch events
        self.revision = 0                      # last revision applied

    # -- public ---------------------------------------------------------------------------------
    def peers(self) -> dict[IPv4Network, Lease]:
        with self._lock:
            return dict(self._current.peers)

    def snapshot(self) -> PeerSnapshot:
        with self._lock:
            return self._current

    def start(self) -> None:
        self._stop.clear()
        # While etcd is away, its lines say what this host still forwards to.
        self.registry.add_note(self._routes_kept)
        self._publisher = threading.Thread(target=self._publish_loop, name="peer-publisher",
                                           daemon=True)
        self._publisher.start()
        self._thread = threading.Thread(target=self._run, name="peer-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._kick.set()
        self.registry.remove_note(self._routes_kept)
        watch = self._watch
        if watch is not None:
            watch.cancel()
        for attr in ("_thread", "_publisher"):
            thread = getattr(self, attr)
            if thread is not None:
                thread.join(timeout)
                setattr(self, attr, None)

    def flush(self) -> None:
        """Report the events applied so far now (the publisher does within ``coalesce`` s)."""
        with self._emit_lock:
            with self._lock:
                change = self._publish()
            self._emit(change)

    def bad(self) -> dict[str, str]:
        """{key: problem} of the keys under the subnets prefix that are skipped now: keys that
        are no lease, and leases in conflict."""
        return self._bad_view

    def _publish_bad(self) -> None:
        """bad()'s answer as it is now; caller holds _lock."""
        self._bad_view = {**self._bad, **self._claims.conflicts,
                          **{key: why for key, _, why in self._conflicts.values()}}

    @property
    def bad_total(self) -> int:
        """Distinct (key, problem) pairs skipped since start, conflicts included."""
        return self._bad_seen + self._claims.seen

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        return self.ready.wait(timeout)

    def set_own_subnet(self, subnet: Optional[IPv4Network]) -> None:
        """Our lease changed (re-acquired): stop filtering the old one, filter the new one, re-list.

        Hands on_change one report even when no peer changed: the caller moved and builds its
        route table from that snapshot."""
        with self._lock:
            self._own = subnet
        try:
            self._snapshot(always=True)
        except RegistryError as exc:       # the leases we know still give the new snapshot
            log.warning("re-listing peers after own subnet change failed: %s", exc)
            with self._emit_lock:
                with self._lock:
                    change = self._publish(full=True)
                self._emit(change, always=True)

    # -- internals ------------------------------------------------------------------------------
    @property
    def watch_loop(self) -> Optional[WatchLoop]:
        return self._watch

    def _publish_loop(self) -> None:
        while not self._stop.is_set():
            self._kick.wait()
            if self._stop.is_set():
                return
            # The rest of a burst arrives meanwhile.
            self._stop.wait(min(max(self.coalesce, REPORT_SHARE * self._report_s), COALESCE_MAX_S))
            self._kick.clear()                   # before reading: a later event kicks again
            started = time.monotonic()
            self.flush()
            self._report_s = time.monotonic() - started

    def _routes_kept(self) -> str:
        return f"forwarding goes on with the routes to the {len(self.snapshot())} peer(s) known"

    def _run(self) -> None:
        read_then_watch(
            self.registry, self.registry.subnets_prefix, prefix=True, read=self._snapshot,
            relist=lambda: self._snapshot(relist=True), on_events=self._on_events, stop=self._stop,
            on_watch=self._set_watch, retry_interval=self.retry_interval, name="subnets")

    def _set_watch(self, watch: WatchLoop) -> None:
        self._watch = watch

    def _snapshot(self, always: bool = False, relist: bool = False) -> int:
        """List the leases and report the difference. ``relist``: the watch asks, after a
        compaction or a rewound etcd, so the list is the truth even at a lower revision."""
        listing, self._listing = self._listing, None
        leases, bad, rev = listing if listing is not None else self.registry.scan_leases()
        with self._emit_lock:
            with self._lock:
                stale = rev < self.revision and not relist
                if stale:
                    # The watch applied newer events while we listed (set_own_subnet's list
                    # races the watch thread): what we hold is fresher than the list.
                    log.debug("peer list at revision %d is older than the watch (%d): kept the "
                              "watch's view", rev, self.revision)
                    leases, bad, rev = list(self._claims.keys.values()), (), self.revision
                own = self._own
                before = self._claims.keys
                fresh: dict[str, Lease] = {}
                problems: dict[str, str] = {b.key: b.problem for b in bad}
                network, key_of = self.network, self._claims.key_of
                for lease in leases:
                    problem = peer_problem(lease, network)
                    if problem is None:
                        fresh[lease.key or key_of(lease)] = lease
                    else:
                        problems[lease.key] = problem
                for key in problems:              # a peer whose value turned bad keeps its last lease
                    if key not in fresh and key in before:
                        fresh[key] = before[key]
                self._claims.replace(fresh.values())
                self._by_ip = _index(self._claims.held)
                self.revision = rev
                change = self._publish(full=True)
                if not stale:
                    self._set_bad(problems, replace=True, own=own)
                self._publish_bad()
            self.snapshots += 1
            self._emit(change, always)
        self.ready.set()
        return rev

    def _problem(self, lease: Lease) -> Optional[str]:
        return peer_problem(lease, self.network)

    def _set_bad(self, problems: dict, *, replace: bool, own, cleared=()) -> None:
        """Record skipped keys (caller holds _lock); log each key and problem once."""
        for key in cleared:
            if self._bad.pop(key, None) is not None:
                log.info("Subnet lease %s is readable again (or gone)", key)
        if replace:
            for key in set(self._bad) - set(problems):
                del self._bad[key]
                log.info("Subnet lease %s is readable again (or gone)", key)
        for key, problem in problems.items():
            if self._bad.get(key) == problem:
                continue
            self._bad[key] = problem
            self._bad_seen += 1
            subnet = _subnet_of_key(key)
            kept = self._claims.keys.get(key)
            fields = skipped_fields(key, subnet, problem)
            if subnet is not None and subnet == own:
                log.warning("Our own subnet lease %s holds something else: %s", key, problem,
                            extra={**fields, "event": "own_lease_broken"})
            elif kept is not None:
                log.warning("Skipping subnet lease %s: %s; keeping the last valid lease of %s (via "
                            "%s) until the key is fixed or deleted", key, problem, subnet,
                            kept.attrs.public_ip,
                            extra={**fields, "public_ip": str(kept.attrs.public_ip)})
            else:
                log.warning("Skipping subnet lease %s: %s (no route for it until the key is fixed "
                            "or deleted)", key, problem, extra=fields)

    def _on_events(self, events: list, revision: int) -> None:
        """The watch thread's part: apply, note what changed, leave the report to the publisher."""
        self._apply_events(events, revision)
        self._kick.set()

    def _apply_events(self, events: list, revision: int) -> None:
        with self._lock:
            own = self._own
            for ev in events:
                if ev.kind == "delete":
                    self._set_bad({}, replace=False, own=own, cleared=[ev.key])
                    self._moved(self._claims.delete(ev.key))
                    continue
                try:                              # the key first: a bad one raises
                    lease = lease_from_kv(ev.key, ev.value, lease_id=ev.lease_id,
                                          mod_revision=ev.mod_revision,
                                          create_revision=ev.create_revision)
                    problem = self._problem(lease)
                except LeaseFormatError as exc:
                    problem = str(exc)
                except Exception as exc:          # input from etcd never stops the watch
                    problem = f"unreadable ({type(exc).__name__})"
                if problem is not None:           # skipped; a known peer keeps its last lease
                    self._set_bad({ev.key: problem}, replace=False, own=own)
                    continue
                self._set_bad({}, replace=False, own=own, cleared=[ev.key])
                self._moved(self._claims.put(lease))
            self.revision = revision
            self._publish_bad()

    def _moved(self, changed: dict) -> None:
        """The held subnets whose lease changed (``{subnet: the lease it had}``): the old lease
        out of the PublicIP index, the new one in, both PublicIPs' claims looked at again.
        Caller holds _lock."""
        for subnet, old in changed.items():
            if old is not None:
                ip = old.attrs.public_ip._ip
                held = self._by_ip.get(ip)
                if isinstance(held, set):
                    held.discard(subnet)
                    if len(held) == 1:
                        self._by_ip[ip] = held.pop()
                elif held == subnet:
                    del self._by_ip[ip]
                self._touched_ips.add(ip)
            new = self._claims.held.get(subnet)
            if new is not None:
                _hold(self._by_ip, new.attrs.public_ip._ip, subnet)
                self._touched_ips.add(new.attrs.public_ip._ip)
            self._touched.add(subnet)

    def _resolve_claims(self, ips) -> set[IPv4Network]:
        """Decide, for each PublicIP of ``ips``, which of its subnets are conflicts (see the
        module's docstring); log each new and each ended conflict once. Returns the subnets
        whose standing changed. Caller holds _lock."""
        changed: set[IPv4Network] = set()
        for ip in ips:
            subnets = _held(self._by_ip, ip)
            now: dict[IPv4Network, str] = {}
            address = IPv4Address(ip)
            if ip in self._own_ips:
                for subnet in subnets:
                    if subnet != self._own:
                        now[subnet] = (f"it claims this host's own PublicIP {address} (our "
                                       f"lease is {self._own}): never a route")
            elif len(subnets) > 1:
                keep = min(subnets, key=lambda s: _seniority(self._claims.held[s]))
                for subnet in subnets:
                    if subnet != keep:
                        now[subnet] = (f"conflict: PublicIP {address} already holds {keep}; one "
                                       "host holds one subnet, so this key is no route")
            before = {s for s, (_, cip, _) in self._conflicts.items() if cip == ip}
            for subnet in before - set(now):
                key, _, _ = self._conflicts.pop(subnet)
                changed.add(subnet)
                log.info("Subnet lease %s is no longer in conflict", key)
            for subnet, why in now.items():
                key = self._claims.held[subnet].key or str(subnet)
                if self._conflicts.get(subnet, (None, None, None))[2] != why:
                    self._conflicts[subnet] = (key, ip, why)
                    self._bad_seen += 1
                    changed.add(subnet)
                    log.warning("Skipping subnet lease %s: %s; delete the key that is wrong "
                                "(etcdctl del %s)", key, why, key,
                                extra={**skipped_fields(key, subnet, why),
                                       "public_ip": str(address)})
        return changed

    def _publish(self, full: bool = False) -> PeerChange:
        """The snapshot of the leases now, and how it differs from the last (over the subnets
        events touched, or all of them when ``full``); caller holds _lock."""
        touched, self._touched = self._touched, set()
        ips, self._touched_ips = self._touched_ips, set()
        if full:
            # the PublicIPs whose claims can be in question: held twice, ours, in conflict
            ips = {ip for ip, held in self._by_ip.items() if isinstance(held, set)}
            ips |= {ip for ip in self._own_ips if ip in self._by_ip}
            ips |= {ip for _, ip, _ in self._conflicts.values()}
        if not (touched or full or ips):
            return PeerChange(self._current)
        touched |= self._resolve_claims(ips)
        after = PeerSnapshot.of(self._claims.held, self._own, skip=self._conflicts)
        change = PeerChange.between(self._current, after, None if full else touched)
        self._current = change.snapshot
        self._publish_bad()
        if not full:
            self.batches += 1
        return change

    def _emit(self, change: PeerChange, always: bool = False) -> None:
        """Report one change; called with _emit_lock held so that reports keep their order.
        The receiver logs it (the daemon: daemon/peer_log.py, a summary during a burst)."""
        hand_on(self.on_change, change, always)


def hand_on(on_change: Optional[OnChange], change: PeerChange, always: bool = False) -> None:
    """Give ``on_change`` one report, unless it changes nothing (and ``always`` is false); a
    receiver that fails is logged, never raised into the watch (control/peer_process.py too)."""
    if not (change or always) or on_change is None:
        return
    try:
        on_change(change)
    except Exception:
        log.exception("peer on_change callback failed")


def _index(leases: dict) -> dict:
    by_ip: dict = {}
    for subnet, lease in leases.items():
        ip = lease.attrs.public_ip._ip
        if by_ip.setdefault(ip, subnet) is not subnet:      # (a call less for each of thousands)
            _hold(by_ip, ip, subnet)
    return by_ip


def _hold(by_ip: dict, ip: int, subnet: IPv4Network) -> None:
    """``ip`` holds ``subnet`` too (PeerWatcher._by_ip)."""
    had = by_ip.setdefault(ip, subnet)
    if isinstance(had, set):
        had.add(subnet)
    elif had is not subnet and had != subnet:       # (ipaddress's == is Python's, not C's)
        by_ip[ip] = {had, subnet}


def _held(by_ip: dict, ip: int) -> tuple | set:
    held = by_ip.get(ip)
    return () if held is None else held if isinstance(held, set) else (held,)


def _seniority(lease: Lease) -> tuple:
    """Sorts first the key that has held its PublicIP longest (an unknown create revision
    last), then by subnet: every host decides a conflict the same way."""
    return (lease.create_revision or float("inf"), int(lease.subnet.network_address),
            lease.subnet.prefixlen)


def _subnet_of_key(key: str) -> Optional[IPv4Network]:
    try:
        return parse_subnet_key(key)[0]
    except LeaseFormatError:
        return None

