"""The etcd watch: a resumable watch of one key or prefix (WatchLoop), and what every follower of a key
does with it, read then watch (read_then_watch).

Watches are our own streams over the transport's public members (control/etcd.py): one request, then
etcd's responses, read on the watch's own thread (_WATCH below). All events of every response are
delivered, the cursor is the last event's revision, a broken stream resumes from cursor + 1 on the
next endpoint, and a compacted cursor calls back the owner to re-list and continue from the list's
revision + 1. Its outages and refusals are the transport's to say (one line for the
whole client); a watch says only what is its own (a failing callback or re-list, a stream etcd cancels).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Optional

# The transport first: it quiets gRPC's C core before grpc's first import (its comment says why).
from .etcd import (FAILOVER_CODES, LOGGER, PERMISSION_DENIED, EtcdClient, range_end, stale_token,
                   why_unavailable)
import grpc
from pyetcd import etcdrpc
from pyetcd.etcdrpc import kv_pb2

from .etcd_errors import (TLS_REFUSALS, CompactedError, RegistryClosedError, RegistryDeniedError,
                          RegistryError, RegistryUnavailableError, RewoundError)
from .recurring import Recurring

log = logging.getLogger(LOGGER)

# The watch is one request, then etcd's responses: called as a unary-stream call (the channel
# reads those on the caller's own thread, control/etcd.py), which sends the request and closes
# our half of the stream. etcd keeps such a watch until the call ends (its server stops reading
# requests at the client's end of stream, and watches on: its HTTP gateway's watches are made
# so). As a bidi stream, each response went from gRPC's spin thread to the reader, and a thread
# of ours held our half open: 5,000 puts' events cost the reading process twice the CPU and three
# times the context switches (perf/README.md#watch-one-thread), taken from the answers' share.
_WATCH = etcdrpc.rpc_pb2.DESCRIPTOR.services_by_name["Watch"].methods_by_name["Watch"]
_WATCH_PATH = f"/{_WATCH.containing_service.full_name}/{_WATCH.name}"


def _watch_call(channel):
    return channel.unary_stream(_WATCH_PATH,
                                request_serializer=etcdrpc.WatchRequest.SerializeToString,
                                response_deserializer=etcdrpc.WatchResponse.FromString)


@dataclass(frozen=True)
class WatchEvent:
    kind: str            # "put" or "delete"
    key: str
    value: bytes
    mod_revision: int
    lease_id: int
    create_revision: int = 0


class WatchLoop:
    """A resumable watch of one key or prefix, run in the caller's thread by run() until cancel().

    on_events(events, revision) gets every event of every response, in revision order, where revision
    is the cursor after the batch. on_compacted() is called when the cursor was compacted: it must
    re-list and return the list's revision; the watch then continues from that revision + 1.
    Exceptions raised by the callbacks are logged and the watch resumes from the same cursor.

    What the log says (once, then a reminder a minute; control/recurring.py): a stream that cannot
    be opened on any endpoint is the client's "etcd unreachable", a refusal its RegistryDeniedError;
    anything else (a failing callback or re-list, a stream etcd cancels) is this watch's own line.
    A stream that breaks after it ran is resumed without a line of its own: if etcd is gone, the
    next attempt says so."""

    def __init__(self, etcd: EtcdClient, key: str, *, prefix: bool, start_revision: int,
                 on_events, on_compacted, retry_interval: float, name: str):
        self._etcd = etcd
        self._key = key.encode()
        self._range_end = range_end(self._key) if prefix else b""
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
            ep = self._etcd.endpoint()
            self._ran = False
            try:
                self._stream(ep)
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
                    log.debug("watch %s: re-list failed: %s", self.name, exc2)   # said by the client
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
                self._etcd.report_denied(self._what, exc, ep)
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    break
                if not self._ran and not self._fresh and stale_token(exc):
                    self._refresh = True            # an expired token: a new one, at once
                    continue
                self._rpc_failed(ep, exc)
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
                self._etcd.failover(ep, str(exc))
            finally:
                self.connected.clear()
            self.reconnects += 1
            self._refresh = True
            self._stop.wait(self.retry_interval)

    def _rpc_failed(self, ep, exc: grpc.RpcError) -> None:
        if self._ran:
            # A stream that ran broke (etcd restarted or went away): resumed at once from the
            # cursor, on the next endpoint; said only if the next attempt fails.
            log.debug("watch %s: stream broken (%s: %s), resuming from revision %d", self.name,
                      exc.code().name, exc.details(), self.next_revision)
            if exc.code() in FAILOVER_CODES or exc.code() == grpc.StatusCode.UNKNOWN:
                self._etcd.failover(ep, why_unavailable(exc, ep))
            return
        refusal = self._etcd.refusal(exc.code(), exc.details() or "", ep)
        if refusal is not None:
            self._etcd.report_denied(self._what, refusal, ep)
            if refusal.reason in TLS_REFUSALS:
                self._etcd.failover(ep, str(refusal))
            return
        why = why_unavailable(exc, ep)
        self._etcd.failover(ep, why)
        self._unopened += 1
        if self._unopened >= len(self._etcd.endpoints):
            self._etcd.report_unreachable(f"{self._what} cannot open a stream on any endpoint "
                                          f"(last {ep.url}): {why}")
        else:
            log.debug("watch %s: no stream at %s (%s)", self.name, ep.url, why)

    def _stream(self, ep) -> None:
        channel = ep.channel()
        # After any failure, authenticate again: an etcd restart or a token expiry invalidates the token,
        # and a watch created with a stale one is cancelled rather than refused with UNAUTHENTICATED.
        refresh = self._refresh
        self._fresh = refresh or not self._etcd.has_token
        metadata = self._etcd.metadata(channel, refresh=refresh) + (("hasleader", "true"),)
        create = etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
            key=self._key, range_end=self._range_end, start_revision=self.next_revision,
            progress_notify=True))
        call = _watch_call(channel)(create, metadata=metadata)
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
                    if PERMISSION_DENIED in reason:
                        raise self._etcd.refusal(grpc.StatusCode.PERMISSION_DENIED, reason, ep)
                    raise RegistryError(f"watch canceled by etcd: {reason}")
                if resp.created and resp.header.revision + 1 < self.next_revision:
                    raise RewoundError(resp.header.revision, self.next_revision)
                if resp.created:
                    self._ran = True
                    self._unopened = 0
                    self._etcd.succeeded(self._what, ep)
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
            with self._lock:
                self._call = None
            call.cancel()


_CALLBACK = "callback"


class _CallbackFailed(Exception):
    """The owner's on_events raised: its problem, not etcd's (no failover)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def read_then_watch(registry, key: str, *, prefix: bool, read: Callable[[], int],
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
