"""The status socket: what `flannel-udp status` reads from the running daemon.

A unix stream socket in the runtime directory (``--status-socket``, mode 0600: root only, as the
handover socket next to it). Each connection gets one JSON document, then EOF; the client sends
nothing. The document is read from the daemon's state (daemon/state.py DaemonState) and the
source /metrics and /readyz read it through (DaemonSource), so that `status` and /readyz never
disagree, and it answers with the HTTP servers
off (``--healthz-port 0``). It also carries the last WARNING and ERROR log records (a small ring
kept here), so that an operator sees what went wrong without the journal.

The server starts with the HTTP servers (before the config and the lease: a daemon waiting for
them answers "not ready" rather than nothing) and closes at shutdown; a new daemon that takes over
binds the path anew, and the old one then leaves the path alone when it exits.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import socket
import time

from .. import __version__
from ..host.unix_listener import UnixListener, peer_allowed, peer_credentials
from ..engine.contract import V6_SHARES
from . import answer_clock
from .startup import tun_addr6

log = logging.getLogger(__name__)

WARNINGS_KEPT = 10
SEND_TIMEOUT_S = 2.0        # a client that does not read does not hold the socket longer
_SHARES = frozenset(V6_SHARES.values())


class WarningRing(logging.Handler):
    """The last WARNINGS_KEPT records at WARNING and above, on the root logger while installed."""

    def __init__(self, size: int = WARNINGS_KEPT):
        super().__init__(level=logging.WARNING)
        self._records = collections.deque(maxlen=size)

    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:           # a bad format string: keep what was logged
            msg = str(record.msg)
        self._records.append({"time": record.created, "level": record.levelname,
                              "logger": record.name, "message": msg})

    def records(self) -> list:
        return list(self._records)

    def install(self) -> "WarningRing":
        logging.getLogger().addHandler(self)
        return self

    def remove(self) -> None:
        logging.getLogger().removeHandler(self)


def document(state, src, warnings: WarningRing | None = None) -> dict:
    """The status of the daemon whose DaemonState is ``state`` as one JSON-able dict, each part as
    /metrics and /readyz see it through ``src`` (its DaemonSource)."""
    o = state.opts
    checks = src.readiness()
    lease = state.current_lease()
    stats = None
    try:
        stats = src.engine_stats()
    except Exception as e:          # an engine closing under us: the rest still answers
        log.debug("engine stats unavailable: %s", e)
    # by the engine contract's counter names (csrc/dataplane.h): drop_<reason>, <path>_packets
    # (totals of both families), and IPv6's share of each path's, v6_<path>_packets
    stats = stats or {}
    drops = {n[len("drop_"):]: v for n, v in stats.items() if n.startswith("drop_")}
    packets = {n[:-len("_packets")]: v for n, v in stats.items()
               if n.endswith("_packets") and n not in _SHARES}
    packets_ipv6 = {p: stats[V6_SHARES[f"{p}_packets"]] for p in packets
                    if V6_SHARES.get(f"{p}_packets") in stats}
    stale = state.subnet_env.stale()
    ext = state.ext
    watches = src.etcd_watches()
    return {
        "pid": os.getpid(),
        "version": __version__,
        "time": time.time(),
        "phase": state.phase,           # starting (until READY), running, stopping
        # empty checks = nothing reported yet, which /readyz takes as not ready too
        "ready": bool(checks) and all(v is None for v in checks.values()),
        "checks": checks,
        "lease": None if lease is None else {
            "subnet": str(lease.subnet), "public_ip": str(lease.public_ip),
            "expiration": lease.expiration, "reservation": lease.reservation,
            # EnableIPv6: the key's IPv6 part, and the IPv6 underlay's address, if any
            "ipv6_subnet": None if lease.ipv6_subnet is None else str(lease.ipv6_subnet),
            "public_ipv6": (None if lease.attrs.public_ipv6 is None
                            else str(lease.attrs.public_ipv6))},
        # what the tun device carries for the IPv6 part (daemon/startup.py), None without one
        "ipv6": None if lease is None or lease.ipv6_subnet is None else {
            "tun_address": tun_addr6(lease.ipv6_subnet),
            "route": None if state.config is None else str(state.config.ipv6_network)},
        "network": str(state.config.network) if state.config is not None else None,
        "interface": None if ext is None else {
            "name": ext.name, "address": str(ext.iface_addr), "public_ip": str(ext.ext_addr)},
        "tun": state.dataplane.tun_name,
        "subnet_file": {"path": o.subnet_file, "current": stale is None, "problem": stale,
                        "write_failures": state.subnet_env.failures.total},
        "engine": (dict(src.engine_info(), why=state.engine_why)
                   if state.engine is not None else None),
        # which path forwards and why, the programs' counters, the offload change
        # (daemon/kernel_path.py)
        "kernel_path": state.kernel.status() if state.kernel is not None else None,
        "queues": src.queues_count(),
        "offloads": src.offloads_enabled(),
        "peers": src.peers_count(),
        # peers whose IPv6 part the engines route (None: IPv6 is off)
        "peers_ipv6": src.peers_ipv6(),
        # --ipv6-underlay-fallback: the peers on IPv4 because their IPv6 underlay failed
        "ipv6_underlay_fallback": src.ipv6_underlay_fallback(),
        "etcd": {"endpoints": list(o.etcd_endpoints), "prefix": o.etcd_prefix,
                 "watches": watches,
                 "connected": bool(watches) and all(w.get("connected") for w in watches.values())},
        "config_mismatch": src.config_mismatch(),
        # --ip-blackhole-route (daemon/blackhole_route.py); None when it is off
        "blackhole_route": (state.blackhole.status()
                            if state.blackhole is not None else None),
        # the host's forwarding sysctls, {"ipv4": on, "ipv6": on} (daemon/host_forwarding.py)
        "host_forwarding": src.host_forwarding(),
        "packets": packets,
        "packets_ipv6": packets_ipv6,
        "drops": drops,
        "warnings": warnings.records() if warnings is not None else [],
    }


def partial_document(state, error: Exception) -> dict:
    """What the status says when :func:`document` failed: the facts read without the reports'
    source, and the error (``ready`` False: nothing checked)."""
    lease = state.lease
    return {"pid": os.getpid(), "version": __version__, "time": time.time(),
            "phase": state.phase, "ready": False, "checks": {},
            "lease": None if lease is None else {"subnet": str(lease.subnet)},
            "tun": state.dataplane.tun_name,
            "error": f"{type(error).__name__}: {error}",
            "warnings": []}


class StatusServer(UnixListener):
    """Serves :func:`document` on ``path``, one connection at a time (each is one short write)."""
    backlog = 8
    thread_name = "status"

    def __init__(self, path: str, state, source, warnings: WarningRing | None = None):
        super().__init__(path)
        self.state, self.source = state, source
        self.warnings = warnings
        self.failures = 0               # documents that could not be made: a bug each

    def start(self) -> "StatusServer":
        self.listen()
        log.info("Status on %s (flannel-udp status --status-socket %s)", self.path, self.path)
        return self

    def handle(self, conn) -> bool:
        since, cpu = answer_clock.begun(), time.thread_time()    # called right after its accept
        try:
            if self._serve(conn):
                answer_clock.CLOCK.done("status", since, time.thread_time() - cpu)
        except OSError as e:        # the client's: gone, or not reading
            log.debug("status client: %s", e)
        finally:
            conn.close()
        return False

    def _serve(self, conn) -> bool:
        """True once the document is sent."""
        pid, uid = peer_credentials(conn)
        if not peer_allowed(uid):       # the mode says so already; a copied socket does not
            log.warning("status: refused uid %d (pid %d)", uid, pid)
            return False
        reply = self.answer()
        # The document fits the socket's buffer: one send that cannot wait. Each syscall gives
        # the interpreter lock up and waits to take it back behind the daemon's busy threads
        # (a start, a burst of leases): settimeout's ioctl and sendall's poll were two more.
        try:
            sent = conn.send(reply, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        if sent < len(reply):
            conn.settimeout(SEND_TIMEOUT_S)
            conn.sendall(memoryview(reply)[sent:])
        return True

    def answer(self) -> bytes:
        """The document as sent; whatever part of the state it could not read, an answer that
        says so with what is known (never a closed connection without one)."""
        try:
            return json.dumps(document(self.state, self.source, self.warnings),
                              default=str).encode() + b"\n"
        except Exception as e:
            # a bug of ours, not the client's: said once with where it is, then counted
            self.failures += 1
            if self.failures == 1:
                log.warning("status: the document could not be made (%s); answering what is "
                            "known. Please report this with the traceback", e, exc_info=True)
            else:
                log.debug("status: the document could not be made (%s), %d time(s)", e,
                          self.failures)
            return json.dumps(partial_document(self.state, e), default=str).encode() + b"\n"


def listen(path: str, state, source,
           warnings: WarningRing | None = None) -> StatusServer | None:
    """The status socket of the daemon whose DaemonState is ``state`` and DaemonSource
    ``source``; None (with a warning) when ``path`` is empty or cannot be bound."""
    if not path:
        return None
    try:
        return StatusServer(path, state, source, warnings).start()
    except OSError as e:
        log.warning("cannot serve the status on %s (%s): `flannel-udp status` will not answer",
                    path, e)
        return None


def query(path: str, timeout: float = 5.0) -> dict:
    """The running daemon's status document (the client side); OSError when none answers."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.settimeout(timeout)
        s.connect(path)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    finally:
        s.close()
    raw = b"".join(chunks)
    if not raw:
        raise ConnectionError(f"{path} closed the connection without an answer")
    return json.loads(raw)
