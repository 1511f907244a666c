"""Handing flannel0 and the UDP sockets from the running daemon to a new one, without systemd.

(Just over 500 lines: the old daemon's side and the new one's of one protocol, read together.)

The running daemon listens on a unix socket in the runtime directory (``--handover-socket``;
mode 0600, and the peer must be root or our own user). A daemon
started with ``--handover`` connects to it and they speak in frames (a 4-byte length, then one JSON
object; fds ride with the first byte of a frame, at most MAX_FDS_PER_FRAME per frame):

    new -> old   {"op": "hello", "pid": N, "udp6": true}
    old -> new   {"op": "offer", "state": {...}, "fds": T}        + T fds: the TUN queues, then the
                                                                   sockets (both in queue order),
                                                                   then, when "udp6": K, the K
                                                                   IPv6 underlay sockets (only
                                                                   to a hello that says "udp6")
    new -> old   {"op": "stop"}          the new one is ready to forward (or {"op": "exit"}: it starts
                                         afresh, the old one stops and exits)
    old -> new   {"op": "stopped", "state": {...}}   the old engine has ended; the newest state
    new -> old   {"op": "forwarding"}    the new engine runs
    old -> new   {"op": "released"}      the old one closed its HTTP ports and exits

Before "released", or as soon as told "exit", the old daemon stops all that reconciles the host
and the lease (the firewall's resync, the direct routes, the peer and lease watches: Daemon
``stop_reconciling``): the new one may change what the old set up (one started without
EnableIPv6 removes the IPv6 firewall rules), and the old must not put it back before it exits.

Between "stop" and "forwarding" nobody reads flannel0 and the sockets: the kernel queues what
arrives (daemon/inherited.py). If the new daemon goes away or says nothing for SWITCH_TIMEOUT_S
after "stop", the old one forwards again with a new engine on the same fds. Under systemd's fd
store the offer carries the state's memfd too (the last fd, "state_fd": true), so that the new
daemon keeps the one systemd holds; the old one names the new one the unit's main process
(``MAINPID=``) before it exits.

SIGUSR2 (``kill -USR2``) makes the running daemon start the installed flannel-udp itself, with
its own command line and environment and ``--handover`` (:func:`spawn_successor`): an upgrade in
place, in the unit's cgroup. If the new code does not start, the old keeps running.

``systemctl reload`` (the unit's ExecReload, ``flannel-udp reload $FLANNEL_UDP_OPTIONS``) does
the same with what the unit says now: systemd reads the environment file anew for every command
it starts, so the reload command carries the edited file's values, and hands them over on this
socket (:func:`request_reload`):

    reload -> old  {"op": "reload", "argv": ["run", ...], "env": {"FLANNELD_...": "..."}}
    old -> reload  {"op": "reloading", "pid": N}   it started pid N with that command line, its
                                                   own environment with these FLANNELD_* in
                                                   place of its own, and --handover
                   or {"op": "refused", "why": "..."}
    old -> reload  {"op": "reloaded", "pid": N}    N took over (it forwards), or
                   {"op": "failed", "why": "..."}  N exited first: the old one forwards on

so that `systemctl reload` returns once the new process forwards, and fails when it did not.
"""
from __future__ import annotations

import array
import errno
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time

from ..host.family import V4, V6
from ..host.unix_listener import UnixListener, peer_allowed, peer_credentials
from . import inherited
from .inherited import Inherited, StateFile

log = logging.getLogger(__name__)

MAX_FDS_PER_FRAME = 250                 # the kernel's SCM_MAX_FD is 253
MAX_FRAME = 64 << 20
OFFER_TIMEOUT_S = 10.0                  # old: to answer the hello; new: to read the offer
READY_TIMEOUT_S = 600.0                 # old: for the new one's decision (it may wait for etcd)
SWITCH_TIMEOUT_S = 10.0                 # either side, for each step of the switch itself
# reload: for the new process to take over; under the unit's TimeoutStartSec= (120 s), which
# bounds ExecReload, so that the reload command says what happened before systemd kills it
RELOAD_TIMEOUT_S = 100.0
RELOAD_ENV_PREFIX = "FLANNELD_"         # what the environment file holds for the daemon
_LEN = struct.Struct("!I")


class HandoverError(OSError):
    """The other side broke the protocol or went away."""


# ------------------------------------------------------------------ frames

