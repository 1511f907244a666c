"""The etcd v3 registry: the only module that talks to etcd (docs/flannel-compat.md#etcd-keys).

Keys: `<prefix>/config` (the network config JSON) and `<prefix>/subnets/<a.b.c.d>-<len>` (one lease per
node, attached to a 24 h etcd lease, or to none: a reservation). The client is the generated gRPC API
shipped by `etcd-sdk-python` (`pyetcd.etcdrpc`, the same protobufs as the `etcd3` package) driven
directly, because this module needs control that `MultiEndpointEtcd3Client` does not give:

* failover: every unary call goes to the current endpoint; UNAVAILABLE / DEADLINE_EXCEEDED moves to the
  next endpoint and retries there, once per endpoint, before the call fails with RegistryError;
* auth: `Authenticate` gives a token sent as `token` metadata; an expired token (UNAUTHENTICATED) is
  renewed once and the call retried;
* TLS when a client key and cert are given (as flanneld) or the endpoint scheme is https (CA optional);
* gRPC keepalive every 10 s with a 5 s timeout, only while a call is open: etcd's server enforces a 5 s
  minimum and no pings without streams (`--grpc-keepalive-min-time`), a faster client gets GOAWAY;
* watches are our own bidi streams (WatchLoop): all events of every response are delivered, the cursor is
  the last event's revision, a broken stream resumes from cursor + 1 on the next endpoint, and a compacted
  cursor calls back the owner to re-list and continue from the list's revision + 1.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from ipaddress import IPv4Network
from typing import Callable, Optional
from urllib.parse import urlsplit

import grpc
from pyetcd import etcdrpc
from pyetcd.etcdrpc import kv_pb2

from .config import ConfigError, NetworkConfig, parse_config
from .lease import Lease, LeaseAttrs, LeaseFormatError, lease_from_kv, subnet_key_name

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/coreos.com/network"
DEFAULT_ENDPOINTS = ("http://127.0.0.1:4001", "http://127.0.0.1:2379")
SUBNET_TTL = 24 * 3600
CONFIG_NOT_FOUND = "flannel config not found in etcd store. Did you create your config using etcdv3 API?"

_FAILOVER_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),          # never below etcd's 5 s minimum
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),  # etcd: PermitWithoutStream=false
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.max_receive_message_length", 64 << 20),   # a big lease list in one Range response
]


class RegistryError(Exception):
    """etcd could not be reached on any endpoint, or refused the request."""


class ConfigNotFoundError(RegistryError):
    def __init__(self):
        super().__init__(CONFIG_NOT_FOUND)


class RegistryClosedError(RegistryError):
    pass


class CompactedError(RegistryError):
    def __init__(self, compact_revision: int):
        super().__init__(f"required revision has been compacted (compact revision {compact_revision})")
        self.compact_revision = compact_revision


@dataclass(frozen=True)
class BadLease:
    """A key under `<prefix>/subnets/` that is no lease: its key or its value does not parse."""
    key: str
    problem: str
    mod_revision: int = 0


@dataclass(frozen=True)
class WatchEvent:
    kind: str            # "put" or "delete"
    key: str
    value: bytes
    mod_revision: int
    lease_id: int


def _range_end(prefix: bytes) -> bytes:
    """The end of the key range that holds every key starting with `prefix` (etcd's GetPrefixRangeEnd)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


class _Endpoint:
    def __init__(self, url: str, creds: Optional[grpc.ChannelCredentials], force_tls: bool = False):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        self.url = url
        if parts.scheme in ("unix", "unixs"):
            # as etcd's client: unix://NAME is the socket NAME in the working directory (etcd's
            # own --listen-client-urls unix://localhost:2379 makes one), unix:///PATH an absolute path
            self.target = f"unix:{parts.netloc}{parts.path}"
        elif not parts.hostname or not parts.port:
            raise ValueError(f"bad etcd endpoint {url!r}: want scheme://host:port")
        else:
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
            self.target = f"{host}:{parts.port}"
        self.secure = force_tls or parts.scheme in ("https", "unixs")
        self._creds = creds
        self._channel: Optional[grpc.Channel] = None
        self._closed = False
        self._lock = threading.Lock()          # guards _channel and _closed

    def channel(self) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise RegistryClosedError("the etcd registry is closed")
            if self._channel is None:
                if self.secure:
                    creds = self._creds or grpc.ssl_channel_credentials()
                    self._channel = grpc.secure_channel(self.target, creds, options=_CHANNEL_OPTIONS)
                else:
                    self._channel = grpc.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
            return self._channel

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._channel is not None:
                self._channel.close()
                self._channel = None


class Registry:
    """Network config and subnet leases in etcd, with flanneld's layout. Thread-safe."""

    def __init__(self, endpoints: "list[str] | str" = DEFAULT_ENDPOINTS, prefix: str = DEFAULT_PREFIX,
                 keyfile: Optional[str] = None, certfile: Optional[str] = None, cafile: Optional[str] = None,
                 username: Optional[str] = None, password: Optional[str] = None, *, timeout: float = 5.0,
                 warn_insecure: bool = True):
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise ValueError("no etcd endpoints")
        # What another process needs to make the same client (control/peer_process.py).
        self.spec = {"endpoints": list(endpoints), "prefix": prefix, "keyfile": keyfile,
                     "certfile": certfile, "cafile": cafile, "username": username,
                     "password": password, "timeout": timeout}
        self.prefix = prefix.rstrip("/") or "/"
        self.config_key = f"{self.prefix}/config"
        self.subnets_prefix = f"{self.prefix}/subnets/"
        self.timeout = timeout
        creds = None
        if keyfile or certfile or cafile:
            if bool(keyfile) != bool(certfile):
                raise ValueError("etcd TLS needs both a key file and a cert file")
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(cafile), private_key=_read(keyfile), certificate_chain=_read(certfile))
        # As flanneld: a client key and cert mean TLS (for every endpoint); an https:// endpoint also
        # gets TLS, verified against the CA file or the system roots.
        self._endpoints = [_Endpoint(e.strip(), creds, force_tls=bool(keyfile and certfile)) for e in endpoints]
        if warn_insecure and not all(ep.secure for ep in self._endpoints):
            log.warning("connecting to etcd with http (%s)",
                        ", ".join(ep.url for ep in self._endpoints if not ep.secure))
        self._cur = 0
        self._lock = threading.Lock()          # guards _cur and _token
        self._username, self._password = username, password
        if bool(username) != bool(password) and (username or password):
            raise ValueError("etcd auth needs both a username and a password")
        self._token: Optional[str] = None

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def endpoints(self) -> list[str]:
        return [ep.url for ep in self._endpoints]

    @property
    def current_endpoint(self) -> str:
        return self._endpoints[self._cur].url

    def close(self) -> None:
        for ep in self._endpoints:
            ep.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _failover(self, failed: int) -> None:
        with self._lock:
            if self._cur == failed and len(self._endpoints) > 1:
                self._cur = (failed + 1) % len(self._endpoints)
                log.warning("etcd endpoint %s failed, switching to %s",
                            self._endpoints[failed].url, self._endpoints[self._cur].url)

    def _metadata(self, channel: grpc.Channel, refresh: bool = False) -> tuple:
        if not self._username:
            return ()
        with self._lock:
            token = self._token
        if token is None or refresh:
            resp = etcdrpc.AuthStub(channel).Authenticate(
                etcdrpc.AuthenticateRequest(name=self._username, password=self._password),
                timeout=self.timeout)
            token = resp.token
            with self._lock:
                self._token = token
        return (("token", token),)

    def _call(self, what: str, fn: Callable):
        """Run `fn(channel, metadata)` on the current endpoint, failing over on unavailability."""
        last: Optional[grpc.RpcError] = None
        for _ in range(len(self._endpoints)):
            idx = self._cur
            channel = self._endpoints[idx].channel()
            try:
                try:
                    return fn(channel, self._metadata(channel))
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAUTHENTICATED or not self._username:
                        raise
                    return fn(channel, self._metadata(channel, refresh=True))
            except grpc.RpcError as exc:
                last = exc
                if exc.code() not in _FAILOVER_CODES:
                    raise RegistryError(f"etcd {what}: {exc.code().name}: {exc.details()}") from None
                self._failover(idx)
        detail = f"{last.code().name}: {last.details()}" if last is not None else "no endpoint"
        raise RegistryError(f"etcd {what} failed on every endpoint ({', '.join(self.endpoints)}): {detail}")

    # -- raw key/value operations (also used by tests and tools) ---------------------------------
    def get(self, key: str, prefix: bool = False) -> tuple[list, int]:
        """Return ([KeyValue...], header revision)."""
        k = key.encode()
        req = etcdrpc.RangeRequest(key=k, range_end=_range_end(k) if prefix else b"")
        resp = self._call("get", lambda ch, md: etcdrpc.KVStub(ch).Range(req, timeout=self.timeout, metadata=md))
        return list(resp.kvs), resp.header.revision

    def put(self, key: str, value: "bytes | str", lease_id: int = 0) -> int:
        req = etcdrpc.PutRequest(key=key.encode(), value=_b(value), lease=lease_id)
        resp = self._call("put", lambda ch, md: etcdrpc.KVStub(ch).Put(req, timeout=self.timeout, metadata=md))
        return resp.header.revision

    def delete(self, key: str, prefix: bool = False) -> int:
        k = key.encode()
        req = etcdrpc.DeleteRangeRequest(key=k, range_end=_range_end(k) if prefix else b"")
        resp = self._call("delete",
                          lambda ch, md: etcdrpc.KVStub(ch).DeleteRange(req, timeout=self.timeout, metadata=md))
        return resp.deleted

    def txn_put_delete(self, puts: "dict[str, bytes | str]", deletes: "list[str]" = ()) -> int:
        """One transaction doing several puts and deletes (one etcd revision). Returns the revision."""
        ops = [etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=k.encode(), value=_b(v)))
               for k, v in puts.items()]
        ops += [etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=k.encode()))
                for k in deletes]
        req = etcdrpc.TxnRequest(success=ops)
        resp = self._call("txn", lambda ch, md: etcdrpc.KVStub(ch).Txn(req, timeout=self.timeout, metadata=md))
        return resp.header.revision

    def grant(self, ttl: int) -> int:
        req = etcdrpc.LeaseGrantRequest(TTL=int(ttl))
        resp = self._call("lease grant",
                          lambda ch, md: etcdrpc.LeaseStub(ch).LeaseGrant(req, timeout=self.timeout, metadata=md))
        if resp.error:
            raise RegistryError(f"etcd lease grant: {resp.error}")
        return resp.ID

    def revoke(self, lease_id: int) -> None:
        req = etcdrpc.LeaseRevokeRequest(ID=lease_id)
        try:
            self._call("lease revoke",
                       lambda ch, md: etcdrpc.LeaseStub(ch).LeaseRevoke(req, timeout=self.timeout, metadata=md))
        except RegistryError as exc:
            log.debug("revoking etcd lease %x: %s", lease_id, exc)

    def time_to_live(self, lease_id: int) -> int:
        """Remaining TTL in seconds; -1 for no lease or an expired one (as flanneld's lookup)."""
        if not lease_id:
            return -1
        req = etcdrpc.LeaseTimeToLiveRequest(ID=lease_id)
        resp = self._call("lease ttl", lambda ch, md: etcdrpc.LeaseStub(ch).LeaseTimeToLive(
            req, timeout=self.timeout, metadata=md))
        return resp.TTL

    def current_revision(self) -> int:
        return self.get(self.config_key)[1]

    def compact(self, revision: int) -> None:
        req = etcdrpc.CompactionRequest(revision=revision, physical=True)
        self._call("compact", lambda ch, md: etcdrpc.KVStub(ch).Compact(req, timeout=self.timeout, metadata=md))

    # -- network config -----------------------------------------------------------------------------
    def get_config_text(self) -> str:
        kvs, _ = self.get(self.config_key)
        if not kvs:
            raise ConfigNotFoundError()
        return kvs[0].value.decode("utf-8", errors="replace")

    def get_config(self) -> NetworkConfig:
        """Read and check the network config; ConfigNotFoundError, ConfigError or RegistryError."""
        return parse_config(self.get_config_text())

    def put_config(self, text: str) -> None:
        self.put(self.config_key, text)

    # -- leases -------------------------------------------------------------------------------------
    def lease_key(self, subnet: IPv4Network) -> str:
        return self.subnets_prefix + subnet_key_name(subnet)

    def _lease(self, kv, with_ttl: bool, quiet: bool = False) -> "Lease | BadLease":
        key = kv.key.decode("utf-8", errors="replace")
        try:
            lease = lease_from_kv(key, kv.value, lease_id=kv.lease, mod_revision=kv.mod_revision)
        except LeaseFormatError as exc:
            if not quiet:
                log.warning("skipping malformed lease %s: %s", key, exc)
            return BadLease(key, str(exc), kv.mod_revision)
        if with_ttl and kv.lease:                 # a reservation never expires: no expiration
            lease = replace(lease, expiration=time.time() + self.time_to_live(kv.lease))
        return lease

    def scan_leases(self) -> tuple[list[Lease], list["BadLease"], int]:
        """Every key under `<prefix>/subnets/`: (parsable leases, malformed ones, revision), no logging
        (the caller decides how often to say what is wrong)."""
        kvs, rev = self.get(self.subnets_prefix, prefix=True)
        out = [self._lease(kv, False, quiet=True) for kv in kvs]
        return ([x for x in out if isinstance(x, Lease)], [x for x in out if isinstance(x, BadLease)],
                rev)

    def list_leases(self, with_ttl: bool = False) -> tuple[list[Lease], int]:
        """All parsable leases under `<prefix>/subnets/` and the revision of that snapshot."""
        kvs, rev = self.get(self.subnets_prefix, prefix=True)
        leases = [x for x in (self._lease(kv, with_ttl) for kv in kvs) if isinstance(x, Lease)]
        return leases, rev

    def get_lease(self, subnet: IPv4Network, with_ttl: bool = False) -> tuple[Optional[Lease], int]:
        kvs, rev = self.get(self.lease_key(subnet))
        lease = self._lease(kvs[0], with_ttl) if kvs else None
        return (lease if isinstance(lease, Lease) else None), rev

    def reclaim_lease(self, subnet: IPv4Network, attrs: LeaseAttrs, mod_revision: int,
                      ttl: int = SUBNET_TTL) -> Optional[Lease]:
        """Take over a lease key that holds a malformed value (nobody's lease): grant `ttl` and put
        ours only if the key is still the one we read (its mod revision). None if it changed."""
        cmp = etcdrpc.Compare(key=self.lease_key(subnet).encode(), target=etcdrpc.Compare.MOD,
                              result=etcdrpc.Compare.EQUAL, mod_revision=mod_revision)
        return self._put_lease_if(subnet, attrs, ttl, cmp, "reclaim lease")

    def _put_lease_if(self, subnet: IPv4Network, attrs: LeaseAttrs, ttl: int, cmp,
                      what: str) -> Optional[Lease]:
        """Grant `ttl` and put our lease under the subnet's key in one txn if `cmp` holds;
        None (and the grant revoked) if it does not. A `ttl` of 0 puts the key with no etcd lease
        (a reservation stays one)."""
        key = self.lease_key(subnet)
        lease_id = self.grant(ttl) if ttl > 0 else 0
        req = etcdrpc.TxnRequest(
            compare=[cmp],
            success=[etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key.encode(),
                                                                      value=attrs.to_json(),
                                                                      lease=lease_id))])
        resp = self._call(what,
                          lambda ch, md: etcdrpc.KVStub(ch).Txn(req, timeout=self.timeout, metadata=md))
        if not resp.succeeded:
            if lease_id:
                self.revoke(lease_id)
            return None
        return Lease(subnet=subnet, attrs=attrs, expiration=time.time() + ttl if lease_id else None,
                     lease_id=lease_id, mod_revision=resp.header.revision, key=key)

    def get_raw(self, key: str):
        """The KeyValue under `key` (value, mod_revision...) or None."""
        kvs, _ = self.get(key)
        return kvs[0] if kvs else None

    def create_lease(self, subnet: IPv4Network, attrs: LeaseAttrs, ttl: int = SUBNET_TTL) -> Optional[Lease]:
        """flanneld's createSubnet: grant `ttl`, then put only if the key is absent (one txn).

        Returns the lease, or None when the key already exists (the granted etcd lease is revoked)."""
        cmp = etcdrpc.Compare(key=self.lease_key(subnet).encode(), target=etcdrpc.Compare.VERSION,
                              result=etcdrpc.Compare.EQUAL, version=0)
        return self._put_lease_if(subnet, attrs, ttl, cmp, "create lease")

    def renew_lease(self, subnet: IPv4Network, attrs: LeaseAttrs, ttl: int = SUBNET_TTL,
                    attempts: int = 3) -> Optional[Lease]:
        """flanneld's updateSubnet: our value put again under the subnet's key, with a new grant of `ttl`.

        The key is ours when its PublicIP is ours, whatever else its value holds (other fields, order,
        spacing: other flannels wrote it) or when it is absent. A key with no etcd lease (a
        reservation) is put again without one. Guarded so that we never overwrite a key that another
        node took after ours expired: the put is a transaction comparing the mod revision we read
        (or absence), so a change between our read and our put wins; we then read again, up to
        `attempts` times. Returns None if the key holds another PublicIP or a value that is no lease."""
        key = self.lease_key(subnet).encode()
        for _ in range(attempts):
            kv = self.get_raw(key.decode())
            if kv is None:
                cmp = etcdrpc.Compare(key=key, target=etcdrpc.Compare.VERSION,
                                      result=etcdrpc.Compare.EQUAL, version=0)
                lease = self._put_lease_if(subnet, attrs, ttl, cmp, "renew lease")
            else:
                try:
                    held = LeaseAttrs.from_json(kv.value)
                except LeaseFormatError:
                    return None
                if held.public_ip != attrs.public_ip:
                    return None
                cmp = etcdrpc.Compare(key=key, target=etcdrpc.Compare.MOD,
                                      result=etcdrpc.Compare.EQUAL, mod_revision=kv.mod_revision)
                lease = self._put_lease_if(subnet, attrs, ttl if kv.lease else 0, cmp, "renew lease")
            if lease is not None:
                return lease
        return None

    def delete_lease(self, subnet: IPv4Network) -> bool:
        return self.delete(self.lease_key(subnet)) > 0

    # -- watches ------------------------------------------------------------------------------------
    def watch_loop(self, key: str, *, prefix: bool, start_revision: int,
                   on_events: Callable[[list, int], None], on_compacted: Callable[[], int],
                   retry_interval: float = 1.0, name: str = "") -> "WatchLoop":
        return WatchLoop(self, key, prefix=prefix, start_revision=start_revision, on_events=on_events,
                         on_compacted=on_compacted, retry_interval=retry_interval, name=name)


