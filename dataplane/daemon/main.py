"""The flannel-udp daemon: flanneld's udp backend, start to finish.

(Over 600 lines, on purpose until the per-family state of issue 45 moves out: this file is the start order below, the serve loop and the shutdown
steps, read in one place. Each part with a job of its own is a module of daemon/ (its
__init__.py lists them: the state the reports read, peer changes -> routes, the takeover, the
start steps), or host/assembly.py for the dataplane; what stays here is what ties them, and the
callbacks the watchers, the lease manager and the handover make.)

Startup, in flanneld's order (docs/flannel-compat.md#process, docs/flannel-compat.md#tun-device);
each step is a function of daemon/startup.py::

    0. what the previous daemon  systemd's fd store, else the handover socket (--handover):
       hands over                flannel0's queues, the UDP sockets, the lease and the peers,
                                 kept when they match the config (daemon/inherited.py)
    1. external interface        flanneld's rules (dataplane.host.iface); then what this host
                                 lacks (privileges, TUN, firewall tool, subnet.env's directory),
                                 and after 3. the UDP port and the firewall tool of each
                                 family (EnableIPv6: ip6tables): exit 1 before any etcd write
                                 (daemon/preflight.py)
    2. etcd registry, signals, /healthz (and /metrics) server
    3. network config            <prefix>/config, retried every second until valid
    4. lease                     reuse by PublicIP, else the subnet.env subnet, else random
    5. flannel0                  ioctl(TUNSETIFF) by this process; <lease net>/32,
                                 MTU = interface MTU - 28, up, route <Network> dev flannel0;
                                 with EnableIPv6 also <IPv6 lease net>/128 and
                                 <IPv6Network> dev flannel0;
                                 one fd per queue (--queues), vnet headers for --offload auto
    6. UDP socket(s)             bound to the interface address and the config's port, one
                                 per queue (SO_REUSEPORT), or one (and one flannel0 queue)
                                 where the host refuses their steering; offloads probed;
                                 5.-6. are the dataplane's assembly (host/assembly.py)
       blackhole route           --ip-blackhole-route: blackhole <lease net>, at once rather
                                 than one --iptables-resync period later as flanneld, then
                                 checked every period on the tick (daemon/blackhole_route.py)
    7. iptables                  --ip-masq (FLANNEL-POSTRTG), --iptables-forward-rules (FLANNEL-FWD);
                                 with EnableIPv6 ip6tables' too (host/firewall_stack.py)
    8. subnet.env                FLANNEL_NETWORK / SUBNET / (IPV6_NETWORK / IPV6_SUBNET) /
                                 MTU / IPMASQ
    9. engine + watches          one engine per queue (host/assembly.py), made first; the
                                 peer watch lists the leases and their routes go in; then the
                                 engine starts (so the source check knows the peers from the
                                 first datagram); each batch of peer changes -> the kept route
                                 table updated (daemon/peer_routes.py) -> every queue at once;
                                 own lease renewal
   10. READY=1 to systemd        when $NOTIFY_SOCKET is set (daemon/systemd.py); before it, the
                                 fds and the state go into systemd's fd store when it keeps fds
                                 (daemon/takeover.py), and the handover socket listens

A daemon that takes over (step 0, daemon/takeover.py) skips what the fds already are: it keeps
the lease without an etcd write, flannel0 and its route, the sockets; its engine starts with the
peers' routes it was handed, in the old engine's place (the kernel queues packets meanwhile).

Then the main thread runs the checks of daemon/monitor.py every second, and at once when an
engine loop ends (flannel0 deleted: the engine sees it, no polling), and tells the engine
when this host's addresses changed (host/own_sources.py), until a signal:
SIGTERM/SIGINT stop the watches first and the engine last, close flannel0 (closing the last fd
removes it: systemd's fd store holds one across a restart), keep the iptables rules and the
blackhole route (as flanneld) and the lease in etcd and exit 0. SIGHUP, or our lease deleted in
etcd, re-acquires a lease without touching the peers' routes (daemon/lease_move.py). SIGUSR2
(`systemctl reload`) starts the installed flannel-udp with --handover: it takes over through the
handover socket and we exit (daemon/handover.py).

Beyond flanneld: ``--accept-from leases`` drops datagrams whose source is no lease's PublicIP
(counted as drop_bad_source, logged at most every 10 s); a datagram whose inner source is this
host's own is always dropped (drop_inner_local), and with ``--strict-sources`` one whose inner
source is not in the sending lease's subnet (drop_inner_foreign): docs/threat-model.md.
"""
from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
import time

