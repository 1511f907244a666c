"""The peer watch in a child process: what the daemon runs with the Python engine.

(Over 450 lines as one piece: both ends of one private link, the daemon's proxy and the
child's main, whose messages, order and restarts must be read the same way on both sides.)

The Python engine forwards in the daemon's interpreter, so every stretch of Python the control plane
runs (decoding etcd's watch responses, parsing leases, diffing the peer set) is time the forwarding
loop may wait for the interpreter lock, at every system call it returns from: a burst of lease
events doubled the median ping RTT between two stable hosts (perf/README.md#lease-bursts). Here the whole ``PeerWatcher`` (control/peers.py) runs in a child
process with an etcd client of its own; the daemon gets each of its reports as ``(added, removed)``
over a socket and applies it to the peer set it mirrors. What is left in the daemon's interpreter is
reading one message per batch and updating the route table. The C engine forwards without the lock
and keeps the watcher in a thread (no second process, no second etcd client).

``PeerWatchProcess`` takes PeerWatcher's arguments and offers the same interface, ``PeerWatch``
(control/peer_watch.py), and hands ``on_change`` the same ``PeerChange`` reports in the same order,
so the daemon and the tests use either.

The link: length-prefixed pickles over a stream socketpair; both ends are this module, which is
why it runs past 500 lines: the parent's and the child's halves of one protocol are read together.
  parent -> child   ("init", registry spec, own subnet, network, retry_interval, coalesce,
                     log level, own PublicIPs) once, then ("own", seq, subnet), ("flush", seq), ("stop",)
  child -> parent   ("report", added, removed), ("status", {...}) when it changed,
                     ("done", seq), ("log", a log record's attributes)
  parent -> child   ("ack",) once a report is applied: the child counts a report as lasting
                     until then, so the watcher's pacing (the next batch waits ten times what a
                     report took) keeps the daemon's share of a burst to about a tenth, however
                     long the daemon takes per report (the route table grows with the peers)
The child's log records are written by the daemon's logging, so they look like its own lines; each
goes out after a fresh status, so the daemon's /metrics never lags what its log just said. The
child ignores SIGINT and SIGTERM (a terminal's Ctrl-C and systemd's stop signal every process of the
group; the daemon decides when its watch ends) and exits when the daemon's end of the socket closes,
which the kernel also does when the daemon dies. If the child dies, the daemon logs it and starts
another after ``retry_interval`` (doubling up to 30 s); the new child's first listing is compared
with the peers the daemon had, so a change made meanwhile is reported like any other.
"""
from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import socket
import struct
import subprocess
import threading
from ipaddress import IPv4Network
from typing import Optional

from ..host import logfmt
from .peers import COALESCE_S, OnChange, PeerWatcher, hand_on
from .peerset import PeerChange, PeerSnapshot
from .registry import Registry

log = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
STATUS_PERIOD_S = 0.1       # how often the child looks whether its status changed
RESPAWN_MAX_S = 30.0
COMMAND_TIMEOUT_S = 30.0    # set_own_subnet / flush give up waiting for a child this slow
STOP_TIMEOUT_S = 5.0
ACK_TIMEOUT_S = 1.0         # a report lasts at most this long in the child's pacing
# The child yields the CPU to the forwarding loop when both want it (a burst is a tenth of a
# second of its work; a packet waiting behind it is latency).
CHILD_NICE = 10
CHILD_NAME = "flannel-peers"