class WatchLoop:
    """A resumable watch of one key or prefix, run in the caller's thread by run() until cancel().

    on_events(events, revision) gets every event of every response, in revision order, where revision
    is the cursor after the batch. on_compacted() is called when the cursor was compacted: it must
    re-list and return the list's revision; the watch then continues from that revision + 1.
    Exceptions raised by the callbacks are logged and the watch resumes from the same cursor."""

    def __init__(self, registry: Registry, key: str, *, prefix: bool, start_revision: int,
                 on_events, on_compacted, retry_interval: float, name: str):
        self._reg = registry
        self._key = key.encode()
        self._range_end = _range_end(self._key) if prefix else b""
        self.next_revision = start_revision
        self._on_events = on_events
        self._on_compacted = on_compacted
        self.retry_interval = retry_interval
        self.name = name or key
        self._stop = threading.Event()
        self._lock = threading.Lock()          # guards _call
        self._call = None
        self.reconnects = 0
        self.resyncs = 0
        self.connected = threading.Event()     # set while a stream is established

    def cancel(self) -> None:
        self._stop.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def run(self) -> None:
        while not self._stop.is_set():
            idx = self._reg._cur
            try:
                self._stream(idx)
            except RegistryClosedError:
                log.info("watch %s: registry closed, stopping", self.name)
                return
            except CompactedError as exc:
                log.warning("watch %s: revision %d compacted (at %d), re-listing",
                            self.name, self.next_revision, exc.compact_revision)
                try:
                    self.next_revision = self._on_compacted() + 1
                    self.resyncs += 1
                    continue
                except Exception as exc2:           # etcd down again: retry the whole thing later
                    log.warning("watch %s: re-list failed: %s", self.name, exc2)
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    break
                log.warning("watch %s: stream broken (%s: %s), resuming from revision %d",
                            self.name, exc.code().name, exc.details(), self.next_revision)
                if exc.code() in _FAILOVER_CODES or exc.code() == grpc.StatusCode.UNKNOWN:
                    self._reg._failover(idx)
            except Exception as exc:
                if self._stop.is_set():
                    break
                log.warning("watch %s: %s, resuming from revision %d", self.name, exc, self.next_revision)
                self._reg._failover(idx)
            finally:
                self.connected.clear()
            self.reconnects += 1
            self._stop.wait(self.retry_interval)

    def _stream(self, idx: int) -> None:
        channel = self._reg._endpoints[idx].channel()
        # After any failure, authenticate again: an etcd restart or a token expiry invalidates the token,
        # and a watch created with a stale one is cancelled rather than refused with UNAUTHENTICATED.
        metadata = self._reg._metadata(channel, refresh=self.reconnects > 0) + (("hasleader", "true"),)
        create = etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
            key=self._key, range_end=self._range_end, start_revision=self.next_revision,
            progress_notify=True))
        done = threading.Event()

        def requests():
            yield create
            # Keep our half of the stream open until the watch ends: closing it would end the watch.
            while not done.wait(1.0) and not self._stop.is_set():
                pass

        call = etcdrpc.WatchStub(channel).Watch(requests(), metadata=metadata)
        with self._lock:
            self._call = call
        if self._stop.is_set():
            call.cancel()
        try:
            for resp in call:
                if resp.compact_revision:
                    raise CompactedError(resp.compact_revision)
                if resp.canceled:
                    raise RegistryError(f"watch canceled by etcd: {resp.cancel_reason or 'no reason'}")
                if resp.created:
                    self.connected.set()
                if resp.events:
                    events = [WatchEvent("delete" if ev.type == kv_pb2.Event.DELETE else "put",
                                         ev.kv.key.decode("utf-8", errors="replace"), ev.kv.value,
                                         ev.kv.mod_revision, ev.kv.lease) for ev in resp.events]
                    cursor = events[-1].mod_revision + 1
                    self._on_events(events, cursor - 1)
                    self.next_revision = cursor
                elif not resp.created and resp.header.revision >= self.next_revision:
                    # A progress notification: everything up to header.revision has been sent.
                    self.next_revision = resp.header.revision + 1
            if not self._stop.is_set():
                raise RegistryError("watch stream ended")
        finally:
            done.set()
            with self._lock:
                self._call = None
            call.cancel()


