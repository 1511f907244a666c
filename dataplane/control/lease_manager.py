"""The lease manager: acquire this node's subnet lease, keep it renewed, and get it back if it is lost.

(Over 450 lines as one piece: acquisition, renewal and re-acquisition share one lease and
one lock, and each step below depends on the order of the others; the picks are allocate.py's.)

Acquisition follows flanneld's `tryAcquireLease` order (docs/flannel-compat.md#lease-acquisition):
  1. a lease whose PublicIP is ours, whatever else its value holds (another flannel's backend fields,
     key order, spacing): reused (rewritten with our value) if it fits the config, else deleted;
  2. the previous subnet from subnet.env, if nobody holds it and it fits the config;
  3. a uniformly random pick among the first 100 free subnets from SubnetMin to SubnetMax
     (control/allocate.py).
Creation is a create-if-absent transaction with a fresh 24 h etcd lease. Unlike flanneld, losing a
creation race is not fatal: we re-list and pick again (up to `max_attempts`).

With EnableIPv6 one key names both parts (`10.5.1.0-24&fc00:5:0:1::-64`) and a lease fits only if its
IPv6 part does too (none without EnableIPv6). Unlike flanneld, a host never gives up its IPv4 subnet
because of IPv6: only the IPv6 part is replaced, under a key of the new shape. Two such keys can
share a part, which their create-if-absent cannot see: every write that makes a dual key (an
allocation, a take-back, a key of the new shape, a renewal whose key had vanished) looks at the
keys after it, and the later of two overlapping keys goes (`_second`, control/allocate.py
`earlier_rival`).

A running host keeps its subnet while it can write its key: its workloads hold addresses in it. When
our key is lost (deleted, expired, overwritten with garbage) we take that same key back first; we move
only when the subnet is genuinely held by another host (a valid lease with another PublicIP), and that
move is logged as the outage it is. A dual key whose IPv6 part alone is another host's keeps its
IPv4 subnet and takes another IPv6 part (an outage of the workloads' IPv6 only). A second key naming our PublicIP (a copy-paste, a broken tool) is
a conflict, never a reason to move: at startup the subnet of subnet.env wins among such keys, and the
others are logged with what to delete.

Renewal (docs/flannel-compat.md#lease-ttl) is a new grant plus a put at `expiration - renew margin`,
retried every `retry_interval` (1 min) on failure. With flanneld's 24 h TTL a renewal comes 24 h
minus the margin after the last one: 23 h with the default 60 min, one minute with the largest
margin, 1439 min (a host then rides out an etcd outage of up to 23 h 59 min). A margin as long as
the TTL or longer (only a shortened TTL allows it) would make each renewal due at once; renewals
then come MIN_RENEW_GAP_S apart. A key with no etcd lease is a reservation: reused as it is, without
a TTL, never renewed and never deleted. Our own key is watched: a delete (expiry, revocation, an
operator's `etcdctl del`) or another PublicIP written into it makes us acquire again, preferring the
same subnet, and tell the daemon through `on_lease_change(lease)` instead of exiting as flanneld
does. A rewrite that keeps our PublicIP is not a loss; if it detaches the key from its etcd lease,
the key is a reservation from then on, and a reservation given an etcd lease is renewed from then
on.

Threads: start() runs a maintenance thread (renewal, re-acquisition) and a watch thread (own key).
`_cond` guards `_lease`, `_gen`, `_lost`, `_retime`, `_stopped` and `_watch`.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import replace
from ipaddress import IPv4Network, IPv6Network
from typing import Callable, Optional

# SubnetError, OutOfSubnetsError, free_subnets and MAX_FREE_CANDIDATES were defined here first:
# importers still find them here
from .allocate import (MAX_FREE_CANDIDATES, OutOfSubnetsError, SubnetError,  # noqa: F401
                       earlier_rival, free_subnets, ipv6_part, other_holder, pick_pair)
from .config import NetworkConfig
from .lease import Lease, LeaseAttrs, LeaseFormatError, by_version, clip, with_ipv6_of_key
from .lease_log import fields, v6
from .recurring import Recurring
from .etcd_errors import RegistryError
from .etcd_watch import WatchLoop
from .registry import SUBNET_TTL, Registry

log = logging.getLogger(__name__)

# The least time between a renewal and the next. flanneld's TTL and margins leave at least 60 s
# (86400 s - 1439 min), so it changes nothing there; it only bounds a margin that reaches the TTL
# (a shortened TTL), which would otherwise renew as fast as etcd answers. One second keeps such a
# lease alive whenever its TTL is longer, at a write rate etcd takes without notice.
MIN_RENEW_GAP_S = 1.0


def check_renew_margin(minutes: int) -> int:
    if not isinstance(minutes, int) or not 1 <= minutes <= 1439:
        raise ValueError("Invalid subnet-lease-renew-margin option, out of acceptable range "
                         f"(want 1..1439 minutes, got {minutes!r})")
    return minutes


def _recreated(lease: Lease) -> bool:
    """A renewal's put found no key and created it (registry.renew_lease)."""
    return lease.create_revision == lease.mod_revision