def send_frame(sock: socket.socket, doc: dict, fds=()) -> None:
    fds = list(fds)
    first, rest = fds[:MAX_FDS_PER_FRAME], fds[MAX_FDS_PER_FRAME:]
    _send_one(sock, dict(doc, fds=len(fds)) if fds else doc, first)
    while rest:
        chunk, rest = rest[:MAX_FDS_PER_FRAME], rest[MAX_FDS_PER_FRAME:]
        _send_one(sock, {"op": "fds"}, chunk)


def _send_one(sock, doc, fds) -> None:
    data = json.dumps(doc, separators=(",", ":")).encode()
    frame = _LEN.pack(len(data)) + data
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sent = sock.sendmsg([frame], anc)
    if sent < len(frame):
        sock.sendall(frame[sent:])


def recv_frame(sock: socket.socket) -> tuple[dict, list]:
    """One frame and the fds it carries (those of following "fds" frames included)."""
    doc, fds = _recv_one(sock)
    want = int(doc.get("fds", 0)) if isinstance(doc.get("fds"), int) else len(fds)
    while len(fds) < want:
        more, got = _recv_one(sock)
        if more.get("op") != "fds":
            _close_fds(fds + got)
            raise HandoverError(errno.EPROTO, f"expected more fds, got {more.get('op')!r}")
        fds += got
    return doc, fds


def _recv_one(sock) -> tuple[dict, list]:
    fds: list = []
    head = b""
    while len(head) < _LEN.size:
        data, anc, _flags, _addr = sock.recvmsg(_LEN.size - len(head),
                                                socket.CMSG_SPACE(MAX_FDS_PER_FRAME * 4))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(payload[:len(payload) - len(payload) % a.itemsize])
                fds += list(a)
        if not data:
            _close_fds(fds)
            raise HandoverError(errno.ECONNRESET, "the other daemon closed the connection")
        head += data
    (size,) = _LEN.unpack(head)
    if size > MAX_FRAME:
        _close_fds(fds)
        raise HandoverError(errno.EMSGSIZE, f"a frame of {size} bytes")
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            _close_fds(fds)
            raise HandoverError(errno.ECONNRESET, "the other daemon closed the connection")
        body += chunk
    try:
        doc = json.loads(body)
    except ValueError as e:
        _close_fds(fds)
        raise HandoverError(errno.EPROTO, f"a frame that is no JSON: {e}") from None
    if not isinstance(doc, dict):
        _close_fds(fds)
        raise HandoverError(errno.EPROTO, "a frame that is no JSON object")
    for fd in fds:
        os.set_inheritable(fd, False)
    return doc, fds


