"""flannel's keys in etcd: the network config and the subnet leases (docs/flannel-compat.md#etcd-keys).

Keys: `<prefix>/config` (the network config JSON) and `<prefix>/subnets/<a.b.c.d>-<len>` (one lease per
node, attached to a 24 h etcd lease, or to none: a reservation), `...-<len>&<v6>-<len6>` for a dual-stack
lease: the lease calls take the lease's parts (IPv4 first) as one value, since both make the key's name. A lease key's name and value are
control/lease.py's; this module reads, creates, renews, reclaims and deletes them with flanneld's
transactions. Registry is the client the daemon holds: an etcd client (control/etcd.py: endpoints,
failover, auth, TLS, what the log says of failures) that knows these keys, and hands out watches on
them (control/etcd_watch.py). The errors it raises are control/etcd_errors.py's, and the config's.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from .config import NetworkConfig, parse_config
from .etcd import DEFAULT_ENDPOINTS, EtcdClient
from .etcd_errors import RegistryError
from .etcd_watch import WatchLoop
from .lease import (Lease, LeaseAttrs, LeaseFormatError, lease_from_kv, leases_of_kvs,
                    split_parts, subnet_key_name)
from . import defaults

log = logging.getLogger(__name__)

DEFAULT_PREFIX = defaults.DEFAULT_PREFIX
SUBNET_TTL = 24 * 3600
CONFIG_NOT_FOUND = "flannel config not found in etcd store. Did you create your config using etcdv3 API?"


class ConfigNotFoundError(RegistryError):
    def __init__(self):
        super().__init__(CONFIG_NOT_FOUND)


@dataclass(frozen=True)
class BadLease:
    """A key under `<prefix>/subnets/` that is no lease: its key or its value does not parse."""
    key: str
    problem: str
    mod_revision: int = 0


class Registry(EtcdClient):
    """Network config and subnet leases in etcd, with flanneld's layout. Thread-safe."""

    def __init__(self, endpoints: "list[str] | str" = DEFAULT_ENDPOINTS, prefix: str = DEFAULT_PREFIX,
                 keyfile: Optional[str] = None, certfile: Optional[str] = None, cafile: Optional[str] = None,
                 username: Optional[str] = None, password: Optional[str] = None, *, timeout: float = 5.0,
                 warn_insecure: bool = True):
        super().__init__(endpoints, prefix, keyfile, certfile, cafile, username, password,
                         timeout=timeout, warn_insecure=warn_insecure)
        self.config_key = f"{self.prefix}/config"
        self.subnets_prefix = f"{self.prefix}/subnets/"

    def current_revision(self) -> int:
        return self.get(self.config_key)[1]

    # -- network config -----------------------------------------------------------------------------
    def get_config(self) -> NetworkConfig:
        """Read and check the network config; ConfigNotFoundError, ConfigError or RegistryError."""
        kvs, _ = self.get(self.config_key)
        if not kvs:
            raise ConfigNotFoundError()
        return parse_config(kvs[0].value.decode("utf-8", errors="replace"))

    def put_config(self, text: str) -> None:
        self.put(self.config_key, text)

    # -- leases -------------------------------------------------------------------------------------
    def lease_key(self, subnets) -> str:
        """The key of ``subnets``: a subnet, or a lease's parts (IPv4 first)."""
        return self.subnets_prefix + subnet_key_name(subnets)

    def _lease(self, kv, with_ttl: bool, quiet: bool = False) -> "Lease | BadLease":
        key = kv.key.decode("utf-8", errors="replace")
        try:
            lease = lease_from_kv(key, kv.value, lease_id=kv.lease, mod_revision=kv.mod_revision,
                                  create_revision=kv.create_revision)
        except LeaseFormatError as exc:
            if not quiet:
                log.warning("skipping malformed lease %s: %s", key, exc,
                            extra={"event": "lease_skipped", "key": key, "reason": str(exc)})
            return BadLease(key, str(exc), kv.mod_revision)
        if with_ttl and kv.lease:                 # a reservation never expires: no expiration
            lease = replace(lease, expiration=time.time() + self.time_to_live(kv.lease))
        return lease

    def scan_leases(self) -> tuple[list[Lease], list[BadLease], int]:
        """Every key under `<prefix>/subnets/`: (parsable leases, malformed ones, revision), no logging
        (the caller decides how often to say what is wrong)."""
        kvs, rev = self.get(self.subnets_prefix, prefix=True)
        out = leases_of_kvs(kvs, lambda kv: self._lease(kv, False, quiet=True))
        return ([x for x in out if isinstance(x, Lease)], [x for x in out if isinstance(x, BadLease)],
                rev)

    def list_leases(self, with_ttl: bool = False,
                    malformed: Optional[list] = None) -> tuple[list[Lease], int]:
        """All parsable leases under `<prefix>/subnets/` and the revision of that snapshot;
        the keys that are no lease (BadLease) are appended to ``malformed`` when given (the
        listing is then whole: a peer watch can start from it, as scan_leases')."""
        kvs, rev = self.get(self.subnets_prefix, prefix=True)
        out = ([self._lease(kv, True) for kv in kvs] if with_ttl
               else leases_of_kvs(kvs, lambda kv: self._lease(kv, False)))
        if malformed is not None:
            malformed.extend(x for x in out if isinstance(x, BadLease))
        return [x for x in out if isinstance(x, Lease)], rev

    def create_lease(self, subnets, attrs: LeaseAttrs, ttl: int = SUBNET_TTL) -> Optional[Lease]:
        """flanneld's createSubnet: grant `ttl`, then put only if the key is absent (one txn).

        Returns the lease, or None when the key already exists (the granted etcd lease is revoked)."""
        return self._put_lease_if(subnets, attrs, ttl, 0, "create lease")

    def reclaim_lease(self, subnets, attrs: LeaseAttrs, mod_revision: int,
                      ttl: int = SUBNET_TTL) -> Optional[Lease]:
        """Take over a lease key that holds a malformed value (nobody's lease): grant `ttl` and put
        ours only if the key is still the one we read (its mod revision). None if it changed."""
        return self._put_lease_if(subnets, attrs, ttl, mod_revision, "reclaim lease")

    def renew_lease(self, subnets, attrs: LeaseAttrs, ttl: int = SUBNET_TTL,
                    attempts: int = 3) -> Optional[Lease]:
        """flanneld's updateSubnet: our value put again under the subnet's key, with a new grant of `ttl`.

        The key is ours when its PublicIP is ours, whatever else its value holds (other fields, order,
        spacing: other flannels wrote it) or when it is absent. A key with no etcd lease (a
        reservation) is put again without one. Guarded so that we never overwrite a key that another
        node took after ours expired: the put is a transaction comparing the mod revision we read
        (or absence), so a change between our read and our put wins; we then read again, up to
        `attempts` times. Returns None if the key holds another PublicIP or a value that is no lease.
        A key put where there was none comes back with ``create_revision == mod_revision``
        (``created``): for a dual key, only the caller's look after it can see an overlap."""
        key = self.lease_key(subnets)
        for _ in range(attempts):
            kv = self.get_raw(key)
            if kv is None:
                lease = self._put_lease_if(subnets, attrs, ttl, 0, "renew lease")
            else:
                try:
                    held = LeaseAttrs.from_json(kv.value)
                except LeaseFormatError:
                    return None
                if held.public_ip != attrs.public_ip:
                    return None
                lease = self._put_lease_if(subnets, attrs, ttl if kv.lease else 0, kv.mod_revision,
                                           "renew lease")
            if lease is not None:
                return lease
        return None

    def _put_lease_if(self, subnets, attrs: LeaseAttrs, ttl: int, mod_revision: int,
                      what: str) -> Optional[Lease]:
        """Grant `ttl` and put our lease under the subnet's key in one txn if the key is still at
        `mod_revision` (absent when 0); None (and the grant revoked) if it is not. A `ttl` of 0
        puts the key with no etcd lease (a reservation stays one)."""
        subnet, ipv6_subnet = split_parts(subnets)
        key = self.lease_key(subnets)
        lease_id = self.grant(ttl) if ttl > 0 else 0
        revision = self.put_if(key, attrs.to_json(), mod_revision=mod_revision, lease_id=lease_id,
                               what=what)
        if revision is None:
            if lease_id:
                self.revoke(lease_id)
            return None
        # a create's revision is the key's creation: the caller tells a renewal that re-created
        # a vanished key by it (a dual key so made must look for overlaps, as any create)
        return Lease(subnet=subnet, attrs=attrs, ipv6_subnet=ipv6_subnet,
                     expiration=time.time() + ttl if lease_id else None,
                     lease_id=lease_id, mod_revision=revision, key=key,
                     create_revision=revision if mod_revision == 0 else 0)

    def delete_lease(self, subnets) -> bool:
        return self.delete(self.lease_key(subnets)) > 0

    # -- watches ------------------------------------------------------------------------------------
    def watch_loop(self, key: str, *, prefix: bool, start_revision: int,
                   on_events: Callable[[list, int], None], on_compacted: Callable[[], int],
                   retry_interval: float = 1.0, name: str = "") -> WatchLoop:
        """A watch of ``key`` (or every key under it) on this client; control/etcd_watch.py."""
        return WatchLoop(self, key, prefix=prefix, start_revision=start_revision, on_events=on_events,
                         on_compacted=on_compacted, retry_interval=retry_interval, name=name)