class LeaseManager:
    def __init__(self, registry: Registry, public_ip,
                 subnet_file_prev=None, renew_margin_min: int = 60,
                 on_lease_change: Optional[Callable[[Lease], None]] = None, *,
                 config: Optional[NetworkConfig] = None, lease_ttl: int = SUBNET_TTL,
                 renew_margin_s: Optional[float] = None, retry_interval: float = 60.0,
                 reacquire_interval: float = 1.0, watch_retry_interval: float = 1.0,
                 max_attempts: int = 20, rng: Optional[random.Random] = None):
        """``public_ip``: this host's PublicIP, or its public addresses, one per family (the
        IPv4 PublicIP; the IPv6 underlay's PublicIPv6, if any); ``subnet_file_prev``: the
        subnet of subnet.env, or its parts, one per family (the IPv4 subnet, the IPv6 part)."""
        self.registry = registry
        public = by_version(public_ip)
        if 4 not in public:
            raise ValueError(f"public_ip {public_ip!r}: a host's PublicIP is an IPv4 address")
        self.public_ip = public[4]
        # the IPv6 underlay's address, written only with EnableIPv6 (docs/operating.md#dual-stack)
        with_v6 = config is not None and config.enable_ipv6
        self.attrs = LeaseAttrs(public_ip=self.public_ip,
                                public_ipv6=public.get(6) if with_v6 else None,
                                direct_routing=bool(config is not None and config.direct_routing),
                                forwards_ipv6=bool(config is not None and config.enable_ipv6))
        self.subnet_file_prev = by_version(subnet_file_prev)    # version -> part
        self.renew_margin = (renew_margin_s if renew_margin_s is not None
                             else 60.0 * check_renew_margin(renew_margin_min))
        self.on_lease_change = on_lease_change
        self.config = config
        self.lease_ttl = int(lease_ttl)
        self.retry_interval = retry_interval
        self.reacquire_interval = reacquire_interval
        self.watch_retry_interval = watch_retry_interval
        self.max_attempts = max_attempts
        self._rng = rng or random.Random()
        self._cond = threading.Condition()
        self._lease: Optional[Lease] = None
        self._gen = 0                         # bumped whenever _lease is replaced by a new acquisition
        self._lost = False
        self._retime = False                  # the watch changed _lease's etcd lease: renewal due again
        self._rewrite = False                 # an adopted lease's value is not ours: renew at once
        self._stopped = False
        self._watch: Optional[WatchLoop] = None
        self._threads: list[threading.Thread] = []
        self.renewals = 0
        self.reacquisitions = 0
        self.races_lost = 0                   # creations beaten by another node (we picked again)
        # The subnet of the last dual key given up (_second) to a key that overlaps its IPv6 part
        # alone: the subnet is still ours to take, with another IPv6 part (_acquire).
        self._ipv6_only_loss: Optional[IPv4Network] = None
        self._listing: Optional[tuple] = None     # acquire()'s, until taken (take_listing)
        self._reacquire_failing = Recurring(log, "Re-acquiring our lease", level=logging.ERROR)
        self._renew_failing = Recurring(log, "Renewing our lease", level=logging.ERROR)

    @property
    def renew_failures(self) -> int:
        """Renewals that etcd did not take (each retried), since start."""
        return self._renew_failing.total

    @property
    def lease(self) -> Optional[Lease]:
        with self._cond:
            return self._lease

    @property
    def watch_loop(self) -> Optional[WatchLoop]:
        """The watch of our own lease key (replaced after each re-acquisition)."""
        return self._watch

    # -- acquisition --------------------------------------------------------------------------------
    def acquire(self) -> Lease:
        """Acquire (or reuse) this node's lease; raises SubnetError, ConfigError or RegistryError.
        The leases it listed are kept for :meth:`take_listing`."""
        lease = self._acquire(self.subnet_file_prev, keep=True)
        self.adopt(lease)
        return lease

    def take_listing(self) -> Optional[tuple]:
        """(leases, malformed keys, revision) acquire() listed last, once: a peer watch starts
        from it (PeerWatcher.start_from) and watches from its revision on."""
        listing, self._listing = self._listing, None
        return listing

    def adopt(self, lease: Lease) -> None:
        """Take ``lease`` as ours without asking etcd: a daemon that took over from the previous
        one (daemon/inherited.py) holds the lease that one held. The watch of our key starts
        after the lease's mod revision, so a change made to it meanwhile is still seen. The
        handed lease may name its IPv6 part in its key alone: a renewal needs the part."""
        lease = with_ipv6_of_key(lease)
        with self._cond:
            self._lease = lease
            self._gen += 1
            self._lost = False
            # our PublicIPv6 (the IPv6 underlay) came or went or moved since the value was
            # written: renewed at once, so that peers learn it now rather than in up to 23 h
            self._rewrite = lease.attrs.public_ipv6 != self.attrs.public_ipv6
        if self._rewrite:
            log.info("Lease %s: its value says PublicIPv6 %s, this host's is %s: rewriting it",
                     lease.subnet, lease.attrs.public_ipv6, self.attrs.public_ipv6)

    def _acquire(self, prev: dict, keep: bool = False) -> Lease:
        """``prev``: the parts to prefer by version (4: a subnet, 6: an IPv6 part); ``keep``:
        the last listing kept (take_listing)."""
        config = self.config or self.registry.get_config()
        prev = dict(prev)
        lost: set = set()       # parts of either family lost to another writer
        for attempt in range(1, self.max_attempts + 1):
            self._ipv6_only_loss = None
            bad: list = []
            leases, rev = self.registry.list_leases(malformed=bad)
            self._listing = (leases, bad, rev) if keep else None
            lease = self._reuse_by_ip(config, leases, prev)
            if lease is not None:
                return lease
            if self._keep_subnet():
                prev = {4: self._ipv6_only_loss}
                continue
            if 4 in prev:
                lease = self._reuse_previous(config, leases, prev)
                if lease is not None:
                    return lease
                if self._keep_subnet():
                    prev.pop(6, None)
                    continue
                # Tried once; from now on pick at random, and not it: our list predates a writer
                # that may have just taken it.
                lost.add(prev.pop(4))
            pick, pick6 = pick_pair(config, leases, lost, self._rng)
            lease = self.registry.create_lease((pick, pick6), self.attrs, self.lease_ttl)
            if lease is not None and self._second(lease) is not None:
                lease = None
            if lease is not None:
                log.info("Allocated lease (ip: %s ipv6: %s) to current node (%s)", pick, v6(pick6),
                         self.public_ip, extra=fields("allocated", (pick, pick6), self.public_ip))
                return lease
            log.info("subnet %s was taken by another node meanwhile (attempt %d/%d), picking again",
                     pick if pick6 is None else f"{pick} ({pick6})", attempt, self.max_attempts)
            lost.update(part for part in (pick, pick6) if part is not None)
            self.races_lost += 1
        raise SubnetError(f"failed to acquire a subnet lease: lost {self.max_attempts} creation races in a row")

    def _keep_subnet(self) -> bool:
        """A reuse of our subnet (our key, subnet.env's) just lost only its IPv6 part to an
        earlier key: as a running host does (_reacquire), the subnet is kept, with another
        IPv6 part, on the next attempt. Never the IPv4 subnet given up because of IPv6."""
        if self._ipv6_only_loss is None:
            return False
        log.info("Keeping subnet %s: only the IPv6 part of our key was another host's; taking "
                 "another IPv6 part", self._ipv6_only_loss)
        return True

    def _second(self, lease: Lease, others_only: bool = False) -> Optional[Lease]:
        """The key just written as ``lease``, if it names both parts, against every key created
        before it: the first such key that overlaps either part (allocate.earlier_rival) keeps
        it, ours is deleted (its etcd lease revoked) and that key returned; None when ours
        stands. An IPv4-only key needs no look: its transaction (create if absent, or put if
        still at the revision read) guards the subnet, which no other key of that shape names.
        No transaction can guard a dual key's parts (a range compare covers the keys that
        begin with our IPv4 part, none those that end with our IPv6 part), hence the order of
        creation. ``others_only``: keys naming our PublicIP are no rivals (taking ours back)."""
        if lease.ipv6_subnet is None:
            return None
        leases = self.registry.list_leases()[0]
        if others_only:
            leases = [l for l in leases if l.attrs.public_ip != self.public_ip]
        rival = earlier_rival(leases, lease)
        if rival is None:
            return None
        log.info("subnet %s (%s) overlaps %s, created just before ours: giving it up",
                 lease.subnet, lease.ipv6_subnet, rival.key)
        self.registry.delete_lease(lease.subnets)
        if lease.lease_id:
            self.registry.revoke(lease.lease_id)
        if not rival.subnet.overlaps(lease.subnet):
            self._ipv6_only_loss = lease.subnet
        return rival

    def _reuse_by_ip(self, config: NetworkConfig, leases: list[Lease],
                     prev: dict) -> Optional[Lease]:
        ours = [l for l in leases if l.attrs.public_ip == self.public_ip]
        if len(ours) > 1:
            # flanneld takes the first in key order; the subnet our workloads were given wins here
            ours.sort(key=lambda l: l.subnet != prev.get(4))
            log.warning("%d subnet leases name our PublicIP %s (%s): one host holds one subnet; "
                        "trying %s first; delete the others (etcdctl del KEY) once this host "
                        "runs", len(ours), self.public_ip,
                        ", ".join(l.key or str(l.subnet) for l in ours), ours[0].subnet)
        for l in ours:
            if not config.subnet_compatible(l.subnet):
                log.warning("Found lease (ip: %s) for current IP (%s) that does not fit the network "
                            "config, deleting it", l.subnet, self.public_ip,
                            extra=fields("deleted", l.subnet, self.public_ip,
                                          reason="does not fit the network config"))
                self.registry.delete_lease(l.subnets)
                continue
            if config.ipv6_subnet_compatible(l.ipv6_subnet):
                lease = self._renew_found(l)
            else:
                lease = self._reshape(config, l, prev.get(6))
            if lease is not None:
                return lease
            # else: rewritten by another node since our list, or our subnet is another's now
        return None

    def _renew(self, subnets) -> Optional[Lease]:
        """Our key of ``subnets`` (the lease's parts) put again (registry.renew_lease). A key gone since we read it is created
        again by that put: a dual key so made is a take-back and yields as one (``_second``),
        None then, as when the key names another host."""
        lease = self.registry.renew_lease(subnets, self.attrs, self.lease_ttl)
        if (lease is not None and _recreated(lease)
                and self._second(lease, others_only=True) is not None):
            return None
        return lease

    def _renew_found(self, found: Lease) -> Optional[Lease]:
        renewed = self._renew(found.subnets)
        if renewed is not None:
            log.info("Found %s (ip: %s ipv6: %s) for current IP (%s), reusing",
                     "reservation" if renewed.reservation else "lease", found.subnet,
                     v6(found.ipv6_subnet), self.public_ip,
                     extra=fields("reused", found.subnets, self.public_ip,
                                   reason="found for current IP"))
        return renewed

    def _reshape(self, config: NetworkConfig, old: Lease,
                 prev6: Optional[IPv6Network]) -> Optional[Lease]:
        """Our lease's IPv4 subnet fits, its IPv6 part does not. flanneld deletes the key and picks
        a random subnet; we delete it too but keep the IPv4 subnet, where our workloads have their
        addresses, under a key of the new shape (a reservation stays one). None when another
        host's lease overlaps that subnet once our key is gone: flanneld's order goes on."""
        log.warning("Found lease (ip: %s ipv6: %s) for current IP (%s) whose IPv6 part does not fit "
                    "the network config (EnableIPv6 %s): replacing its key, keeping subnet %s",
                    old.subnet, v6(old.ipv6_subnet), self.public_ip,
                    "on" if config.enable_ipv6 else "off", old.subnet,
                    extra=fields("deleted", old.subnets, self.public_ip,
                                  reason="IPv6 part does not fit the network config"))
        self.registry.delete_lease(old.subnets)
        leases, _ = self.registry.list_leases()
        others = [l for l in leases if l.attrs.public_ip != self.public_ip]
        if any(l.subnet.overlaps(old.subnet) for l in others):
            return None
        want = old.ipv6_subnet if old.ipv6_subnet is not None else prev6
        sn6 = ipv6_part(config, others, want, self._rng)
        lease = self.registry.create_lease((old.subnet, sn6), self.attrs,
                                           0 if old.reservation else self.lease_ttl)
        if lease is not None and self._second(lease, others_only=True) is not None:
            return None
        if lease is not None:
            log.info("Allocated lease (ip: %s ipv6: %s) to current node (%s), the same subnet as "
                     "before", old.subnet, v6(sn6), self.public_ip,
                     extra=fields("allocated", (old.subnet, sn6), self.public_ip,
                                   reason="new key shape, same subnet"))
        return lease

    def _reuse_previous(self, config: NetworkConfig, leases: list[Lease],
                        parts: dict) -> Optional[Lease]:
        prev = parts[4]
        if not config.subnet_compatible(prev):
            log.info("Previous subnet %s does not fit the network config, not reusing it", prev)
            return None
        if any(l.subnet.overlaps(prev) for l in leases):
            return None
        # the IPv6 part of subnet.env only if it fits too; the IPv4 subnet is kept either way
        sn6 = ipv6_part(config, leases, parts.get(6), self._rng)
        # absent from our list: free, or its key holds garbage (nobody's lease, taken back)
        lease, _ = self._take_back((prev, sn6))
        if lease is not None:
            log.info("Found previously leased subnet (%s), reusing", prev,
                     extra=fields("reused", (prev, sn6), self.public_ip, reason="previous subnet"))
        return lease

    # -- renewal and own-lease monitoring ----------------------------------------------------------
    def start(self) -> None:
        if self._lease is None:
            self.acquire()
        with self._cond:
            self._stopped = False
        for target, name in ((self._maintain, "renew"), (self._watch_own, "own-lease")):
            t = threading.Thread(target=target, name=f"subnets-{name}-{self.public_ip}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the threads. The lease stays in etcd until it expires, as with flanneld."""
        with self._cond:
            self._stopped = True
            watch = self._watch
            self._cond.notify_all()
        if watch is not None:
            watch.cancel()
        for t in self._threads:
            t.join(timeout)
        self._threads = []

    def _renew_due(self, lease: Lease) -> float:
        if lease.reservation:
            return float("inf")               # no TTL: nothing to renew
        expiration = lease.expiration if lease.expiration is not None else time.time()
        # flanneld's moment, exactly: a margin close to the TTL is how an operator asks a host to
        # ride out an etcd outage almost as long as the TTL. The expiration is the grant's moment
        # plus our TTL (a key whose etcd lease is another's ends sooner: the gap is then past).
        renewed_at = expiration - self.lease_ttl
        return max(expiration - self.renew_margin, renewed_at + MIN_RENEW_GAP_S)

    def _wait_until(self, due: float, wake_on_lost: bool = True) -> None:
        """Sleep until `due` (unix time), a stop, a change of our key's etcd lease, or (if wake_on_lost)
        a lost lease. Caller holds _cond."""
        while not self._stopped and not self._retime and not (wake_on_lost and self._lost):
            left = due - time.time()
            if left <= 0:
                return
            self._cond.wait(min(left, 3600.0))   # a reservation waits for ever, in bounded steps

    def _maintain(self) -> None:
        due = time.time() if self._rewrite else self._renew_due(self.lease)
        retry_lost = False                    # True after a failed re-acquisition: wait before retrying
        while True:
            with self._cond:
                self._wait_until(due, wake_on_lost=not retry_lost)
                if self._stopped:
                    return
                lost, lease, retime = self._lost, self._lease, self._retime
                self._retime = False
            if lost:
                due, retry_lost = self._reacquire(lease)
                continue
            if retime:
                due = self._renew_due(lease)
                continue
            retry_lost = False
            try:
                renewed = self._renew(lease.subnets)
            except RegistryError as exc:
                left = (lease.expiration or time.time()) - time.time()
                self._renew_failing.fail(
                    str(exc), f"retrying every {self.retry_interval:g} s; the lease stays valid "
                    f"for {max(left, 0) / 60:.0f} more minute(s)", key="renew")
                due = time.time() + self.retry_interval
                continue
            self._renew_failing.ok()
            if renewed is None:
                log.error("Lease %s is now held by another node, acquiring a new one", lease.subnet,
                          extra=fields("lost", lease.subnet, self.public_ip,
                                        reason="held by another node"))
                with self._cond:
                    self._lost = True
                continue
            with self._cond:
                if self._lease is lease:
                    self._lease = renewed
            due = self._renew_due(renewed)
            if renewed.reservation:
                log.info("Lease %s is now a reservation (no TTL): no more renewals", renewed.subnet)
                continue
            self.renewals += 1
            log.info("Lease renewed, new expiration: %s", time.strftime(
                "%Y-%m-%d %H:%M:%S", time.gmtime(renewed.expiration)))

    def _take_back(self, subnets) -> tuple[Optional[Lease], str]:
        """Our key again, for ``subnets`` (our subnet, or with its IPv6 part): created if it is gone, reclaimed if it
        holds garbage, renewed if it still names us. (None, who holds it) when another host's valid
        lease is there; raises RegistryError."""
        key = self.registry.lease_key(subnets)
        for _ in range(3):                    # each write is guarded: a writer in between wins
            kv = self.registry.get_raw(key)
            if kv is None:
                # keys name both parts: the create-if-absent of ours no longer guards the subnet;
                # the listing saves a write, the look after the create (_second) decides
                holder = other_holder(self.registry.list_leases()[0], self.public_ip, subnets)
                if holder:
                    return None, holder
                lease = self.registry.create_lease(subnets, self.attrs, self.lease_ttl)
            else:
                try:
                    held = LeaseAttrs.from_json(kv.value)
                except LeaseFormatError as exc:
                    lease = self.registry.reclaim_lease(subnets, self.attrs, kv.mod_revision,
                                                        self.lease_ttl)
                    if lease is not None:
                        log.warning("Lease key %s held a malformed value (%s): took it back",
                                    key, exc)
                    held = None
                if held is not None and held.public_ip != self.public_ip:
                    return None, f"PublicIP {held.public_ip}"
                if held is not None:
                    lease = self.registry.renew_lease(subnets, self.attrs, self.lease_ttl)
                    if lease is not None and not _recreated(lease):
                        return lease, ""        # the key named us: nothing was taken back
            if lease is not None:
                rival = self._second(lease, others_only=True)
                if rival is not None:
                    return None, f"PublicIP {rival.attrs.public_ip}, key {rival.key}"
                return lease, ""
        return None, "a writer that kept changing it"

    def _reacquire(self, old: Lease) -> tuple[float, bool]:
        """Get a lease again after ours was lost. Returns (when the next action is due, failed)."""
        first = not self._reacquire_failing.failing
        if first:
            log.warning("Lease %s has been revoked, has expired or holds something else: taking "
                        "the key back", old.subnet)
        try:
            lease, holder = self._take_back(old.subnets)
            if lease is None and first:
                log.error("Lease %s is now held by another host (%s): %s", old.subnet, holder,
                          "this host must move to another subnet" if old.ipv6_subnet is None
                          else "this host takes another lease, the same subnet if only the IPv6 "
                          f"part {old.ipv6_subnet} is that host's",
                          extra=fields("lost", old.subnet, self.public_ip,
                                        reason=f"held by {holder}"))
            if lease is None:
                # never the IPv4 subnet given up because of IPv6 (above): the same subnet with
                # another IPv6 part, unless another host holds the subnet itself
                lease = self._acquire({4: old.subnet})
        except Exception as exc:              # etcd down, out of subnets...: keep trying
            self._reacquire_failing.fail(str(exc), f"retrying every {self.reacquire_interval:g} "
                                         "s; forwarding goes on with the peers known",
                                         key="reacquire")
            return time.time() + self.reacquire_interval, True
        self._reacquire_failing.ok()
        with self._cond:
            self._lease = lease
            self._gen += 1
            self._lost = False
            watch = self._watch
            self._cond.notify_all()
        if watch is not None:
            watch.cancel()                    # the watch thread restarts on the new key
        self.reacquisitions += 1
        if (lease.subnet, lease.ipv6_subnet) == (old.subnet, old.ipv6_subnet):
            log.info("Took our lease %s back", lease.subnet,
                     extra=fields("taken_back", lease.subnet, self.public_ip))
        else:
            gone = old.subnet if lease.subnet != old.subnet else old.ipv6_subnet
            log.error("Acquired lease %s (ipv6: %s), was %s (ipv6: %s). That is an outage for "
                      "this host's workloads with addresses in %s: they keep them, and they now "
                      "route to another host, until the workloads are restarted", lease.subnet,
                      v6(lease.ipv6_subnet), old.subnet, v6(old.ipv6_subnet), gone,
                      extra=fields("moved", lease.subnets, self.public_ip,
                                    previous_subnet=str(old.subnet),
                                    previous_ipv6_subnet=v6(old.ipv6_subnet)))
        if self.on_lease_change is not None:
            try:
                self.on_lease_change(lease)
            except Exception:
                log.exception("on_lease_change callback failed")
        return self._renew_due(lease), False

    def _mark_lost(self, why: str) -> None:
        with self._cond:
            if not self._lost:
                log.warning("Own lease: %s", why)
            self._lost = True
            self._cond.notify_all()

    def _names_us(self, value: bytes) -> bool:
        """Whether a value written to our key still holds our lease: flanneld matches on PublicIP alone,
        so a rewrite by another tool (other spacing, extra fields) keeps it; garbage does not."""
        try:
            return LeaseAttrs.from_json(value).public_ip == self.public_ip
        except LeaseFormatError:
            return False

    def _follow_etcd_lease(self, ev) -> None:
        """Our key still names us, but someone detached it from its etcd lease (it is a reservation now)
        or gave our reservation one (it will expire): from now on we keep it as it is, without a TTL,
        or renew it before that TTL runs out, as we would after a restart."""
        with self._cond:
            cur = self._lease
            if cur is None or cur.key != ev.key or cur.reservation == (ev.lease_id == 0):
                return
            self._lease = replace(cur, lease_id=ev.lease_id, mod_revision=ev.mod_revision,
                                  expiration=None if ev.lease_id == 0 else time.time())
            self._retime = True
            self._cond.notify_all()
        log.warning("Own lease %s %s", cur.subnet, "is now a reservation (no TTL): no more renewals"
                    if ev.lease_id == 0 else "was given a TTL: renewing it as a lease from now on")

    def _watch_own(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                lease, gen = self._lease, self._gen

                def on_events(events, _rev, lease=lease):
                    for ev in events:
                        if ev.kind == "delete":
                            self._mark_lost(f"{lease.subnet} deleted from etcd")
                        elif not self._names_us(ev.value):
                            self._mark_lost(f"{lease.subnet} overwritten: {clip(ev.value)}")
                        else:
                            self._follow_etcd_lease(ev)

                def on_compacted(lease=lease):
                    kvs, rev = self.registry.get(lease.key)
                    if not kvs or not self._names_us(kvs[0].value):
                        self._mark_lost(f"{lease.subnet} gone after a compaction")
                    return rev

                watch = self.registry.watch_loop(
                    lease.key, prefix=False, start_revision=lease.mod_revision + 1, on_events=on_events,
                    on_compacted=on_compacted, retry_interval=self.watch_retry_interval,
                    name=f"own lease {lease.subnet}")
                self._watch = watch
            watch.run()
            with self._cond:
                # Wait for the maintenance thread to replace the lease before watching again.
                while not self._stopped and self._gen == gen:
                    self._cond.wait()