def _close_fds(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _expect(sock, op: str, timeout: float) -> dict:
    sock.settimeout(timeout)
    doc, fds = recv_frame(sock)
    _close_fds(fds)
    if doc.get("op") != op:
        raise HandoverError(errno.EPROTO, f"expected {op!r}, got {doc.get('op')!r}")
    return doc


# ------------------------------------------------------------------ the new daemon's end

class FromHandover(Inherited):
    way = "the handover socket"

    def __init__(self, conn: socket.socket, state: dict, tun_fds: list, sockets: dict,
                 state_file: StateFile | None = None):
        super().__init__(state, tun_fds, sockets)
        self.conn = conn
        self.old_pid = state.get("pid")
        self.state_file = state_file

    @property
    def old_running(self) -> bool:
        return True

    def switch(self, start_engine) -> dict:
        state = self.state
        t0 = time.monotonic()
        send_frame(self.conn, {"op": "stop"})
        try:
            state = _expect(self.conn, "stopped", SWITCH_TIMEOUT_S).get("state") or state
        except (OSError, ValueError) as e:       # it went away: nobody forwards, so we do
            log.warning("The old daemon (pid %s) did not confirm that it stopped (%s); "
                        "forwarding anyway", self.old_pid, e)
        start_engine()
        log.info("Switched engines in %.1f ms: the old one stopped, ours started (the kernel "
                 "held what arrived meanwhile)", (time.monotonic() - t0) * 1e3)
        try:
            send_frame(self.conn, {"op": "forwarding"})
            _expect(self.conn, "released", SWITCH_TIMEOUT_S)
        except (OSError, ValueError) as e:
            log.warning("The old daemon (pid %s) did not confirm its exit (%s)", self.old_pid, e)
        self.conn.close()
        return state

    def release(self) -> None:
        """Ask the old daemon to exit (it closes flannel0 and the sockets), close ours, and wait
        until the device is gone."""
        self._close()
        if self.state_file is not None:
            self.state_file.close()
            self.state_file = None
        try:
            send_frame(self.conn, {"op": "exit"})
            self.conn.settimeout(inherited.RELEASE_TIMEOUT_S * 3)
            while self.conn.recv(4096):         # its end closes when it exits
                pass
        except OSError as e:
            log.warning("waiting for the old daemon (pid %s) to exit: %s", self.old_pid, e)
        self.conn.close()
        name = self.state.get("tun", {}).get("name")
        if name:
            inherited.wait_gone(name)


def connect(path: str) -> FromHandover | None:
    """The offer of the daemon listening on ``path``; None when no daemon listens there."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        conn.settimeout(OFFER_TIMEOUT_S)
        conn.connect(path)
    except OSError as e:
        conn.close()
        if e.errno in (errno.ENOENT, errno.ECONNREFUSED):
            log.info("--handover: no daemon listens on %s (%s): starting afresh", path,
                     os.strerror(e.errno))
            return None
        raise
    try:
        send_frame(conn, {"op": "hello", "pid": os.getpid(), "udp6": True})
        conn.settimeout(OFFER_TIMEOUT_S)
        doc, fds = recv_frame(conn)
        if doc.get("op") != "offer" or not isinstance(doc.get("state"), dict):
            _close_fds(fds)
            raise HandoverError(errno.EPROTO, f"expected an offer, got {doc.get('op')!r}")
    except BaseException:
        conn.close()
        raise
    state = doc["state"]
    n = int(state.get("tun", {}).get("queues", 0))
    extra = 1 if doc.get("state_fd") else 0
    n6 = int(doc.get("udp6", 0))
    if len(fds) != 2 * n + n6 + extra:
        _close_fds(fds)
        conn.close()
        raise HandoverError(errno.EPROTO, f"{len(fds)} fds for {n} queue(s)")
    # the fds in the offer's order: the TUN queues, then each underlay's sockets, IPv4's first
    sockets = {V4: [socket.socket(fileno=fd) for fd in fds[n:2 * n]],
               V6: [socket.socket(fileno=fd) for fd in fds[2 * n:2 * n + n6]]}
    log.info("--handover: the daemon with pid %s offers %s (%d queue(s)), its UDP sockets and its "
             "lease %s", state.get("pid"), state["tun"].get("name"), n,
             state.get("lease", {}).get("subnet"))
    return FromHandover(conn, state, fds[:n], sockets,
                        StateFile(fds[-1]) if extra else None)


# ------------------------------------------------------------------ the running daemon's end

class HandoverServer(UnixListener):
    """Listens on ``path`` and hands ``daemon``'s fds to the first daemon that asks.

    ``daemon`` (daemon/succession.py Succession) provides: ``state`` (its DaemonState: the
    lock, the engine, the dataplane's fds, what ``inherited.state_of`` reads), ``state_file``,
    ``handing_over`` (set while its engine is stopped for a switch), ``handed_over(pid)`` (which
    stops reconciling first), ``stop_reconciling()`` and ``stop()``; ``resume_engine()``
    forwards again after a failed switch."""
    thread_name = "handover"

    def __init__(self, path: str, daemon):
        super().__init__(path)
        self.daemon = daemon
        self._conn = None                     # kept open until we exit: its EOF says we are gone
        self._reload = None                   # a reload command's connection, until it is told
        self._reload_lock = threading.Lock()

    def start(self) -> "HandoverServer":
        self.listen()
        log.info("Listening for a handover on %s (start the new daemon with --handover)",
                 self.path)
        return self

    def close(self) -> None:
        super().close()
        if self._conn is not None:
            self._conn.close()

    def handle(self, conn) -> bool:
        try:
            if self._serve(conn):
                self._conn = conn
                return True
        except Exception as e:
            log.warning("Handover to a new daemon failed: %s", e)
        if conn is not self._reload:
            conn.close()
        return False

    def _peer_pid(self, conn) -> int:
        pid, uid = peer_credentials(conn)
        if not peer_allowed(uid):
            raise HandoverError(errno.EPERM, f"refused a handover to uid {uid} (pid {pid})")
        return pid

    def _serve(self, conn) -> bool:
        """One new daemon; True once this daemon is done (it exits)."""
        d = self.daemon
        pid = self._peer_pid(conn)
        conn.settimeout(OFFER_TIMEOUT_S)
        doc, extra = recv_frame(conn)
        _close_fds(extra)
        if doc.get("op") == "reload":
            self._start_reload(conn, pid, doc)
            return False
        if doc.get("op") != "hello":
            raise HandoverError(errno.EPROTO, f"expected 'hello', got {doc.get('op')!r}")
        # the IPv6 sockets only to a daemon that says it takes them (an older one would count
        # them as fds too many)
        dp = d.state.dataplane
        sockets = {f: socks for f, socks in dp.sockets.items() if f is V4 or doc.get("udp6")}
        with d.state.lock:
            state = inherited.state_of(d.state)
            fds = list(dp.tun_fds) + [s.fileno() for f in (V4, V6) for s in sockets.get(f, ())]
            state_file = d.state_file
        offer = {"op": "offer", "state": state}
        if sockets.get(V6):
            offer["udp6"] = len(sockets[V6])
        if state_file is not None:
            offer["state_fd"] = True
            fds.append(state_file.fd)
        send_frame(conn, offer, fds)
        log.info("Offered flannel0 and the UDP sockets to a new daemon (pid %d)", pid)
        conn.settimeout(READY_TIMEOUT_S)
        doc, extra = recv_frame(conn)
        _close_fds(extra)
        if doc.get("op") == "exit":
            log.warning("The new daemon (pid %d) does not take over and starts afresh: stopping", pid)
            d.stop_reconciling()
            self._tell_reload({"op": "reloaded", "pid": pid, "afresh": True})
            d.stop()
            return True
        if doc.get("op") != "stop":
            raise HandoverError(errno.EPROTO, f"expected 'stop', got {doc.get('op')!r}")
        self._stop_engine()
        try:
            send_frame(conn, {"op": "stopped", "state": inherited.state_of(d.state)})
            _expect(conn, "forwarding", SWITCH_TIMEOUT_S)
        except Exception as e:          # whatever went wrong, our engine must not stay stopped
            log.warning("The new daemon (pid %d) did not start forwarding (%s): forwarding "
                        "again", pid, e)
            d.resume_engine()
            return False
        d.handed_over(pid)
        self._tell_reload({"op": "reloaded", "pid": pid})
        try:
            send_frame(conn, {"op": "released"})
        except OSError:
            pass
        return True

    def _start_reload(self, conn, pid: int, doc: dict) -> None:
        """A reload command (pid): start the successor with what it brings."""
        argv, env = doc.get("argv"), doc.get("env")
        why = None
        if not (isinstance(argv, list) and argv[:1] == ["run"]
                and all(isinstance(a, str) for a in argv)):
            why = "the reload names no `run` command line"
        elif not (isinstance(env, dict) and all(
                isinstance(k, str) and k.startswith(RELOAD_ENV_PREFIX) and isinstance(v, str)
                for k, v in env.items())):
            why = f"the reload's environment holds more than {RELOAD_ENV_PREFIX}* strings"
        with self._reload_lock:
            if why is None and (self._reload is not None or self.daemon.handing_over):
                why = "a reload or a handover is already under way"
            if why is None:
                self._reload = conn
        if why is not None:
            log.warning("Refused a reload from pid %d: %s", pid, why)
            send_frame(conn, {"op": "refused", "why": why})
            return
        log.info("Reload asked by pid %d: %s", pid, _reload_changes(argv, env))
        fresh = {k: v for k, v in os.environ.items() if not k.startswith(RELOAD_ENV_PREFIX)}
        fresh.update(env)
        try:
            proc = spawn_successor(self, argv[1:], fresh, on_failure=self._reload_failed)
        except OSError as e:
            self._reload_failed(f"could not start flannel-udp: {e}")
            return
        self._tell_reload({"op": "reloading", "pid": proc.pid}, final=False)

    def _reload_failed(self, why: str) -> None:
        self._tell_reload({"op": "failed", "why": why})

    def _tell_reload(self, doc: dict, final: bool = True) -> None:
        """A frame for the reload command, if one waits; the ``final`` one closes it. (The
        successor's reaper may tell the end before the handover thread told the start.)"""
        with self._reload_lock:
            conn = self._reload
            if conn is None:
                return
            try:
                send_frame(conn, doc)
            except OSError as e:
                log.debug("the reload command went away: %s", e)
            if final:
                self._reload = None
                conn.close()

    def _stop_engine(self) -> None:
        d = self.daemon
        with d.state.lock:
            d.handing_over = True
            engine = d.state.engine
        engine.stop()
        if not engine.join(SWITCH_TIMEOUT_S):
            log.warning("the %s engine did not stop within %.0f s", engine.name, SWITCH_TIMEOUT_S)


def spawn_successor(server: HandoverServer | None, flags: list | None = None,
                    env: dict | None = None, on_failure=None) -> subprocess.Popen | None:
    """Start `flannel-udp run` again with --handover: the installed code takes over through
    ``server``'s socket. ``flags`` and ``env`` default to this daemon's own (SIGUSR2); a reload
    brings the unit's current ones. ``on_failure(why)`` if it exits before it took over. None
    when there is no socket to take over by."""
    from ..host.child import cli_argv
    if server is None:
        log.warning("SIGUSR2: no handover socket (--handover-socket is empty or could not be "
                    "made): stop and start the daemon to run another version")
        return None
    if flags is None:
        args = sys.argv[1:]
        # right after the subcommand: flags end at the first argument that is no flag
        at = args.index("run") + 1 if "run" in args else 0
    else:
        args, at = ["run", *flags], 1
    args = args[:at] + ["--handover", f"--handover-socket={server.path}"] + args[at:]
    proc = subprocess.Popen(cli_argv(*args), stdin=subprocess.DEVNULL, close_fds=True,
                            start_new_session=True, env=env)
    log.info("Started pid %d to take over: flannel-udp %s", proc.pid, " ".join(args))
    threading.Thread(target=_reap, args=(proc, on_failure), name="successor",
                     daemon=True).start()
    return proc


def _reap(proc: subprocess.Popen, on_failure=None) -> None:
    rc = proc.wait()
    if rc:
        log.error("The daemon started to take over (pid %d) exited with %d before it did; this "
                  "one keeps forwarding", proc.pid, rc)
        if on_failure is not None:
            on_failure(f"pid {proc.pid} exited with {rc} before it took over (its first lines "
                       "are in the daemon's log); the running daemon keeps forwarding")


def _reload_changes(argv: list, env: dict) -> str:
    """What a reload changes, for the log: the command line, and the names of the FLANNELD_*
    variables (not their values: --etcd-password has one)."""
    old = sys.argv[1:]
    line = ("the command line is unchanged" if argv == old else
            f"command line `flannel-udp {' '.join(old)}` -> `flannel-udp {' '.join(argv)}`")
    mine = {k: v for k, v in os.environ.items() if k.startswith(RELOAD_ENV_PREFIX)}
    changed = sorted(k for k in set(mine) | set(env) if mine.get(k) != env.get(k))
    return (f"{line}; {RELOAD_ENV_PREFIX}* "
            + (f"changed: {', '.join(changed)}" if changed else "unchanged"))


class ReloadError(RuntimeError):
    """The reload did not happen (the message says why); the running daemon forwards on."""


def request_reload(path: str, argv: list, env: dict, timeout: float = RELOAD_TIMEOUT_S,
                   started=None) -> int:
    """Ask the daemon on ``path`` to be replaced by `flannel-udp` ``argv`` (``["run", ...]``)
    with the FLANNELD_* variables ``env``; wait until the new process forwards and return its
    pid. ``started(pid)`` once it runs. ReloadError when it does not take over."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        conn.settimeout(OFFER_TIMEOUT_S)
        try:
            conn.connect(path)
        except OSError as e:
            raise ReloadError(f"no daemon listens on {path} ({e.strerror}): is it running, "
                              "with this --handover-socket?") from None
        try:
            send_frame(conn, {"op": "reload", "argv": list(argv), "env": dict(env)})
            doc = _expect_one(conn, ("reloading", "refused", "failed"), OFFER_TIMEOUT_S)
            if doc["op"] == "refused":
                raise ReloadError(f"the daemon refused: {doc.get('why')}")
            if doc["op"] == "reloading":
                if started is not None:
                    started(doc.get("pid"))
                doc = _expect_one(conn, ("reloaded", "failed"), timeout)
        except socket.timeout:
            raise ReloadError(f"no answer within {timeout:.0f} s; see the daemon's log") from None
        except HandoverError as e:
            raise ReloadError(f"the daemon did not say how it went: {e}") from None
        if doc["op"] == "failed":
            raise ReloadError(str(doc.get("why")))
        return int(doc.get("pid") or 0)
    finally:
        conn.close()


def _expect_one(sock, ops: tuple, timeout: float) -> dict:
    sock.settimeout(timeout)
    doc, fds = recv_frame(sock)
    _close_fds(fds)
    if doc.get("op") not in ops:
        raise HandoverError(errno.EPROTO, f"expected {' or '.join(ops)}, got {doc.get('op')!r}")
    return doc