from ..control.peerset import PeerChange, PeerSnapshot
from ..control.recurring import Recurring
from ..host import queues
from ..host.assembly import Dataplane
from ..host.own_sources import OwnSources
from . import handover, inherited, lease_move, preflight, startup, status, takeover
from .blackhole_route import BlackholeRoute
from .host_forwarding import HostForwarding
from .liveness import Liveness
from .monitor import MONITOR_PERIOD_S, Monitor
from .options import Options
from .peer_log import PeerLog
from .peer_routes import PeerRoutes
from .startup import StartupError, Stopped
from .state import DaemonSource, DaemonState, keeps_state
from .subnet_env import SubnetEnv
from .systemd import sd_notify
from .timefmt import when

log = logging.getLogger(__name__)

# The Python engine shares the interpreter with the control plane: a thread that wants it waits
# up to the switch interval (5 ms by default) for a busy one. The busiest part, the peer watch
# during a burst of lease events, runs in a child process with this engine; for the rest
# (HTTP, the route table, the monitor) 0.5 ms bounds what it adds to a packet.
PY_ENGINE_SWITCH_INTERVAL_S = 0.0005
# Until READY=1 every wait of the startup moves systemd's start timeout (TimeoutStartSec) this
# far past its own end: a host that waits for etcd or the network config keeps waiting, as
# flanneld does, instead of being killed and restarted every TimeoutStartSec. The margin covers
# one etcd call that hangs until its own timeout between two waits.
START_WAIT_MARGIN_S = 60.0