def _b(v: "bytes | str") -> bytes:
    return v if isinstance(v, bytes) else v.encode()


def _read(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def wait_for_config(registry: Registry, stop: Optional[threading.Event] = None, interval: float = 1.0,
                    timeout: Optional[float] = None) -> NetworkConfig:
    """Block until `<prefix>/config` exists and is valid, retrying every `interval` s as flanneld does.

    Each failed attempt logs why (missing, invalid with flanneld's message, or etcd unreachable).
    Raises TimeoutError after `timeout` s, or RegistryError('stopped') when `stop` is set."""
    deadline = None if timeout is None else time.monotonic() + timeout
    stop = stop or threading.Event()
    while True:
        try:
            return registry.get_config()
        except ConfigNotFoundError as exc:
            log.error("Couldn't fetch network config: %s (key %s), retrying in %gs",
                      exc, registry.config_key, interval)
        except ConfigError as exc:
            log.error("Couldn't fetch network config: invalid config at %s: %s, retrying in %gs",
                      registry.config_key, exc, interval)
        except RegistryError as exc:
            log.error("Couldn't fetch network config: %s, retrying in %gs", exc, interval)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"no valid network config at {registry.config_key} after {timeout}s")
        if stop.wait(interval):
            raise RegistryError("stopped while waiting for the network config")