class _Link:
    """One end of the socketpair: whole messages in, whole messages out (sends serialised)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._in = sock.makefile("rb")
        self._send_lock = threading.Lock()

    def send(self, msg) -> bool:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with self._send_lock:
                self.sock.sendall(_HEADER.pack(len(data)) + data)
            return True
        except OSError:         # the other end is gone: the reader side notices and says so
            return False

    def recv(self):
        """The next message; None at the end of the stream."""
        try:
            head = self._in.read(_HEADER.size)
            if len(head) < _HEADER.size:
                return None
            (size,) = _HEADER.unpack(head)
            body = self._in.read(size)
        except (OSError, ValueError):     # ValueError: read on a file closed by close()
            return None
        if len(body) < size:
            return None
        try:
            return pickle.loads(body)
        except Exception:       # both ends are ours: a bad message is a bug; end the stream
            log.exception("peer watch process: unreadable message of %d bytes", size)
            return None

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._in.close()
        self.sock.close()


class _RemoteWatch:
    """The child's watch as the daemon's /readyz and /metrics read a WatchLoop (WatchStatus,
    control/peer_watch.py): ``connected``, and counters that keep counting across child restarts
    (a restart counts as a reconnect)."""

    def __init__(self):
        self.connected = threading.Event()
        self._base = {"reconnects": 0, "resyncs": 0}
        self._child = {"reconnects": 0, "resyncs": 0}

    @property
    def reconnects(self) -> int:
        return self._base["reconnects"] + self._child["reconnects"]

    @property
    def resyncs(self) -> int:
        return self._base["resyncs"] + self._child["resyncs"]

    def update(self, status: dict) -> None:
        self._child = {k: status.get(k, 0) for k in self._base}
        if status.get("connected"):
            self.connected.set()
        else:
            self.connected.clear()

    def child_gone(self) -> None:
        self.connected.clear()
        for k in self._base:
            self._base[k] += self._child[k]
        self._base["reconnects"] += 1
        self._child = dict.fromkeys(self._base, 0)


class PeerWatchProcess:
    """PeerWatcher, run in a child process; a PeerWatch (control/peer_watch.py). See the module's
    docstring."""

    def __init__(self, registry: Registry, own_subnet: Optional[IPv4Network],
                 on_change: Optional[OnChange], *, retry_interval: float = 1.0,
                 network: Optional[IPv4Network] = None, coalesce: float = COALESCE_S,
                 prepared: Optional["Prepared"] = None, own_ips=(), listing=None):
        # ``listing`` (control/peers.py) is not used: the child lists on its own, as handing
        # it thousands of leases would cost their pickling twice
        self._spec = registry.spec
        self._own_ips = tuple(own_ips)
        self._prepared = prepared                # a child started early (prepare()), if any
        self.network = network
        self.on_change = on_change
        self.retry_interval = retry_interval
        self.coalesce = coalesce
        self._own = own_subnet
        self._lock = threading.Lock()            # guards what the reader thread updates
        self._emit_lock = threading.RLock()      # reports reach on_change in order
        self._current = PeerSnapshot.of((), own_subnet)   # what on_change was last handed
        self._mirror: dict = {}                  # the child's peer set, from its reports
        self._fresh = True                       # this child has not listed yet
        self._status: dict = {}
        self._bad_base = 0
        self._watch = _RemoteWatch()
        self._link: Optional[_Link] = None
        self._proc: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._seq = 0
        self._waiting: dict[int, _Waiter] = {}   # commands sent, by seq, until "done"
        self._backoff = retry_interval
        self.ready = threading.Event()
        self.restarts = 0                        # children that died and were replaced

    # -- PeerWatch (control/peer_watch.py) --------------------------------------------------------
    @property
    def watch_loop(self) -> _RemoteWatch:
        return self._watch

    @property
    def bad_total(self) -> int:
        return self._bad_base + self._status.get("bad_total", 0)

    @property
    def revision(self) -> int:
        return self._status.get("revision", 0)

    @property
    def snapshots(self) -> int:
        return self._status.get("snapshots", 0)

    @property
    def batches(self) -> int:
        return self._status.get("batches", 0)

    @property
    def pid(self) -> Optional[int]:
        proc = self._proc
        return proc.pid if proc is not None else None

    def bad(self) -> dict[str, str]:
        return dict(self._status.get("bad", {}))

    def peers(self) -> dict:
        with self._lock:
            return dict(self._current.peers)

    def snapshot(self) -> PeerSnapshot:
        with self._lock:
            return self._current

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        return self.ready.wait(timeout)

    def start(self) -> None:
        self._stop.clear()
        self._spawn()
        self._reader = threading.Thread(target=self._read_loop, name="peer-watch-process",
                                        daemon=True)
        self._reader.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._prepared is not None:          # never started
            self._prepared.close()
            self._prepared = None
        link, proc = self._link, self._proc
        if link is not None:
            link.send(("stop",))
            link.close()
        if proc is not None:
            _reap(proc, min(timeout, STOP_TIMEOUT_S))
        if self._reader is not None:
            self._reader.join(timeout)
            self._reader = None
        self._release_waiters()

    def flush(self) -> None:
        self._command("flush")

    def set_own_subnet(self, subnet: Optional[IPv4Network]) -> None:
        """As PeerWatcher's: on_change gets one report for the new subnet before this returns."""
        with self._lock:
            self._own = subnet
        if self._command("own", subnet) and not self._fresh:
            return
        # No answer (the child is being replaced, or etcd is slow): report what we know, for
        # the new subnet, as PeerWatcher does when its re-list fails.
        if self._fresh:
            log.warning("peer watch process has not listed the peers yet; using the peers known")
        else:
            log.warning("peer watch process did not answer the subnet change; using the peers known")
        with self._emit_lock:
            with self._lock:
                change = PeerChange.between(self._current, self._mirror_snapshot())
                self._current = change.snapshot
            hand_on(self.on_change, change, always=True)

    # -- the child's lifecycle --------------------------------------------------------------------
    def _spawn(self) -> None:
        child, self._prepared = self._prepared or prepare(), None
        self._proc, self._link = child.proc, child.link
        with self._lock:
            own = self._own
            self._mirror, self._fresh = {}, True
        level = logging.getLogger().getEffectiveLevel()
        self._link.send(("init", self._spec, own, self.network, self.retry_interval,
                         self.coalesce, level, self._own_ips))
        log.debug("peer watch process %d started", self._proc.pid)

    def _read_loop(self) -> None:
        while True:
            link = self._link
            if link is not None:
                while (msg := link.recv()) is not None:
                    try:
                        self._handle(msg)
                    except Exception:       # one bad message must not end the watch
                        log.exception("peer watch process: message %r failed", msg[0])
            if self._stop.is_set():
                return
            if link is not None:
                self._child_gone(link)
            if self._stop.wait(self._backoff):
                return
            self._backoff = min(self._backoff * 2, RESPAWN_MAX_S)
            try:
                self._spawn()
            except OSError as e:
                log.error("cannot start the peer watch process: %s; trying again in %gs", e,
                          self._backoff)
                self._link = None

    def _child_gone(self, link: _Link) -> None:
        link.close()                 # a child still running reads the end and exits
        code = _reap(self._proc, STOP_TIMEOUT_S)
        self.restarts += 1
        with self._lock:
            self._bad_base += self._status.get("bad_total", 0)
            self._status = {**self._status, "bad_total": 0}
        self._watch.child_gone()
        self._release_waiters()
        log.error("peer watch process exited (%s); starting another in %gs, until then the routes "
                  "stay as they are", _exit_text(code), self._backoff)

    def _handle(self, msg) -> None:
        kind = msg[0]
        if kind == "report":
            self._report(msg[1], msg[2])
        elif kind == "status":
            self._on_status(msg[1])
        elif kind == "done":
            with self._lock:
                waiter = self._waiting.pop(msg[1], None)
            if waiter is not None:
                waiter.answered = True
                waiter.event.set()
        elif kind == "log":
            record = logging.makeLogRecord(msg[1])
            logging.getLogger(record.name).handle(record)

    def _report(self, added, removed) -> None:
        try:
            with self._emit_lock:
                with self._lock:
                    for lease in removed:
                        self._mirror.pop(lease.subnet, None)
                    for lease in added:
                        self._mirror[lease.subnet] = lease
                    if self._fresh:   # a new child's first listing: reported whole once it is in
                        return
                    snap = self._mirror_snapshot()
                    change = PeerChange(snap, tuple(added), tuple(removed))
                    self._current = snap
                hand_on(self.on_change, change, always=True)
        finally:
            self._link.send(("ack",))

    def _on_status(self, status: dict) -> None:
        change = None
        with self._emit_lock:
            with self._lock:
                self._status = status
                if status.get("ready") and self._fresh:
                    # Compared with what the daemon has, not with nothing: after a restart the
                    # peers that left while no child watched are reported removed.
                    self._fresh = False
                    change = PeerChange.between(self._current, self._mirror_snapshot())
                    self._current = change.snapshot
            self._watch.update(status)
            if change is not None:
                hand_on(self.on_change, change)
                self._backoff = self.retry_interval
                self.ready.set()

    def _mirror_snapshot(self) -> PeerSnapshot:
        """The child's peers as a snapshot (caller holds _lock). The child leaves our own subnet
        out; dropped here too for the moment a new one is ours and the child has not heard."""
        return PeerSnapshot.of(self._mirror, self._own)

    def _command(self, kind: str, *args) -> bool:
        """Send a command and wait until the child has done it (its reports are in): True, or
        False when it did not answer in time or went away."""
        waiter = _Waiter()
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._waiting[seq] = waiter
        link = self._link
        if link is not None and link.send((kind, seq, *args)):
            waiter.event.wait(COMMAND_TIMEOUT_S)
        with self._lock:
            self._waiting.pop(seq, None)
        return waiter.answered

    def _release_waiters(self) -> None:
        """Wake the commands a gone child will never answer."""
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            waiter.event.set()