@keeps_state
class Daemon:
    """One run of `flannel-udp run`. What its reports read (the lease, the engine, the peers,
    the watchers...) is kept in ``self.state`` (daemon/state.py DaemonState), and each of those
    fields is an attribute of the daemon too (``self.engine`` is ``self.state.engine``)."""

    def __init__(self, opts: Options):
        self._stop = threading.Event()
        self._wake = threading.Event()        # the serve loop's: a signal, or an engine loop ended
        self._reacquire = threading.Event()
        self._upgrade = threading.Event()        # SIGUSR2: a successor takes over
        self._pending_lease = None
        self.state = DaemonState(
            opts, subnet_env=SubnetEnv(opts.subnet_file, opts.ip_masq),
            move_failures=lease_move.Failures(),
            blackhole=BlackholeRoute(opts.ip_blackhole_route, opts.iptables_resync),
            forwarding=HostForwarding(),      # warned, never set (daemon/host_forwarding.py)
            # /healthz and systemd's watchdog: the main loop's ticks and the engine's heartbeats;
            # an engine stopped for a handover is stopped on purpose (daemon/liveness.py)
            liveness=Liveness.for_daemon(lambda: None if self.handing_over else self.engine))
        self.registry = None
        self.peer_routes = PeerRoutes(self.state)   # peer changes -> routes (daemon/peer_routes.py)
        self.peer_log = None                  # daemon/peer_log.py
        self.dataplane = Dataplane()          # flannel0's queues, the sockets (host/assembly.py)
        self.queues = 1                       # asked for; then the dataplane's
        self.underlay6 = None                 # (PublicIPv6, bind address, inner MTU) or None
        self.rules = None
        self._reacquire_failing = Recurring(log, "Re-acquiring the lease (SIGHUP)",
                                            level=logging.ERROR)
        self.engine_cls = None
        self._peer_child = None               # the peer watch's process, started early
        self.own_sources = OwnSources()       # what the engine knows of this host's addresses
        self.servers = []
        self.state_file = None                # inherited.StateFile in systemd's fd store
        self.handover_server = None
        self.handing_over = False             # our engine is stopped for a new daemon
        self._successor = None                # the pid we handed over to
        self._let_go = threading.Event()      # another daemon holds the host: stop_reconciling
        self._let_go_lock = threading.Lock()
        self._ready = False                   # READY=1 sent
        self._old_handlers = {}
        self.source = DaemonSource(self.state)    # what /metrics, /readyz and /debug/trace read
        # what `flannel-udp status` reads, with the last warnings (daemon/status.py)
        self.status_server = None
        self.warnings = status.WarningRing()

    # What the handover offers and the state file counts (daemon/handover.py, inherited.py).
    tun_fds = property(lambda self: self.dataplane.tun_fds)
    socks = property(lambda self: self.dataplane.socks)
    socks6 = property(lambda self: self.dataplane.socks6)

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        self.warnings.install()
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
            self.stop()

        def hup(_signum, _frame):
            log.info("Received SIGHUP: re-acquiring the lease (peers are kept)")
            self._reacquire.set()
            self._wake.set()

        def usr2(_signum, _frame):
            log.info("Received SIGUSR2: starting the installed flannel-udp to take over")
            self._upgrade.set()
            self._wake.set()

        if threading.current_thread() is not threading.main_thread():
            return  # embedded use (tests): the caller stops us with stop()
        for sig, fn in ((signal.SIGTERM, stop), (signal.SIGINT, stop), (signal.SIGHUP, hup),
                        (signal.SIGUSR2, usr2)):
            self._old_handlers[sig] = signal.signal(sig, fn)

    def _restore_signals(self):
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)

    def stop(self):
        self._stop.set()
        self._wake.set()

    def wait(self, seconds: float) -> None:
        """Sleep during startup (and a SIGHUP's lease retries); raises Stopped when
        SIGTERM/SIGINT arrives meanwhile. Once serving, waiting on purpose is the main loop's
        progress: it ticks, so that a long etcd outage does not read as a hang."""
        deadline = time.monotonic() + seconds
        if not self._ready:
            sd_notify(f"EXTEND_TIMEOUT_USEC={int((seconds + START_WAIT_MARGIN_S) * 1e6)}\n"
                      "STATUS=waiting for etcd and the network config (the journal says what "
                      "is missing)")
        while True:
            self.liveness.tick(ping=self._successor is None, serving=False)
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._stop.wait(min(left, MONITOR_PERIOD_S)):
                raise Stopped()

    # ------------------------------------------------------------------ startup
    def _startup(self):
        o = self.opts
        # 0. what the previous daemon hands over
        inh = startup.receive_inherited(o)
        # 1. external interface
        self.ext = startup.select_interface(o)
        # what this host lacks is said now, before etcd holds a lease for a host that cannot
        # forward (what a handed-over daemon holds is not opened again)
        preflight.local(o, inherited=inh is not None)
        # 2. registry, health and metrics (a running old daemon holds the ports until it exits)
        self.registry = startup.make_registry(o)
        http_later = inh is not None and inh.old_running
        if not http_later:
            self.servers = startup.start_http_servers(o, self.source)
            self.status_server = status.listen(o.status_socket, self.state, self.source,
                                               self.warnings)
        # 3. config (the old daemon's when etcd does not answer: it forwards meanwhile)
        self.config = startup.wait_for_config(self.registry, self.wait,
                                              fallback=inh.config_raw if inh else None)
        if inh is None:                 # the config names the port: a read, still no write
            preflight.udp_port(self.ext, self.config.backend_port)
        startup.check_ipv6(self.config, self.ext)
        preflight.firewall_tools(o, self.config)    # the IPv6 rules' tool is known only now
        self.forwarding.want(self.config.enable_ipv6)
        self.underlay6 = startup.ipv6_underlay(o, self.config, self.ext)
        if inh is not None:             # its IPv6 sockets, handed over or opened now
            self.underlay6 = takeover.underlay6(inh, self.underlay6, self.ext,
                                                self.config.backend_port)
        elif self.underlay6 is not None:
            preflight.udp_port(self.ext, self.config.backend_port, ip=self.underlay6[1])
        self.lease_manager = startup.make_lease_manager(o, self.registry, self.ext, self.config,
                                                        self.on_lease_change,
                                                        public6=self._public6())
        # the engine decides the queues' fds (vnet headers for its offloads)
        self._select_engine()
        if inh is not None:
            inh, self.lease = takeover.check(
                inh, ext=self.ext, config=self.config, lease_manager=self.lease_manager,
                acquire=lambda: startup.acquire_lease(self.lease_manager, self.registry,
                                                      self.wait),
                queues=self.queues, vnet=self.offloads.wanted)
        if inh is not None:
            # 4.-6. kept: the lease, flannel0, the sockets; our engine forwards from here on
            self._take_over(inh)
        else:
            # 4. lease
            self.lease = startup.acquire_lease(self.lease_manager, self.registry, self.wait)
            # 5.-6. flannel0, the UDP socket(s), the offloads they accept (host/assembly.py)
            self._use(startup.open_dataplane(self.offloads, self.queues,
                                             startup.parts(self.config, self.lease), self.ext,
                                             self.config.backend_port, self._public6(bind=True)))
            self.peer_routes.follow_lease(self.config.ipv6_network, self.lease.ipv6_subnet,
                                          self._routed6())
        # the lease's blackhole route; that of the subnet subnet.env still names, if another, goes
        self.blackhole.want(self.lease.subnet, previous=self.lease_manager.subnet_file_prev)
        # 7. iptables
        self.rules = startup.install_rules(o, startup.parts(self.config, self.lease),
                                           enable_nftables=self.config.enable_nftables)
        # 8. subnet.env (rewritten on the tick while a write fails)
        self.subnet_env.want(self.config.network, self.lease.subnet, self.ext.tun_mtu,
                             self.config.ipv6_network, self.lease.ipv6_subnet)
        # 9. engine and watches: the routes to the listed peers are in before the engine
        #    forwards, so that the source check accepts their datagrams from the first one
        if self.engine is None:
            self._make_engine()
            self._start_watches()
            with self.lock:
                self.engine.start()
        else:                           # taken over: it forwards already, with the old routes
            self._start_watches()
        if http_later:
            self.servers = startup.start_http_servers(o, self.source, retry=True)
            self.status_server = status.listen(o.status_socket, self.state, self.source,
                                               self.warnings)
        # 10. what a restart or a new daemon takes over; systemd
        self.state_file = takeover.keep_for_restart(self.state_file, self.dataplane,
                                                    lambda: inherited.state_of(self))
        if o.handover_socket:
            self.handover_server = startup.listen_for_handover(o.handover_socket, self)
        # What startup made (modules, the first peer set) lives as long as the daemon: out of
        # the collector's sight, a full collection no longer walks it, and the Python engine's
        # packets no longer wait that out (docs/design.md#fig-gc-freeze).
        gc.freeze()
        sd_notify(f"READY=1\nSTATUS=forwarding for {self.lease.subnet}")
        self._ready = True
        log.info("Running: flannel0=%s subnet %s, %d peer(s), engine %s, %d queue(s)",
                 self.tun_name, self.lease.subnet, len(self.peers), self.engine.name,
                 self.queues)

    def _select_engine(self):
        """The engine class, then what it decides: the queues and the offloads to try."""
        from ..host.offload import Offloads
        o = self.opts
        self.engine_cls, self.engine_why = startup.choose_engine(o)
        if self.engine_cls.forwards_in_python:
            sys.setswitchinterval(PY_ENGINE_SWITCH_INTERVAL_S)
            # The peer watch's process imports while we take the lease and make the devices.
            from ..control import peer_process
            self._peer_child = peer_process.prepare()
        self.queues, note = queues.effective(o.queues, o.trace)
        if note:
            log.info("%s", note)
        self.offloads = Offloads(o.offload, self.engine_cls.name)

    def _use(self, dataplane: Dataplane):
        """flannel0 and the sockets from here on: as many queues as they have (fewer than asked
        where the host refuses the sockets' steering)."""
        self.dataplane, self.tun_name, self.queues = dataplane, dataplane.tun_name, dataplane.queues

    def _public6(self, bind: bool = False):
        """Our PublicIPv6 (``bind``: the address the IPv6 sockets bind), None without an IPv6
        underlay (daemon/startup.py ipv6_underlay)."""
        return None if self.underlay6 is None else self.underlay6[1 if bind else 0]

    def _routed6(self) -> tuple:
        """(our PublicIPv6, the inner MTU over it) for the routes: (None, 0) without an IPv6
        underlay, whose sockets are open (control/routes.py Ipv6Parts)."""
        if self.underlay6 is None or not self.dataplane.socks6:
            return None, 0
        return self.underlay6[0], self.underlay6[2]

    def _make_engine(self):
        """A new engine on our fds, with the routes of the peers we know; not started."""
        o = self.opts
        engine = startup.new_engine(self.engine_cls, o, self.tun_fds, self.dataplane.sockets,
                                    startup.subnets(self.lease), self.ext.tun_mtu,
                                    self.dataplane.offload_flags, self.own_sources)
        self.liveness.hold_for_test(engine, self._stop)
        with self.lock:
            self.peer_routes.load(engine)
            self.engine = engine
        log.info("Engine: %s (%s), %d queue(s); accepting datagrams from %s", engine.name,
                 self.engine_why, len(engine),
                 "known leases only (--accept-from leases)" if o.accept_from == "leases"
                 else "any source (--accept-from any, as flanneld)")
        log.info("Inner sources dropped: this host's own (%s%s and its %d address(es))%s",
                 self.lease.subnet,
                 "" if self.lease.ipv6_subnet is None else f", {self.lease.ipv6_subnet}",
                 len(self.own_sources.addresses),
                 "; and any not in the sending lease's subnet (--strict-sources)"
                 if o.strict_sources else "")

    # ------------------------------------------------------------------ taking over
    def _take_over(self, inh):
        self.state_file = inh.state_file
        self._use(startup.adopt_dataplane(self.offloads, inh, self.queues,
                                          startup.parts(self.config, self.lease)))
        self.peer_routes.follow_lease(self.config.ipv6_network, self.lease.ipv6_subnet,
                                      self._routed6())
        self._take_peers(inh.state)
        self._make_engine()
        state = inh.switch(self.engine.start)
        # what changed on the old daemon since its offer
        with self.lock:
            self._take_peers(state)
            self.peer_routes.load(self.engine)
        lease, _ = inherited.kept_lease(state, self.ext, self.config)
        if lease is not None and lease != self.lease:
            self.lease_manager.adopt(lease)
            if (lease.subnet, lease.ipv6_subnet) == (self.lease.subnet, self.lease.ipv6_subnet):
                self.lease = lease
            else:                       # it moved meanwhile: the serve loop moves us too
                self.on_lease_change(lease)
        # IPv6 sockets named in the offer and kept (takeover.underlay6 opens new ones only when
        # none came): an operator sees the IPv6 underlay went on without a gap
        handed6 = (f", the IPv6 underlay's {len(self.socks6)} socket(s)"
                   if inh.state.get("udp6") and self.socks6 else "")
        log.info("Took over from pid %s through %s: forwarding on %s (%d queue(s)%s) with %d "
                 "peer route(s) it knew", state.get("pid", "?"), inh.way, self.tun_name,
                 len(self.tun_fds), handed6, len(self.peers))

    def _take_peers(self, state) -> None:
        self.peers = PeerSnapshot.of(inherited.peers_of(state), self.lease.subnet)
        self.peers6 = PeerSnapshot.of(inherited.peers_of(state, ipv6=True), self.lease.subnet)

    def _save_state(self):
        takeover.save(self.state_file, lambda: inherited.state_of(self))

    # ------------------------------------------------------------------ handing over
    def resume_engine(self):
        """A switch failed after our engine stopped: forward again, on the same fds."""
        with self.lock:
            old = self.engine
        old.close()
        self._make_engine()
        with self.lock:
            self.engine.start()
            self.handing_over = False

    def stop_reconciling(self):
        """Another daemon holds the host from now on (it took over, or starts afresh once we
        exit): nothing of ours may put back what it changes, as the firewall's resync would (a
        start without EnableIPv6 removes the IPv6 rules), nor the direct routes (the host's
        route watch, the peer watch), the lease (its renewal takes our key back), the blackhole
        route or subnet.env (the serve loop's tick). The handover runs it before the new daemon
        goes on; the shutdown runs it first. Once: a second call waits for the first."""
        with self._let_go_lock:
            if self._let_go.is_set():
                return
            self._let_go.set()
            _steps([
                ("stop the peer watch", lambda: self.peer_watcher and self.peer_watcher.stop()),
                ("stop watching the host's routes (the direct routes stay)",
                 self.peer_routes.close),
                ("stop the lease renewal",
                 lambda: self.lease_manager and self.lease_manager.stop()),
                ("stop the iptables resync (the rules stay)",
                 lambda: self.rules and self.rules.stop()),
            ])

    def handed_over(self, pid: int):
        """The new daemon forwards: free our HTTP ports for it and exit. Under systemd it is
        the unit's main process from now on. It may change what we set up from now on: we
        stop reconciling first (the handover says "released" after this returns)."""
        self.stop_reconciling()
        self._successor = pid
        sd_notify(f"MAINPID={pid}")
        servers, self.servers = self.servers, []
        for s in servers:
            s.close()
        self.stop()

    def _start_watches(self):
        self.peer_routes.start_direct(self.engine_cls.table_type, self.socks6)
        self.peer_log = PeerLog(self.config.backend_port)
        child, self._peer_child = self._peer_child, None
        self.peer_watcher, self.config_watcher = startup.start_watches(
            self.registry, self.lease.subnet, self.config, self.ext, self.on_peers,
            in_process=self.engine_cls.forwards_in_python, prepared=child)
        startup.wait_for_peers(self.peer_watcher)
        self.lease_manager.start()

    # ------------------------------------------------------------------ callbacks
    def on_peers(self, change: PeerChange):
        """PeerWatcher callback (its publisher thread, or ours during a lease move): the one way
        a peer change reaches the engine (daemon/peer_routes.py)."""
        self.peer_routes.on_peers(change, self.engine_cls.table_type, self.peer_log)

    def on_lease_change(self, lease):
        """LeaseManager callback (its thread): our lease was lost in etcd (deleted, expired,
        taken) and it acquired one again. The main thread applies it."""
        log.warning("Our lease was lost in etcd and re-acquired: %s (PublicIP %s), expires %s",
                    lease.subnet, lease.public_ip, when(lease.expiration))
        with self.lock:
            self._pending_lease = lease

    def current_lease(self):
        return self.state.current_lease()

    # ------------------------------------------------------------------ main loop
    def _serve(self):
        monitor = Monitor(self.opts.v, offloads=self.dataplane.offload_flags)
        watched = None
        while True:
            with self.lock:
                engine = self.engine
            if engine is not None and engine is not watched:   # each engine we start
                engine.on_end(lambda _engine: self._wake.set())
                watched = engine
            self._wake.wait(MONITOR_PERIOD_S)
            self._wake.clear()
            if self._stop.is_set():
                return 0
            # before anything that may take long; not once a successor is the main process
            self.liveness.tick(ping=self._successor is None)
            # our engine is stopped on purpose, lease moves wait; or another daemon holds the host
            if self.handing_over or self._let_go.is_set():
                continue
            if self._upgrade.is_set():
                self._upgrade.clear()
                handover.spawn_successor(self.handover_server)
            with self.lock:
                pending, self._pending_lease = self._pending_lease, None
            if pending is not None:
                self._move_to(pending)
            if self._reacquire.is_set():
                self._reacquire.clear()
                try:
                    self._move_to(self._reacquire_lease())
                    self._reacquire_failing.ok()
                except Stopped:
                    return 0
                except StartupError as e:
                    self._reacquire_failing.fail(str(e), "retrying every 5 s", key="sighup")
                    self._reacquire.set()
                    if self._stop.wait(5):
                        return 0
            with self.lock:
                engine, subnets = self.engine, startup.subnets(self.lease)
                save = self.peer_routes.take_changed()
                if self.peer_log is not None:
                    self.peer_log.tick()
            if save:
                self._save_state()
            self.subnet_env.retry()
            self.blackhole.tick()
            self.forwarding.check()
            self.own_sources.refresh(engine, subnets)
            status = monitor.check(engine, self.tun_name, on_purpose=lambda: (
                self.handing_over or self._let_go.is_set() or self.engine is not engine))
            if status is not None:
                return status

    def _reacquire_lease(self):
        """SIGHUP: a new lease manager acquires again (the same lease if etcd still holds it for
        our PublicIP); returns the lease to move to."""
        current = self.current_lease()
        try:
            self.lease_manager.stop()
        except Exception as e:
            log.debug("stopping the lease manager: %s", e)
        self.lease_manager = startup.make_lease_manager(self.opts, self.registry, self.ext,
                                                        self.config, self.on_lease_change,
                                                        prev=current.subnet,
                                                        public6=self._public6())
        new = startup.acquire_lease(self.lease_manager, self.registry, self.wait)
        self.lease_manager.start()
        return new

    def _move_to(self, lease) -> None:
        """Adopt ``lease``, moving the host to its subnet if that is another one
        (daemon/lease_move.py); a move that failed is tried again on the next tick, unless the
        lease manager has handed over a newer lease meanwhile."""
        with self.lock:
            old = self.lease
        if not lease_move.move(old, lease, self._move_host(), self.move_failures):
            with self.lock:
                if self._pending_lease is None:
                    self._pending_lease = lease
            return
        with self.lock:
            self.lease = lease
        self.peer_routes.follow_lease(self.config.ipv6_network, lease.ipv6_subnet,
                                      self._routed6())
        if (lease.subnet, lease.ipv6_subnet) != (old.subnet, old.ipv6_subnet):
            self.subnet_env.want(self.config.network, lease.subnet, self.ext.tun_mtu,
                                 self.config.ipv6_network, lease.ipv6_subnet)
        self._save_state()

    def _move_host(self) -> lease_move.Host:
        """What a lease move changes, and how its new engine takes the place of ours."""
        def new_engine(subnets):
            return startup.new_engine(self.engine_cls, self.opts, self.tun_fds,
                                      self.dataplane.sockets, subnets, self.ext.tun_mtu,
                                      self.dataplane.offload_flags, self.own_sources)

        def swap_engine(engine):
            with self.lock:
                old, self.engine = self.engine, engine
            return old

        def restore_engine(engine):
            with self.lock:
                self.engine = engine
                self.peer_routes.load(engine)
        return lease_move.Host(tun_name=self.tun_name, mtu=self.ext.tun_mtu,
                               network=self.config.network, subnet_file=self.opts.subnet_file,
                               more_networks=tuple(
                                   p.network for p in startup.parts(self.config, self.lease)[1:]),
                               rules=self.rules, new_engine=new_engine, swap_engine=swap_engine,
                               restore_engine=restore_engine,
                               own_subnet=self.peer_watcher.set_own_subnet,
                               blackhole=self.blackhole.moved)

    # ------------------------------------------------------------------ shutdown
    def _shutdown(self):
        # The engine stops last: until then it forwards, and under systemd's fd store the next
        # process reads the queues from where it stopped.
        self.stop_reconciling()
        _steps([
            ("end the peer watch's unused process",
             lambda: self._peer_child and self._peer_child.close()),
            ("stop the config watch", lambda: self.config_watcher and self.config_watcher.stop()),
            ("stop the HTTP servers", lambda: [s.close() for s in self.servers]),
            ("close the status socket", lambda: self.status_server and self.status_server.close()),
            ("stop keeping the last warnings", self.warnings.remove),
            ("close the etcd client", lambda: self.registry and self.registry.close()),
            ("leave the state to the next process", self._leave_to_next),
            ("stop the engine", self._close_engine),
            # the last fd of flannel0 closed removes it
            ("close flannel0 and the UDP sockets", self.dataplane.close),
            ("say that the blackhole route stays",
             lambda: self._successor is None and self.blackhole.leave()),
            ("close the address reader", self.own_sources.close),
            ("close the state", lambda: self.state_file and self.state_file.close()),
            # last: a daemon that asked us to exit reads our exit as the end of this connection
            ("close the handover socket", lambda: self.handover_server
             and self.handover_server.close()),
        ])
        if self._successor is not None:
            log.info("Exiting: pid %d forwards on %s now, with the lease %s", self._successor,
                     self.tun_name, self.lease.subnet)
        elif self.lease is not None:
            log.info("Exiting; the lease %s stays in etcd until it expires", self.lease.subnet)

    def _leave_to_next(self):
        """In systemd's fd store: the newest state (`systemctl stop` closes the store, and
        flannel0 with it)."""
        if self.state_file is not None and self._successor is None:
            self._save_state()

    def _close_engine(self):
        with self.lock:
            if self.engine is not None:
                self.engine.close()


def _steps(steps) -> None:
    """(what, fn) in order; a step that fails is said and the next one runs."""
    for what, fn in steps:
        try:
            fn()
        except Exception as e:
            log.warning("while shutting down, could not %s: %s", what, e)


__all__ = ["Daemon", "StartupError"]
