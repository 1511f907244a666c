"""The flannel-udp daemon: flanneld's udp backend, start to finish.

Startup, in flanneld's order (docs/flannel-compat.md#process, docs/flannel-compat.md#tun-device);
each step is a function of daemon/startup.py::

    1. external interface        flanneld's rules (dataplane.host.iface)
    2. etcd registry, signals, /healthz (and /metrics) server
    3. network config            <prefix>/config, retried every second until valid
    4. lease                     reuse by PublicIP, else the subnet.env subnet, else random
    5. flannel0                  ioctl(TUNSETIFF) by this process; <lease net>/32,
                                 MTU = interface MTU - 28, up, route <Network> dev flannel0;
                                 one fd per queue (--queues), vnet headers for --offload auto
    6. UDP socket(s)             bound to the interface address and the config's port, one
                                 per queue (SO_REUSEPORT); offloads probed (dataplane.host.offload)
    7. iptables                  --ip-masq (FLANNEL-POSTRTG), --iptables-forward-rules (FLANNEL-FWD)
    8. subnet.env                FLANNEL_NETWORK / SUBNET / MTU / IPMASQ
    9. engine + watches          one engine per queue (engine.multi), made first; the peer
                                 watch lists the leases and their routes go in; then the
                                 engine starts (so the source check knows the peers from the
                                 first datagram); each batch of peer changes -> the kept route
                                 table updated (control/routes.py) -> every queue at once;
                                 own lease renewal
   10. READY=1 to systemd        when $NOTIFY_SOCKET is set (daemon/systemd.py)

Then the main thread runs the checks of daemon/monitor.py every second until a signal:
SIGTERM/SIGINT stop the engine, close flannel0 (closing the fd removes it), keep the iptables
rules (as flanneld) and the lease in etcd and exit 0. SIGHUP, or our lease deleted in etcd, re-acquires a
lease without touching the peers' routes (daemon/lease_move.py).

Beyond flanneld: ``--accept-from leases`` drops datagrams whose source is no lease's PublicIP
(counted as drop_bad_source, logged at most every 10 s).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from ..cli import flanneld_flags
from ..control.peerset import PeerChange, PeerSnapshot
from ..control.routes import route_changes
from ..host import queues
from . import lease_move, startup
from .metrics import DaemonSource
from .monitor import MONITOR_PERIOD_S, Monitor
from .peer_log import PeerLog
from .startup import StartupError, Stopped
from .systemd import sd_notify

log = logging.getLogger(__name__)

PEERS_READY_TIMEOUT_S = 5.0
# The Python engine shares the interpreter with the control plane: a thread that wants it waits
# up to the switch interval (5 ms by default) for a busy one, and a burst of lease events keeps
# the control plane busy; 0.5 ms bounds what that adds to a packet.
PY_ENGINE_SWITCH_INTERVAL_S = 0.0005


class Daemon:
    """One run of `flannel-udp run`."""

    def __init__(self, opts: flanneld_flags.Options):
        self.opts = opts
        self._stop = threading.Event()
        self._reacquire = threading.Event()
        self._pending_lease = None
        self.lock = threading.RLock()         # guards engine, lease, peers
        self.ext = None                       # ExternalInterface
        self.registry = None
        self.config = None
        self.lease = None
        self.subnets = None                   # SubnetManager
        self.peer_watcher = None
        self.config_watcher = None
        self.peers = PeerSnapshot()           # the last snapshot the peer watcher handed over
        self.routes = None                    # its route table, as the engine class takes it
        self.peer_log = None                  # daemon/peer_log.py
        self.tun_fds: list = []               # one per queue
        self.tun_name = None
        self.socks: list = []                 # one per queue
        self.queues = 1
        self.offloads = None                  # host.offload.Offloads
        self.offload_flags = 0
        self.rules = None
        self.engine = None                    # engine.multi.MultiEngine
        self.engine_cls = None
        self.engine_why = ""
        self.servers = []
        self._old_handlers = {}
        self.source = DaemonSource(self)      # what /metrics, /readyz and /debug/trace read

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        self._install_signals()
        try:
            try:
                self._startup()
            except Stopped:
                log.info("Stopped before startup completed")
                return 0
            except StartupError as e:
                log.error("%s", e)
                return 1
            return self._serve()
        finally:
            self._shutdown()
            self._restore_signals()

    def _install_signals(self):
        def stop(signum, _frame):
            log.info("Received %s, shutting down (the lease is kept in etcd)",
                     signal.Signals(signum).name)
            self._stop.set()

        def hup(_signum, _frame):
            log.info("Received SIGHUP: re-acquiring the lease (peers are kept)")
            self._reacquire.set()

        if threading.current_thread() is not threading.main_thread():
            return  # embedded use (tests): the caller stops us with stop()
        for sig, fn in ((signal.SIGTERM, stop), (signal.SIGINT, stop), (signal.SIGHUP, hup)):
            self._old_handlers[sig] = signal.signal(sig, fn)

    def _restore_signals(self):
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)

    def stop(self):
        self._stop.set()

    def wait(self, seconds: float) -> None:
        """Sleep during startup; raises Stopped when SIGTERM/SIGINT arrives meanwhile."""
        if self._stop.wait(seconds):
            raise Stopped()

    # ------------------------------------------------------------------ startup
    def _startup(self):
        o = self.opts
        # 1. external interface
        self.ext = startup.select_interface(o)
        # 2. registry, health and metrics
        self.registry = startup.make_registry(o)
        self.servers = startup.start_http_servers(o, self.source)
        # 3. config
        self.config = startup.wait_for_config(self.registry, self.wait)
        # 4. lease
        self.subnets = startup.make_lease_manager(o, self.registry, self.ext, self.config,
                                                  self.on_lease_change)
        self.lease = startup.acquire_lease(self.subnets, self.registry, self.wait)
        # the engine decides the queues' fds (vnet headers for its offloads)
        self._select_engine()
        # 5. flannel0
        self.tun_fds, self.tun_name = startup.open_tun(self.offloads, self.queues,
                                                       self.lease.subnet, self.config.network,
                                                       self.ext)
        # 6. UDP socket(s) and the offloads they and flannel0 accept
        self.socks = startup.open_sockets(self.ext, self.config.backend_port, self.queues)
        self.offload_flags = startup.probe_offloads(self.offloads, self.tun_fds, self.socks)
        # 7. iptables
        self.rules = startup.install_rules(o, self.config.network, self.lease.subnet)
        # 8. subnet.env
        startup.write_subnet_env(o, self.config.network, self.lease.subnet, self.ext.tun_mtu)
        # 9. engine and watches: the routes to the listed peers are in before the engine
        #    forwards, so that the source check accepts their datagrams from the first one
        self._new_engine()
        self._start_watches()
        self._start_engine()
        # 10. systemd
        sd_notify("READY=1")
        log.info("Running: flannel0=%s subnet %s, %d peer(s), engine %s, %d queue(s)",
                 self.tun_name, self.lease.subnet, len(self.peers), self.engine.name,
                 self.queues)

    def _select_engine(self):
        """The engine class, then what it decides: the queues and the offloads to try."""
        from ..host.offload import Offloads
        o = self.opts
        self.engine_cls, self.engine_why = startup.choose_engine(o)
        if self.engine_cls.name == "python":
            sys.setswitchinterval(PY_ENGINE_SWITCH_INTERVAL_S)
        self.queues, note = queues.effective(o.queues, o.trace)
        if note:
            log.info("%s", note)
        self.offloads = Offloads(o.offload, self.engine_cls.name)

    def _new_engine(self):
        with self.lock:
            self.engine = startup.new_engine(self.engine_cls, self.opts, self.tun_fds, self.socks,
                                             self.lease.subnet, self.ext.tun_mtu,
                                             self.offload_flags)

    def _start_engine(self):
        o = self.opts
        with self.lock:
            self.engine.start()
        log.info("Engine: %s (%s), %d queue(s); accepting datagrams from %s", self.engine.name,
                 self.engine_why, len(self.engine),
                 "known leases only (--accept-from leases)" if o.accept_from == "leases"
                 else "any source (--accept-from any, as flanneld)")

    def _start_watches(self):
        from ..control.configwatch import ConfigWatcher
        from ..control.peers import PeerWatcher
        self.peer_log = PeerLog(self.config.backend_port)
        self.peer_watcher = PeerWatcher(self.registry, self.lease.subnet, self.on_peers,
                                        network=self.config.network)
        self.peer_watcher.start()
        self.config_watcher = ConfigWatcher(self.registry, self.config).start()
        # READY should mean "routes to the known peers are in": wait for the first snapshot,
        # but not forever (the watcher keeps retrying on its own if etcd is away).
        if not self.peer_watcher.wait_ready(PEERS_READY_TIMEOUT_S):
            log.warning("Peer leases not listed yet (etcd slow or away); routes follow when it "
                        "answers")
        self.subnets.start()

    # ------------------------------------------------------------------ callbacks
    def on_peers(self, change: PeerChange):
        """PeerWatcher callback (its publisher thread, or ours during a lease move): the one way
        a peer change reaches the engine. The change is applied to the table kept here (the work
        of the change, not of the whole table), which every queue takes whole and at once; a new
        engine (after a lease move) gets the whole table the same way."""
        removed, added = route_changes(change, self.config.backend_port)
        with self.lock:
            table = self.routes if self.routes is not None else self.engine_cls.table_type.of()
            self.routes = table.updated(removed, added)
            self.peers = change.snapshot
            if self.engine is not None:
                self.engine.set_table(self.routes)
            self.peer_log.record(change, len(self.routes))

    def on_lease_change(self, lease):
        """SubnetManager callback (its thread): our lease was lost in etcd (deleted, expired,
        taken) and it acquired one again. The main thread applies it."""
        log.warning("Our lease was lost in etcd and re-acquired: %s (PublicIP %s), expires %s",
                    lease.subnet, lease.public_ip, startup.when(lease.expiration))
        with self.lock:
            self._pending_lease = lease

    def current_lease(self):
        sm = self.subnets
        lease = sm.lease if sm is not None else None
        return lease or self.lease

    # ------------------------------------------------------------------ main loop
    def _serve(self):
        monitor = Monitor(self.opts.v)
        while not self._stop.wait(MONITOR_PERIOD_S):
            with self.lock:
                pending, self._pending_lease = self._pending_lease, None
            if pending is not None:
                lease_move.adopt(self, pending)
            if self._reacquire.is_set():
                self._reacquire.clear()
                try:
                    lease_move.reacquire(self)
                except Stopped:
                    return 0
                except StartupError as e:
                    log.error("%s; retrying in 5 s", e)
                    self._reacquire.set()
                    if self._stop.wait(5):
                        return 0
            with self.lock:
                engine = self.engine
                if self.peer_log is not None:
                    self.peer_log.tick()
            status = monitor.check(engine, self.tun_name, self.tun_attached())
            if status is not None:
                return status
        return 0

    def tun_attached(self) -> bool:
        from ..host.tun import tun_attached
        try:
            # Every queue is detached with the device; asking the first suffices.
            return not self.tun_fds or tun_attached(self.tun_fds[0])
        except OSError as e:          # not a verdict: never exit on an unexpected answer
            log.debug("TUNGETIFF on %s: %s", self.tun_name, e)
            return True

    # ------------------------------------------------------------------ shutdown
    def _shutdown(self):
        steps = [
            ("stop the peer watch", lambda: self.peer_watcher and self.peer_watcher.stop()),
            ("stop the config watch", lambda: self.config_watcher and self.config_watcher.stop()),
            ("stop the lease renewal", lambda: self.subnets and self.subnets.stop()),
            ("stop the engine", self._close_engine),
            ("close flannel0", self._close_tun),
            ("close the UDP sockets", lambda: [s.close() for s in self.socks]),
            ("stop the iptables resync (the rules stay)", lambda: self.rules and self.rules.stop()),
            ("stop the HTTP servers", lambda: [s.close() for s in self.servers]),
            ("close the etcd client", lambda: self.registry and self.registry.close()),
        ]
        for what, fn in steps:
            try:
                fn()
            except Exception as e:
                log.warning("while shutting down, could not %s: %s", what, e)
        if self.lease is not None:
            log.info("Exiting; the lease %s stays in etcd until it expires", self.lease.subnet)

    def _close_engine(self):
        with self.lock:
            if self.engine is not None:
                self.engine.close()

    def _close_tun(self):
        fds, self.tun_fds = self.tun_fds, []
        for fd in fds:              # the last close removes flannel0
            os.close(fd)


__all__ = ["Daemon", "StartupError"]
