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

Failures are of two kinds, and the log says each once (control/recurring.py), whichever loop meets it:
* etcd unreachable (every endpoint down, or a watch that cannot open a stream): RegistryUnavailableError;
  one WARNING with the cause when it begins, a reminder a minute (with what the owners say of the state
  of things: the peer routes kept, `add_note`), one line when any call succeeds again. The endpoint
  switches are said once per endpoint and outage.
* refusals no retry mends: RegistryDeniedError, logged at ERROR with the flag to fix: a wrong user or
  password, a missing permission on the prefix (per operation), a TLS certificate refused either way
  (ours by etcd, etcd's by our CA file) or not given when etcd requires one. At startup the daemon exits
  on them, as flanneld does; a running daemon keeps forwarding and retrying.
A stale token (expired, or older than a change of etcd's users and roles) is renewed and the call
retried at once; etcd without auth enabled is used without a token (as etcd's Go client does).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from ipaddress import IPv4Network
from typing import Callable, Optional
from urllib.parse import urlsplit

# gRPC's C core writes its own lines to the process's stderr, past the daemon's logger, level and
# format: a refused TLS handshake is two lines a second of "ssl_transport_security_utils.cc ...
# Corruption detected". The messages of this module say what failed and which flag fixes it, so the
# core stays silent unless the operator asked for its log. The core reads these variables when it
# starts, so they are set before grpc is first imported (here: this is the module that imports it).
# An empty variable (an environment file's `GRPC_VERBOSITY=`) asks for nothing.
if not os.environ.get("GRPC_VERBOSITY") and not os.environ.get("GRPC_TRACE"):
    os.environ["GRPC_VERBOSITY"] = "NONE"

import grpc
from pyetcd import etcdrpc
from pyetcd.etcdrpc import kv_pb2

from .config import ConfigError, NetworkConfig, parse_config
from .lease import Lease, LeaseAttrs, LeaseFormatError, lease_from_kv, subnet_key_name
from .recurring import Recurring

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


class RewoundError(CompactedError):
    """etcd is at a revision below our cursor: restored from an older backup (or a new cluster at
    the same endpoints). Events past its revision will come again with other contents, and
    whatever happened after the backup is gone, so the watcher lists anew, as after a compaction."""

    def __init__(self, revision: int, cursor: int):
        RegistryError.__init__(self, f"etcd is at revision {revision}, behind our cursor {cursor} "
                                     "(restored from an older backup?)")
        self.compact_revision = revision


class RegistryUnavailableError(RegistryError):
    """No endpoint answered (down, unreachable, the connection closed): a retry may succeed."""


class RegistryDeniedError(RegistryError):
    """etcd refused us in a way no retry mends until an operator acts: the message says what was
    refused and which flag (or which etcd role) to fix. ``reason`` is one of REFUSALS."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


# Why etcd refused us (RegistryDeniedError.reason): "auth" (user and password), "permission" (the
# user's role, per operation), and the TLS handshake: "tls-client" (our certificate refused, or none
# given where one is required), "tls-server" (etcd's certificate not trusted by our CA),
# "tls-name" (etcd's certificate does not name the endpoint), "tls-files" (our TLS files unusable).
REFUSALS = ("auth", "permission", "tls-client", "tls-server", "tls-name", "tls-files")
_TLS_REFUSALS = frozenset(r for r in REFUSALS if r.startswith("tls-"))

# etcd's own words (server/etcdserver/api/v3rpc/rpctypes), matched in a status's details.
_AUTH_FAILED = "authentication failed"
_AUTH_NOT_ENABLED = "authentication is not enabled"
_USER_EMPTY = "user name is empty"
_PERMISSION_DENIED = "permission denied"
# A token that a new one mends: expired, or issued before a change of users or roles (etcd's Go
# client re-authenticates on both; "revision of auth store is old" comes as INVALID_ARGUMENT).
_STALE_TOKEN = ("invalid auth token", "revision of auth store is old")


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
    create_revision: int = 0


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
        self.host = parts.hostname or ""
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
            _check_tls_files(keyfile, certfile, cafile)
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(cafile), private_key=_read(keyfile), certificate_chain=_read(certfile))
        self._certfile, self._cafile = certfile, cafile
        # As flanneld: a client key and cert mean TLS (for every endpoint); an https:// endpoint also
        # gets TLS, verified against the CA file or the system roots.
        self._endpoints = [_Endpoint(e.strip(), creds, force_tls=bool(keyfile and certfile)) for e in endpoints]
        if warn_insecure and not all(ep.secure for ep in self._endpoints):
            log.warning("connecting to etcd with http (%s)",
                        ", ".join(ep.url for ep in self._endpoints if not ep.secure))
        self._cur = 0
        self._lock = threading.Lock()          # guards _cur, _token and _failed_over
        self._username, self._password = username, password
        if bool(username) != bool(password) and (username or password):
            raise ValueError("etcd auth needs both a username and a password")
        self._token: Optional[str] = None      # "" when etcd has auth off: no token to send
        # What the log says of failures, once each (control/recurring.py; the module's docstring).
        self._unreachable = Recurring(log, "etcd unreachable")
        self._refused = Recurring(log, "etcd refuses this client", level=logging.ERROR)
        self._denied: dict[str, Recurring] = {}          # permission denied, per operation
        self._failed_over: set[int] = set()    # endpoints left since the last success
        self._notes: list[Callable[[], str]] = []

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

    # -- what the log says of failures --------------------------------------------------------------
    def add_note(self, note: Callable[[], str]) -> None:
        """``note()`` adds the state of things to the lines saying etcd is unreachable (the peer
        watcher: how many peer routes the host keeps meanwhile)."""
        self._notes.append(note)

    def remove_note(self, note: Callable[[], str]) -> None:
        try:
            self._notes.remove(note)
        except ValueError:
            pass

    def _note(self) -> str:
        return "; ".join(text for text in (note() for note in list(self._notes)) if text)

    @property
    def unreachable(self) -> Recurring:
        """The current outage, if any (``failing``, ``lasted()``, ``cause``)."""
        return self._unreachable

    def _succeeded(self, what: str, ep: "_Endpoint") -> None:
        """A call or a watch got an answer: whatever was failing is over."""
        if self._failed_over:
            with self._lock:
                self._failed_over.clear()
        self._unreachable.ok(f"answering at {ep.url}")
        self._refused.ok(f"answering at {ep.url}")
        denied = self._denied.get(what)
        if denied is not None:
            denied.ok()

    def _report_unreachable(self, cause: str) -> None:
        self._unreachable.fail(cause, "is etcd running and are --etcd-endpoints right? Retrying",
                               self._note, key="unreachable")

    def _report_denied(self, what: str, err: RegistryDeniedError,
                       ep: "Optional[_Endpoint]" = None) -> RegistryDeniedError:
        """Log a refusal (once, then reminders) and return it to raise. etcd that refuses is
        there: an outage said before is over."""
        if ep is not None:
            self._unreachable.ok(f"answering at {ep.url}")
        if err.reason == "permission":
            tracker = self._denied.get(what)
            if tracker is None:
                tracker = self._denied.setdefault(
                    what, Recurring(log, f"etcd {what}", level=logging.ERROR))
            tracker.fail(str(err), "", self._note, key=err.reason)
        else:
            self._refused.fail(str(err), "", self._note, key=err.reason)
        return err

    def _refusal(self, exc: grpc.RpcError, ep: "_Endpoint") -> Optional[RegistryDeniedError]:
        """What ``exc`` means when it is a refusal no retry mends, else None."""
        code, details = exc.code(), exc.details() or ""
        if _AUTH_FAILED in details:
            return RegistryDeniedError(
                f"authentication failed, invalid user ID or password (etcd user "
                f"{self._username!r} at {ep.url}): check --etcd-username and --etcd-password",
                "auth")
        if _USER_EMPTY in details:
            return RegistryDeniedError(
                f"etcd at {ep.url} has authentication on and we gave no user: set --etcd-username "
                "and --etcd-password (or give a client certificate, --etcd-certfile, whose CN is an "
                "etcd user)", "auth")
        if code == grpc.StatusCode.PERMISSION_DENIED or _PERMISSION_DENIED in details:
            if self._username:
                who = f"etcd user {self._username!r}"
            elif self._certfile:
                who = f"the etcd user named by the CN of --etcd-certfile {self._certfile}"
            else:
                who = "this client"
            return RegistryDeniedError(
                f"permission denied to {who} under {self.prefix}/ at {ep.url}: grant its role "
                f"readwrite on that prefix (etcdctl role grant-permission ROLE --prefix=true "
                f"readwrite {self.prefix}/), or fix --etcd-prefix", "permission")
        return _tls_refusal(details, ep, self._certfile, self._cafile)

    def _failover(self, failed: int, cause: str = "") -> None:
        with self._lock:
            if self._cur != failed or len(self._endpoints) <= 1:
                return
            self._cur = (failed + 1) % len(self._endpoints)
            first = failed not in self._failed_over
            self._failed_over.add(failed)
            to = self._endpoints[self._cur].url
        # Once per endpoint until a call succeeds: with every endpoint down the switching goes
        # round, and the outage is said once by _report_unreachable.
        log.log(logging.WARNING if first else logging.DEBUG, "etcd endpoint %s failed%s, switching to %s",
                self._endpoints[failed].url, f" ({cause})" if cause else "", to)

    def _metadata(self, channel: grpc.Channel, refresh: bool = False) -> tuple:
        if not self._username:
            return ()
        with self._lock:
            token = self._token
        if token is None or refresh:
            try:
                resp = etcdrpc.AuthStub(channel).Authenticate(
                    etcdrpc.AuthenticateRequest(name=self._username, password=self._password),
                    timeout=self.timeout)
                token = resp.token
            except grpc.RpcError as exc:
                # etcd with auth off takes calls without a token; etcd's Go client (so flanneld)
                # goes on without one, and so do we (asking again at the next refresh).
                if _AUTH_NOT_ENABLED not in (exc.details() or ""):
                    raise
                token = ""
            with self._lock:
                self._token = token
        return (("token", token),) if token else ()

    def _attempt(self, channel: grpc.Channel, fn: Callable):
        try:
            return fn(channel, self._metadata(channel))
        except grpc.RpcError as exc:
            if not self._username or not _stale_token(exc):
                raise
            return fn(channel, self._metadata(channel, refresh=True))

    def _call(self, what: str, fn: Callable):
        """Run `fn(channel, metadata)` on the current endpoint, failing over on unavailability."""
        failed: list[tuple[str, str]] = []             # (endpoint, why) of each endpoint tried
        tls: list[RegistryDeniedError] = []
        for _ in range(len(self._endpoints)):
            idx = self._cur
            ep = self._endpoints[idx]
            channel = ep.channel()
            try:
                result = self._attempt(channel, fn)
            except grpc.RpcError as exc:
                refusal = self._refusal(exc, ep)
                if refusal is not None and refusal.reason not in _TLS_REFUSALS:
                    raise self._report_denied(what, refusal, ep) from None
                if refusal is None and exc.code() not in _FAILOVER_CODES:
                    raise RegistryError(f"etcd {what}: {exc.code().name}: {exc.details()}") from None
                # Unreachable, or a TLS handshake refused here: another endpoint may do.
                why = str(refusal) if refusal is not None else _unavailable(exc, ep)
                failed.append((ep.url, why))
                if refusal is not None:
                    tls.append(refusal)
                self._failover(idx, why)
                continue
            self._succeeded(what, ep)
            return result
        if tls and len(tls) == len(failed):
            raise self._report_denied(what, tls[0], self._endpoints[self._cur]) from None
        if len({why for _, why in failed}) == 1:
            detail = f" ({', '.join(url for url, _ in failed)}): {failed[0][1]}"
        else:
            detail = ": " + "; ".join(f"{url}: {why}" for url, why in failed)
        self._report_unreachable(f"{what} failed on every endpoint{detail}")
        raise RegistryUnavailableError(f"etcd {what} failed on every endpoint{detail}")

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

    # -- bursts (a load generator's: testbed/lease_writer.py) -------------------------------------
    def pipelined(self, puts: "list[tuple[str, bytes | str]]" = (), deletes: "list[str]" = (),
                  window: int = 32) -> int:
        """Each put (key, value), then each delete (key), its own call, hence its own revision and
        watch event, ``window`` calls in flight from this one thread: a burst as fast as etcd takes
        it, for little CPU. On the current endpoint, without failover. Returns how many puts got a
        revision and deletes deleted a key."""
        from collections import deque
        channel = self._endpoints[self._cur].channel()
        metadata = self._metadata(channel)
        kv = etcdrpc.KVStub(channel)
        calls = [(kv.Put, etcdrpc.PutRequest(key=k.encode(), value=_b(v))) for k, v in puts]
        calls += [(kv.DeleteRange, etcdrpc.DeleteRangeRequest(key=k.encode())) for k in deletes]
        pending: deque = deque()
        answered = 0

        def settle() -> int:
            resp = pending.popleft().result()
            return int(resp.deleted > 0) if hasattr(resp, "deleted") else int(resp.header.revision > 0)
        try:
            for method, req in calls:
                if len(pending) >= window:
                    answered += settle()
                pending.append(method.future(req, timeout=self.timeout, metadata=metadata))
            while pending:
                answered += settle()
        except grpc.RpcError as exc:
            raise RegistryError(f"etcd burst: {exc.code().name}: {exc.details()}") from None
        return answered


class WatchLoop:
    """A resumable watch of one key or prefix, run in the caller's thread by run() until cancel().

    on_events(events, revision) gets every event of every response, in revision order, where revision
    is the cursor after the batch. on_compacted() is called when the cursor was compacted: it must
    re-list and return the list's revision; the watch then continues from that revision + 1.
    Exceptions raised by the callbacks are logged and the watch resumes from the same cursor.

    What the log says (once, then a reminder a minute; control/recurring.py): a stream that cannot
    be opened on any endpoint is the registry's "etcd unreachable", a refusal its RegistryDeniedError;
    anything else (a failing callback or re-list, a stream etcd cancels) is this watch's own line.
    A stream that breaks after it ran is resumed without a line of its own: if etcd is gone, the
    next attempt says so."""

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
        self._ran = False                      # the current attempt's stream was created
        self._fresh = False                    # ... with a token asked for in this attempt
        self._refresh = False                  # the next attempt authenticates again
        self._unopened = 0                     # attempts in a row that opened no stream
        self._trouble = Recurring(log, f"watch {self.name}")

    @property
    def _what(self) -> str:
        return f"watch {self.name}"

    def cancel(self) -> None:
        self._stop.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def run(self) -> None:
        while not self._stop.is_set():
            idx = self._reg._cur
            self._ran = False
            try:
                self._stream(idx)
            except RegistryClosedError:
                log.info("watch %s: registry closed, stopping", self.name)
                return
            except CompactedError as exc:
                log.warning("watch %s: %s; re-listing from revision %d", self.name, exc,
                            self.next_revision)
                try:
                    self.next_revision = self._on_compacted() + 1
                    self.resyncs += 1
                    continue
                except (RegistryUnavailableError, RegistryDeniedError) as exc2:
                    log.debug("watch %s: re-list failed: %s", self.name, exc2)   # said by the registry
                except Exception as exc2:           # retry the whole thing later
                    self._trouble.fail(f"re-listing after the compaction failed: {exc2}",
                                       "retrying", key="re-list")
            except RegistryDeniedError as exc:
                if self._stop.is_set():
                    break
                if exc.reason == "permission" and not self._fresh:
                    # etcd cancels a watch made with a token older than its last change of users
                    # or roles as "permission denied": ask for a new token before believing it.
                    self._refresh = True
                    continue
                self._reg._report_denied(self._what, exc, self._reg._endpoints[idx])
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    break
                if not self._ran and not self._fresh and _stale_token(exc):
                    self._refresh = True            # an expired token: a new one, at once
                    continue
                self._rpc_failed(idx, exc)
            except _CallbackFailed as exc:
                if self._stop.is_set():
                    break
                self._trouble.fail(f"handling events failed: {exc.error!r}",
                                   f"resuming from revision {self.next_revision}", key=_CALLBACK)
            except Exception as exc:
                if self._stop.is_set():
                    break
                if self._ran and isinstance(exc, RegistryError):     # "watch stream ended"
                    log.debug("watch %s: %s, resuming from revision %d", self.name, exc,
                              self.next_revision)
                else:
                    self._trouble.fail(str(exc), f"resuming from revision {self.next_revision}")
                self._reg._failover(idx, str(exc))
            finally:
                self.connected.clear()
            self.reconnects += 1
            self._refresh = True
            self._stop.wait(self.retry_interval)

    def _rpc_failed(self, idx: int, exc: grpc.RpcError) -> None:
        ep = self._reg._endpoints[idx]
        if self._ran:
            # A stream that ran broke (etcd restarted or went away): resumed at once from the
            # cursor, on the next endpoint; said only if the next attempt fails.
            log.debug("watch %s: stream broken (%s: %s), resuming from revision %d", self.name,
                      exc.code().name, exc.details(), self.next_revision)
            if exc.code() in _FAILOVER_CODES or exc.code() == grpc.StatusCode.UNKNOWN:
                self._reg._failover(idx, _unavailable(exc, ep))
            return
        refusal = self._reg._refusal(exc, ep)
        if refusal is not None:
            self._reg._report_denied(self._what, refusal, ep)
            if refusal.reason in _TLS_REFUSALS:
                self._reg._failover(idx, str(refusal))
            return
        why = _unavailable(exc, ep)
        self._reg._failover(idx, why)
        self._unopened += 1
        if self._unopened >= len(self._reg._endpoints):
            self._reg._report_unreachable(f"{self._what} cannot open a stream on any endpoint "
                                          f"(last {ep.url}): {why}")
        else:
            log.debug("watch %s: no stream at %s (%s)", self.name, ep.url, why)

    def _stream(self, idx: int) -> None:
        ep = self._reg._endpoints[idx]
        channel = ep.channel()
        # After any failure, authenticate again: an etcd restart or a token expiry invalidates the token,
        # and a watch created with a stale one is cancelled rather than refused with UNAUTHENTICATED.
        refresh = self._refresh
        self._fresh = refresh or self._reg._token is None
        metadata = self._reg._metadata(channel, refresh=refresh) + (("hasleader", "true"),)
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
                    reason = resp.cancel_reason or "no reason"
                    if _PERMISSION_DENIED in reason:
                        raise self._reg._refusal(_Refused(grpc.StatusCode.PERMISSION_DENIED,
                                                          reason), ep)
                    raise RegistryError(f"watch canceled by etcd: {reason}")
                if resp.created and resp.header.revision + 1 < self.next_revision:
                    raise RewoundError(resp.header.revision, self.next_revision)
                if resp.created:
                    self._ran = True
                    self._unopened = 0
                    self._reg._succeeded(self._what, ep)
                    if self._trouble.key != _CALLBACK:     # that one is over once events go through
                        self._trouble.ok()
                    self.connected.set()
                if resp.events:
                    events = [WatchEvent("delete" if ev.type == kv_pb2.Event.DELETE else "put",
                                         ev.kv.key.decode("utf-8", errors="replace"), ev.kv.value,
                                         ev.kv.mod_revision, ev.kv.lease, ev.kv.create_revision)
                              for ev in resp.events]
                    cursor = events[-1].mod_revision + 1
                    try:
                        self._on_events(events, cursor - 1)
                    except Exception as exc:
                        raise _CallbackFailed(exc) from exc
                    self._trouble.ok()
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


_CALLBACK = "callback"


class _CallbackFailed(Exception):
    """The owner's on_events raised: its problem, not etcd's (no failover)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class _Refused(grpc.RpcError):
    """A refusal etcd sends inside a watch response, in the form Registry._refusal reads."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _b(v: "bytes | str") -> bytes:
    return v if isinstance(v, bytes) else v.encode()


def _read(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def _check_tls_files(keyfile: Optional[str], certfile: Optional[str], cafile: Optional[str]) -> None:
    """ValueError naming the flag when a TLS file cannot serve: gRPC would only say "Failed to
    create security handshaker" at every connection attempt."""
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cafile:
        _read(cafile)                          # a missing file: OSError with its name
        try:
            ctx.load_verify_locations(cafile=cafile)
        except (ssl.SSLError, ValueError) as e:
            raise ValueError(f"--etcd-cafile {cafile} holds no usable PEM certificate "
                             f"({getattr(e, 'reason', None) or e})") from None
    if certfile and keyfile:
        _read(certfile)
        _read(keyfile)
        try:
            # A passphrase-protected key cannot serve (gRPC takes none): refused, not prompted for.
            ctx.load_cert_chain(certfile, keyfile, password=lambda: b"")
        except (ssl.SSLError, ValueError) as e:
            raise ValueError(f"--etcd-certfile {certfile} and --etcd-keyfile {keyfile} are no "
                             "PEM certificate and its unencrypted private key "
                             f"({getattr(e, 'reason', None) or e})") from None


def _stale_token(exc: grpc.RpcError) -> bool:
    return exc.code() == grpc.StatusCode.UNAUTHENTICATED or any(
        s in (exc.details() or "") for s in _STALE_TOKEN)


def _unavailable(exc: grpc.RpcError, ep: _Endpoint) -> str:
    """Why an endpoint did not answer, with a hint when the transport looks mismatched."""
    details = exc.details() or ""
    why = f"{exc.code().name}: {details}"
    # Both also happen while etcd shuts down: a hint for when it lasts, not a verdict.
    if "Handshake read failed (Socket closed)" in details and ep.secure:
        why += " (if this lasts: does etcd speak TLS there? a client key and cert, or https://, mean TLS)"
    elif details.endswith("Socket closed") and not ep.secure:
        why += (" (if this lasts and etcd serves TLS there: write https:// in --etcd-endpoints "
                "and give --etcd-cafile)")
    return why


def _tls_refusal(details: str, ep: _Endpoint, certfile: Optional[str],
                 cafile: Optional[str]) -> Optional[RegistryDeniedError]:
    """The TLS handshake refused, in words: which side refused what, and the flag to fix. gRPC's
    own words name the symptom on our side only ("Unwrap failed (TSI_DATA_CORRUPTED)" is etcd's
    alert about our certificate, read as a record that does not decrypt)."""
    if not ep.secure:
        return None
    if "CERTIFICATE_VERIFY_FAILED" in details:
        reason = details.split("CERTIFICATE_VERIFY_FAILED", 1)[1].strip(": ").split(":", 1)[0]
        by = (f"--etcd-cafile {cafile}" if cafile
              else "the system's CA certificates")
        return RegistryDeniedError(
            f"the certificate of etcd at {ep.url} is not trusted by {by}"
            f"{f' ({reason})' if reason else ''}: give the CA that signed etcd's certificate "
            "in --etcd-cafile", "tls-server")
    if "Hostname Verification" in details or "not in peer certificate" in details:
        return RegistryDeniedError(
            f"the certificate of etcd at {ep.url} does not name {ep.host}: write --etcd-endpoints "
            "with a name or address that certificate holds", "tls-name")
    if any(s in details for s in ("TSI_DATA_CORRUPTED", "ALERT_BAD_CERTIFICATE",
                                  "ALERT_UNKNOWN_CA", "CERTIFICATE_REQUIRED",
                                  "ALERT_CERTIFICATE_EXPIRED")):
        if certfile:
            return RegistryDeniedError(
                f"etcd at {ep.url} refused our client certificate (--etcd-certfile {certfile}): "
                "not signed by a CA etcd trusts (its --trusted-ca-file), expired, or not for "
                "client authentication", "tls-client")
        return RegistryDeniedError(
            f"etcd at {ep.url} requires a client certificate and none was given: set "
            "--etcd-certfile and --etcd-keyfile", "tls-client")
    if "Failed to create security handshaker" in details:
        return RegistryDeniedError(
            f"our TLS files cannot make a connection to {ep.url}: check --etcd-certfile, "
            "--etcd-keyfile and --etcd-cafile", "tls-files")
    return None


def read_then_watch(registry: Registry, key: str, *, prefix: bool, read: Callable[[], int],
                    on_events: Callable[[list, int], None], stop: threading.Event,
                    on_watch: Callable[[WatchLoop], None],
                    relist: Optional[Callable[[], int]] = None, retry_interval: float = 1.0,
                    name: str = "") -> None:
    """What every follower of a key does, in the caller's thread until ``stop`` or the
    watch's cancel: ``read()`` (which returns the revision it read at) until it answers,
    then a watch from that revision + 1 that calls ``relist`` (default ``read``) after a
    compaction or a rewind. A function, not a method: a stand-in registry needs only
    ``watch_loop``. A failing read is said once, then reminded (an unreachable or
    refusing etcd the registry says itself). ``on_watch`` gets the watch before it runs, so
    that its owner can cancel it."""
    trouble = Recurring(log, f"Watch {name}: reading {key}")
    rev = None
    while rev is None and not stop.is_set():
        try:
            rev = read()
            trouble.ok()
        except RegistryClosedError:
            return
        except (RegistryUnavailableError, RegistryDeniedError) as exc:
            log.debug("watch %s: reading %s failed: %s", name, key, exc)   # said already
        except RegistryError as exc:
            trouble.fail(str(exc), f"retrying every {retry_interval:g} s")
        if rev is None:
            stop.wait(retry_interval)
    if stop.is_set():
        return
    watch = registry.watch_loop(key, prefix=prefix, start_revision=rev + 1, on_events=on_events,
                                on_compacted=relist or read, retry_interval=retry_interval,
                                name=name)
    on_watch(watch)
    if not stop.is_set():
        watch.run()


def wait_for_config(registry: Registry, stop: Optional[threading.Event] = None, interval: float = 1.0,
                    timeout: Optional[float] = None) -> NetworkConfig:
    """Block until `<prefix>/config` exists and is valid, retrying every `interval` s as flanneld does.

    Why it waits is logged once per reason, then reminded (control/recurring.py); etcd unreachable
    is said by the registry. Raises RegistryDeniedError at once (no retry mends it), TimeoutError
    after `timeout` s, or RegistryError('stopped') when `stop` is set."""
    deadline = None if timeout is None else time.monotonic() + timeout
    stop = stop or threading.Event()
    waiting = Recurring(log, "Couldn't fetch network config", level=logging.ERROR)
    advice = f"retrying every {interval:g} s"
    while True:
        try:
            config = registry.get_config()
            waiting.ok()
            return config
        except ConfigNotFoundError as exc:
            waiting.fail(f"{exc} (key {registry.config_key})", advice)
        except ConfigError as exc:
            waiting.fail(f"invalid config at {registry.config_key}: {exc}", advice)
        except RegistryDeniedError:
            raise
        except RegistryUnavailableError as exc:
            log.debug("Couldn't fetch network config: %s", exc)
        except RegistryError as exc:
            waiting.fail(str(exc), advice)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"no valid network config at {registry.config_key} after {timeout}s")
        if stop.wait(interval):
            raise RegistryError("stopped while waiting for the network config")
