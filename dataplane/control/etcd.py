"""The etcd transport: endpoints, channels, failover, auth, TLS, and the key-value and lease calls.

(Over 450 lines as one piece: every call goes through the one retry path of failover, token
renewal and TLS refusal below, so the calls and that path live together.)

The only module that opens gRPC channels to etcd. Above it: the watch (control/etcd_watch.py, on the
public members of EtcdClient: no private member of this module is used elsewhere) and flannel's keys
(control/registry.py, whose Registry is an EtcdClient that knows the config and lease keys). The
client is the generated gRPC API shipped by `etcd-sdk-python` (`pyetcd.etcdrpc`, the same protobufs
as the `etcd3` package) driven directly, because this module needs control that
`MultiEndpointEtcd3Client` does not give:

* failover: every unary call goes to the current endpoint; UNAVAILABLE / DEADLINE_EXCEEDED moves to the
  next endpoint and retries there, once per endpoint, before the call fails with RegistryError;
  while the members that answer say their cluster has no leader yet, the round is asked again
  (ELECTION_WAIT_S);
* auth: `Authenticate` gives a token sent as `token` metadata; an expired token (UNAUTHENTICATED) is
  renewed once and the call retried;
* TLS when a client key and cert are given (as flanneld) or the endpoint scheme is https (CA optional);
* gRPC keepalive every 10 s with a 5 s timeout, only while a call is open: etcd's server enforces a 5 s
  minimum and no pings without streams (`--grpc-keepalive-min-time`), a faster client gets GOAWAY.

Failures are of two kinds (control/etcd_errors.py), and the log says each once (control/recurring.py),
whichever loop meets it:
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

Past 500 lines with one job: a call to etcd and the words for why it failed. Channels, failover,
tokens and the naming of refusals share the endpoint list and its lock; split apart, they would
reach into each other's state, as the watch did before it was given the public members below.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Optional
from urllib.parse import urlsplit

# gRPC's C core writes its own lines to the process's stderr, past the daemon's logger, level and
# format: a refused TLS handshake is two lines a second of "ssl_transport_security_utils.cc ...
# Corruption detected". The messages of this module say what failed and which flag fixes it, so the
# core stays silent unless the operator asked for its log. The core reads these variables when it
# starts, so they are set before grpc is first imported: here, since the other modules that import
# it do so after this one (control/etcd_watch.py at its top, testbed/lease_writer.py once it holds
# a client).
# An empty variable (an environment file's `GRPC_VERBOSITY=`) asks for nothing.
if not os.environ.get("GRPC_VERBOSITY") and not os.environ.get("GRPC_TRACE"):
    os.environ["GRPC_VERBOSITY"] = "NONE"

import grpc
from pyetcd import etcdrpc

from .etcd_errors import (TLS_REFUSALS, RegistryClosedError, RegistryDeniedError, RegistryError,
                          RegistryUnavailableError)
from . import defaults
from .recurring import Recurring

# One logger for the whole etcd client (this transport, its watch, flannel's keys): the name its
# lines have always carried, which the text and json logs show and operators' filters select on.
LOGGER = "dataplane.control.registry"
log = logging.getLogger(LOGGER)

DEFAULT_ENDPOINTS = defaults.DEFAULT_ENDPOINTS

FAILOVER_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
MAX_RECONNECT_BACKOFF_MS = 2_000
# After etcd is back, a channel still in its reconnect backoff fails its next call at once: a
# failure that soon after "recovered" is held back until it outlasts that backoff.
OUTAGE_SETTLE_S = MAX_RECONNECT_BACKOFF_MS / 1000 + 1.0
# A member that answers one of these is up but its cluster has no leader yet (the leader died or
# stepped down): every member says so until a vote ends, 1-2 s with etcd's default election timeout
# of 1 s. A call that meets only these and dead members waits for the vote, within ELECTION_WAIT_S,
# rather than calling etcd unreachable (etcd's Go client retries them too).
_ELECTING = ("etcdserver: no leader", "etcdserver: leader changed",
             "etcdserver: request timed out, possibly due to previous leader failure")
ELECTION_WAIT_S = 3.0
ELECTION_RETRY_S = 0.2
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),          # never below etcd's 5 s minimum
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),  # etcd: PermitWithoutStream=false
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ("grpc.max_receive_message_length", 64 << 20),   # a big lease list in one Range response
    # A unary-stream call (the watches', control/etcd_watch.py) receives in the thread that reads
    # it, not through the channel's spin thread: half the handoffs an event (its why there).
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
]

# etcd's own words (server/etcdserver/api/v3rpc/rpctypes), matched in a status's details.
_AUTH_FAILED = "authentication failed"
_AUTH_NOT_ENABLED = "authentication is not enabled"
_USER_EMPTY = "user name is empty"
PERMISSION_DENIED = "permission denied"
# A token that a new one mends: expired, or issued before a change of users or roles (etcd's Go
# client re-authenticates on both; "revision of auth store is old" comes as INVALID_ARGUMENT).
_STALE_TOKEN = ("invalid auth token", "revision of auth store is old")


class _EveryEndpointFailed(Exception):
    """A round of _call's in which no endpoint answered: (endpoint, why) of each, the TLS
    refusals among them, and whether a member said its cluster is electing a leader."""

    def __init__(self, failed: list, tls: list, electing: bool):
        super().__init__()
        self.failed, self.tls, self.electing = failed, tls, electing


def range_end(prefix: bytes) -> bytes:
    """The end of the key range that holds every key starting with `prefix` (etcd's GetPrefixRangeEnd)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


class Endpoint:
    """One etcd endpoint and its channel, opened on first use."""

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


class EtcdClient:
    """etcd's key-value and lease calls over failover, auth and TLS. Thread-safe. ``prefix`` is
    the part of the key space this client is granted: a permission refusal names it."""

    def __init__(self, endpoints: "list[str] | str" = DEFAULT_ENDPOINTS, prefix: str = "/",
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
        self._endpoints = [Endpoint(e.strip(), creds, force_tls=bool(keyfile and certfile)) for e in endpoints]
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
        self._unreachable = Recurring(log, "etcd unreachable", settle=OUTAGE_SETTLE_S)
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

    def endpoint(self) -> Endpoint:
        """The endpoint calls go to now (failover moves it on)."""
        return self._endpoints[self._cur]

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

    # What a stream's owner (control/etcd_watch.py) tells the client, as its calls do below: the
    # outcome of each attempt, so that one outage or one refusal is said once by whoever meets it.
    def succeeded(self, what: str, ep: Endpoint) -> None:
        """A call or a watch got an answer: whatever was failing is over."""
        if self._failed_over:
            with self._lock:
                self._failed_over.clear()
        self._unreachable.ok(f"answering at {ep.url}")
        self._refused.ok(f"answering at {ep.url}")
        denied = self._denied.get(what)
        if denied is not None:
            denied.ok()

    def report_unreachable(self, cause: str) -> None:
        self._unreachable.fail(cause, "is etcd running and are --etcd-endpoints right? Retrying",
                               self._note, key="unreachable")

    def report_denied(self, what: str, err: RegistryDeniedError,
                      ep: Optional[Endpoint] = None) -> RegistryDeniedError:
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

    def refusal(self, code: grpc.StatusCode, details: str, ep: Endpoint) -> Optional[RegistryDeniedError]:
        """What a status (``code``, ``details``) from ``ep`` means when it is a refusal no retry
        mends, else None."""
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
        if code == grpc.StatusCode.PERMISSION_DENIED or PERMISSION_DENIED in details:
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

    def failover(self, failed: Endpoint, cause: str = "") -> None:
        """``failed`` did not serve: what follows goes to the next endpoint, unless another
        caller has moved on from it already."""
        with self._lock:
            idx = self._cur
            if self._endpoints[idx] is not failed or len(self._endpoints) <= 1:
                return
            self._cur = (idx + 1) % len(self._endpoints)
            first = idx not in self._failed_over
            self._failed_over.add(idx)
            to = self._endpoints[self._cur].url
        # Once per endpoint until a call succeeds: with every endpoint down the switching goes
        # round, and the outage is said once by report_unreachable.
        log.log(logging.WARNING if first else logging.DEBUG, "etcd endpoint %s failed%s, switching to %s",
                failed.url, f" ({cause})" if cause else "", to)

    @property
    def has_token(self) -> bool:
        """etcd's answer to our authentication is held (a token, or "" with auth off): the next
        metadata() asks for none unless told to refresh."""
        return self._token is not None

    def metadata(self, channel: grpc.Channel, refresh: bool = False) -> tuple:
        """The auth metadata of a call on ``channel``, authenticating first when no token is held
        or ``refresh`` asks for a new one."""
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
            return fn(channel, self.metadata(channel))
        except grpc.RpcError as exc:
            if not self._username or not stale_token(exc):
                raise
            return fn(channel, self.metadata(channel, refresh=True))

    def _call(self, what: str, fn: Callable):
        """Run `fn(channel, metadata)` on the current endpoint, failing over on unavailability."""
        give_up = time.monotonic() + ELECTION_WAIT_S
        while True:
            try:
                return self._round(what, fn)
            except _EveryEndpointFailed as exc:
                failed, tls = exc.failed, exc.tls
                if not exc.electing or time.monotonic() + ELECTION_RETRY_S > give_up:
                    break
            log.debug("etcd %s: no leader yet (%s), asking again", what, failed[-1][1])
            time.sleep(ELECTION_RETRY_S)
        if tls and len(tls) == len(failed):
            raise self.report_denied(what, tls[0], self.endpoint()) from None
        if len({why for _, why in failed}) == 1:
            detail = f" ({', '.join(url for url, _ in failed)}): {failed[0][1]}"
        else:
            detail = ": " + "; ".join(f"{url}: {why}" for url, why in failed)
        self.report_unreachable(f"{what} failed on every endpoint{detail}")
        raise RegistryUnavailableError(f"etcd {what} failed on every endpoint{detail}")

    def _round(self, what: str, fn: Callable):
        """One try of each endpoint, from the current one: the first answer, or
        _EveryEndpointFailed."""
        failed: list[tuple[str, str]] = []
        tls: list[RegistryDeniedError] = []
        electing = False
        for _ in range(len(self._endpoints)):
            ep = self.endpoint()
            channel = ep.channel()
            try:
                result = self._attempt(channel, fn)
            except grpc.RpcError as exc:
                refusal = self.refusal(exc.code(), exc.details() or "", ep)
                if refusal is not None and refusal.reason not in TLS_REFUSALS:
                    raise self.report_denied(what, refusal, ep) from None
                if refusal is None and exc.code() not in FAILOVER_CODES:
                    raise RegistryError(f"etcd {what}: {exc.code().name}: {exc.details()}") from None
                # Unreachable, or a TLS handshake refused here: another endpoint may do.
                why = str(refusal) if refusal is not None else why_unavailable(exc, ep)
                failed.append((ep.url, why))
                if refusal is not None:
                    tls.append(refusal)
                electing = electing or any(words in why for words in _ELECTING)
                self.failover(ep, why)
                continue
            self.succeeded(what, ep)
            return result
        raise _EveryEndpointFailed(failed, tls, electing)

    # -- key/value and lease calls ----------------------------------------------------------------
    def get(self, key: str, prefix: bool = False) -> tuple[list, int]:
        """Return ([KeyValue...], header revision)."""
        k = key.encode()
        req = etcdrpc.RangeRequest(key=k, range_end=range_end(k) if prefix else b"")
        resp = self._call("get", lambda ch, md: etcdrpc.KVStub(ch).Range(req, timeout=self.timeout, metadata=md))
        return list(resp.kvs), resp.header.revision

    def get_raw(self, key: str):
        """The KeyValue under `key` (value, mod_revision...) or None."""
        kvs, _ = self.get(key)
        return kvs[0] if kvs else None

    def put(self, key: str, value: "bytes | str", lease_id: int = 0) -> int:
        req = etcdrpc.PutRequest(key=key.encode(), value=_b(value), lease=lease_id)
        resp = self._call("put", lambda ch, md: etcdrpc.KVStub(ch).Put(req, timeout=self.timeout, metadata=md))
        return resp.header.revision

    def put_if(self, key: str, value: "bytes | str", *, mod_revision: int, lease_id: int = 0,
               what: str = "put") -> Optional[int]:
        """Put in one transaction only if the key is still at ``mod_revision``, or absent when
        ``mod_revision`` is 0: the put's revision, or None when the key had changed. ``what``
        names the operation in the log (a permission is refused per operation)."""
        k = key.encode()
        if mod_revision:
            cmp = etcdrpc.Compare(key=k, target=etcdrpc.Compare.MOD, result=etcdrpc.Compare.EQUAL,
                                  mod_revision=mod_revision)
        else:
            cmp = etcdrpc.Compare(key=k, target=etcdrpc.Compare.VERSION, result=etcdrpc.Compare.EQUAL,
                                  version=0)
        req = etcdrpc.TxnRequest(
            compare=[cmp],
            success=[etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=k, value=_b(value),
                                                                      lease=lease_id))])
        resp = self._call(what,
                          lambda ch, md: etcdrpc.KVStub(ch).Txn(req, timeout=self.timeout, metadata=md))
        return resp.header.revision if resp.succeeded else None

    def delete(self, key: str, prefix: bool = False) -> int:
        k = key.encode()
        req = etcdrpc.DeleteRangeRequest(key=k, range_end=range_end(k) if prefix else b"")
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

    def compact(self, revision: int) -> None:
        req = etcdrpc.CompactionRequest(revision=revision, physical=True)
        self._call("compact", lambda ch, md: etcdrpc.KVStub(ch).Compact(req, timeout=self.timeout, metadata=md))


def stale_token(exc: grpc.RpcError) -> bool:
    """A refusal that a new token mends (the call is retried with one)."""
    return exc.code() == grpc.StatusCode.UNAUTHENTICATED or any(
        s in (exc.details() or "") for s in _STALE_TOKEN)


def why_unavailable(exc: grpc.RpcError, ep: Endpoint) -> str:
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


def _tls_refusal(details: str, ep: Endpoint, certfile: Optional[str],
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