class _Waiter:
    __slots__ = ("event", "answered")

    def __init__(self):
        self.event = threading.Event()
        self.answered = False


class Prepared:
    """A child process started, importing, and waiting for its ``init``."""

    def __init__(self, proc: subprocess.Popen, link: _Link):
        self.proc, self.link = proc, link

    def close(self) -> None:
        """Not needed after all (startup failed): the child reads the end and exits."""
        self.link.close()
        _reap(self.proc, STOP_TIMEOUT_S)


def prepare() -> Prepared:
    """Start the child now (its imports take a while: docs/design.md#fig-peer-child-start) and
    hand it to PeerWatchProcess later,
    so that the daemon's startup does not wait for them. A child never handed over ends when the
    daemon does (its end of the socket closes)."""
    from ..host.child import python_argv
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc = subprocess.Popen(
            python_argv(f"from dataplane.control.peer_process import child_main\n"
                        f"child_main({theirs.fileno()})"),
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    finally:
        theirs.close()
    return Prepared(proc, _Link(ours))


def _reap(proc: subprocess.Popen, timeout: float):
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _exit_text(code) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


# -- the child ------------------------------------------------------------------------------------
class _Forward(logging.Handler):
    """Queues every record for the daemon, formatted into its message (arguments and traceback).
    A thread sends them (``send``), each after a fresh status: a record is emitted after the
    change it tells of (a bad lease key counted), often under the watcher's lock, so the daemon's
    /metrics never lags its log."""

    def __init__(self):
        super().__init__()
        self.queue: queue.SimpleQueue = queue.SimpleQueue()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        # the event's fields too (json log lines carry them), as plain values: the link pickles
        extra = {k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
                 for k, v in logfmt.fields(record).items()}
        self.queue.put(("log", {**extra, "name": record.name, "levelno": record.levelno,
                                "levelname": record.levelname, "msg": text, "args": None,
                                "pathname": record.pathname, "filename": record.filename,
                                "module": record.module, "lineno": record.lineno,
                                "funcName": record.funcName, "threadName": record.threadName}))

    def send(self, link: _Link, before) -> None:
        """Until the None that ends it: ``before()``, then the records queued meanwhile."""
        while True:
            batch = [self.queue.get()]
            while True:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            before()
            for msg in batch:
                if msg is None:
                    return
                link.send(msg)


def child_main(fd: int) -> None:
    try:                # what ps -o comm and top show, instead of the daemon's "python3"
        with open("/proc/self/comm", "w") as f:
            f.write(CHILD_NAME)
    except OSError:
        pass
    os.nice(CHILD_NICE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    link = _Link(socket.socket(fileno=fd))
    init = link.recv()
    if init is None or init[0] != "init":
        os._exit(2)
    _, spec, own, network, retry_interval, coalesce, level, own_ips = init
    root = logging.getLogger()
    logs = _Forward()
    root.handlers[:] = [logs]
    root.setLevel(level)
    registry = Registry(**spec, warn_insecure=False)     # the daemon has warned
    stop = threading.Event()
    status_lock = threading.Lock()
    last: list = [None]

    def status() -> dict:
        watch = watcher.watch_loop
        return {"ready": watcher.ready.is_set(), "bad": watcher.bad(),
                "bad_total": watcher.bad_total, "revision": watcher.revision,
                "snapshots": watcher.snapshots, "batches": watcher.batches,
                "connected": watch is not None and watch.connected.is_set(),
                "reconnects": watch.reconnects if watch is not None else 0,
                "resyncs": watch.resyncs if watch is not None else 0}

    def send_status(always: bool = False) -> None:
        # Always after the reports it covers: a status saying "ready" follows the first listing's.
        with status_lock:
            now = status()
            if (always or now != last[0]) and link.send(("status", now)):
                last[0] = now

    acks = threading.Condition()
    counts = {"reports": 0, "acks": 0}

    def on_change(change) -> None:
        with acks:
            counts["reports"] += 1
            due = counts["reports"]
        link.send(("report", change.added, change.removed))
        send_status()
        with acks:          # the report lasts until the daemon has applied it
            acks.wait_for(lambda: counts["acks"] >= due or stop.is_set(), ACK_TIMEOUT_S)

    def report_status() -> None:
        while not stop.is_set():
            send_status()
            stop.wait(STATUS_PERIOD_S if watcher.ready.is_set() else 0.005)

    watcher = PeerWatcher(registry, own, on_change, retry_interval=retry_interval,
                          network=network, coalesce=coalesce, own_ips=own_ips)
    commands: queue.SimpleQueue = queue.SimpleQueue()

    def run_commands() -> None:
        # Not in the reading thread: a command's report waits for its ack, which that thread reads.
        while (msg := commands.get()) is not None:
            if msg[0] == "own":
                watcher.set_own_subnet(msg[2])
            elif msg[0] == "flush":
                watcher.flush()
            send_status(always=True)
            link.send(("done", msg[1]))

    sender = threading.Thread(target=logs.send, args=(link, send_status), name="peer-logs",
                              daemon=True)
    sender.start()
    watcher.start()
    threading.Thread(target=report_status, name="peer-status", daemon=True).start()
    threading.Thread(target=run_commands, name="peer-commands", daemon=True).start()
    while True:
        msg = link.recv()
        if msg is None or msg[0] == "stop":
            break
        if msg[0] == "ack":
            with acks:
                counts["acks"] += 1
                acks.notify_all()
        else:
            commands.put(msg)
    commands.put(None)
    with acks:
        stop.set()
        acks.notify_all()
    watcher.stop(timeout=2.0)
    registry.close()
    logs.queue.put(None)
    sender.join(2.0)
    os._exit(0)
