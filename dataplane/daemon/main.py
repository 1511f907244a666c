"""The flannel-udp daemon: flanneld's udp backend, start to finish.

(Over 450 lines as one piece: the start order below, the serve loop and the shutdown steps,
read in one place. Each part with a job of its own is a module of daemon/ (its __init__.py
lists them: the state the reports read, peer changes -> routes, the lease, the takeover, the
start steps, what a successor needs), or host/assembly.py for the dataplane; what stays here
is what ties them.)

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
                                 peer watch takes the leases step 4 listed (the thread's; the
                                 child process lists them) and their routes go in; then the
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
etcd, re-acquires a lease without touching the peers' routes (daemon/lease_keeper.py,
daemon/lease_move.py). SIGUSR2 (`systemctl reload`) starts the installed flannel-udp with
--handover: it takes over through the handover socket and we exit (daemon/handover.py,
daemon/succession.py).

Beyond flanneld: ``--accept-from leases`` drops datagrams whose source is no lease's PublicIP
(counted as drop_bad_source, logged at most every 10 s); a datagram whose inner source is this
host's own is always dropped (drop_inner_local), and with ``--strict-sources`` one whose inner
source is not in the sending lease's subnet (drop_inner_foreign): docs/threat-model.md.
"""
from __future__ import annotations

import logging
import sys
import threading
import time

from ..control.peerset import PeerSnapshot
from ..host import queues
from ..host.family import V6
from ..host.own_sources import OwnSources
from . import early_load, handover, inherited, lease_move, listing_ahead, preflight, signals
from . import startup, status, takeover
from .blackhole_route import BlackholeRoute
from .host_forwarding import HostForwarding
from .interpreter import StartInterpreter
from .lease_keeper import LeaseKeeper
from .liveness import Liveness
from .monitor import MONITOR_PERIOD_S, Monitor
from .kernel_path import LEFT_MESSAGE, DaemonKernelPath, device_name
from .options import Options
from .peer_routes import PeerRoutes
from .startup import StartupError, Stopped
from .state import DaemonSource, DaemonState
from .subnet_env import SubnetEnv
from .succession import Succession, steps
from .systemd import sd_notify

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


class Daemon:
    """One run of `flannel-udp run`. What it runs (the lease, the engine, flannel0, the peers,
    the watchers...) is in ``self.state`` (daemon/state.py DaemonState), which the reports read;
    what a successor needs of it is ``self.succession`` (daemon/succession.py)."""

    def __init__(self, opts: Options, early=None):
        self._stop = threading.Event()
        self._wake = threading.Event()        # the serve loop's: a signal, or an engine loop ended
        self._upgrade = threading.Event()        # SIGUSR2: a successor takes over
        self.state = st = DaemonState(
            opts, subnet_env=SubnetEnv(opts.subnet_file, opts.ip_masq),
            move_failures=lease_move.Failures(),
            blackhole=BlackholeRoute(opts.ip_blackhole_route, opts.iptables_resync),
            forwarding=HostForwarding(),      # warned, never set (daemon/host_forwarding.py)
            # /healthz and systemd's watchdog: the main loop's ticks and the engine's heartbeats;
            # an engine stopped for a handover is stopped on purpose (daemon/liveness.py)
            liveness=Liveness.for_daemon(
                lambda: None if self.succession.handing_over else self.state.engine))
        self.registry = None
        self.peer_routes = PeerRoutes(st)     # peer changes -> routes (daemon/peer_routes.py)
        self.queues = 1                       # asked for (the dataplane may have fewer)
        self.underlay6 = None                 # (PublicIPv6, bind address, inner MTU) or None
        self._peer_child = None               # the peer watch's process, started early
        self._early = early                   # the kernel path's load, started early
        self.own_sources = OwnSources()       # what the engine knows of this host's addresses
        self.servers = []
        self.handover_server = None
        # what the handover is handed, and the state file (daemon/succession.py)
        self.succession = Succession(st, self.peer_routes, stop=self.stop,
                                     make_engine=self._make_engine, free_ports=self._free_ports)
        # the lease manager, SIGHUP, the lease moves (daemon/lease_keeper.py)
        self.lease_keeper = LeaseKeeper(st, self.peer_routes, move_host=self._move_host,
                                        routed6=self._routed6, public6=self._public6,
                                        wait=self.wait, save_state=self.succession.save_state)
        self._ready = False                   # READY=1 sent
        self._old_handlers = {}
        self.source = DaemonSource(st)        # what /metrics, /readyz and /debug/trace read
        # what `flannel-udp status` reads, with the last warnings (daemon/status.py)
        self.status_server = None
        self.warnings = status.WarningRing()
        # the collector paused and a short switch interval while starting (daemon/interpreter.py)
        self.interpreter = StartInterpreter()

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        self.interpreter.begin()
        self.warnings.install()
        self._old_handlers = signals.install(stop=self.stop, reacquire=self.lease_keeper.reacquire,
                                             upgrade=self._upgrade, wake=self._wake)
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
            early_load.discard(self._early)
            self.interpreter.ready()
            self._shutdown()
            signals.restore(self._old_handlers)

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
        with self.interpreter.waiting():
            while True:
                self.state.liveness.tick(ping=self.succession.successor is None, serving=False)
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                if self._stop.wait(min(left, MONITOR_PERIOD_S)):
                    raise Stopped()

    # ------------------------------------------------------------------ startup
    def _startup(self):
        st = self.state
        o = st.opts
        # 0. what the previous daemon hands over
        inh = startup.receive_inherited(o)
        # the kernel path's programs load meanwhile (daemon/early_load.py)
        self._early = early_load.start(o, inh, begun=self._early)
        # 1. external interface
        st.ext = startup.select_interface(o)
        # what this host lacks is said now, before etcd holds a lease for a host that cannot
        # forward (what a handed-over daemon holds is not opened again)
        preflight.local(o, inherited=inh is not None)
        # 2. registry, health and metrics (a running old daemon holds the ports until it exits)
        self.registry = self.lease_keeper.registry = startup.make_registry(o)
        http_later = inh is not None and inh.old_running
        if not http_later:
            self._serve_http()
        # 3. config (the old daemon's when etcd does not answer: it forwards meanwhile)
        st.config = startup.wait_for_config(self.registry, self.wait,
                                            fallback=inh.config_raw if inh else None)
        ahead = listing_ahead.start(self.registry, inh)     # listed meanwhile (listing_ahead.py)
        if inh is None:                 # the config names the port: a read, still no write
            preflight.udp_port(st.ext, st.config.backend_port)
        startup.check_ipv6(st.config, st.ext)
        preflight.firewall_tools(o, st.config)    # the IPv6 rules' tool is known only now
        st.forwarding.want(st.config.enable_ipv6)
        self.underlay6 = startup.ipv6_underlay(o, st.config, st.ext)
        if inh is not None:             # its IPv6 sockets, handed over or opened now
            self.underlay6 = takeover.underlay6(inh, self.underlay6, st.ext,
                                                st.config.backend_port)
        elif self.underlay6 is not None:
            preflight.udp_port(st.ext, st.config.backend_port, ip=self.underlay6[1])
        st.lease_manager = self.lease_keeper.new_manager(ahead=ahead)
        # the engine decides the queues' fds (vnet headers for its offloads)
        self._select_engine(inh)
        if inh is not None:
            inh, st.lease = takeover.check(
                inh, ext=st.ext, config=st.config, lease_manager=st.lease_manager,
                acquire=lambda: startup.acquire_lease(st.lease_manager, self.registry,
                                                      self.wait),
                queues=self.queues, vnet=st.offloads.wanted)
        if inh is not None:
            # 4.-6. kept: the lease, flannel0, the sockets; our engine forwards from here on
            self._take_over(inh)
        else:
            # 4. lease
            st.lease = startup.acquire_lease(st.lease_manager, self.registry, self.wait)
            # 5.-6. flannel0, the UDP socket(s), the offloads they accept (host/assembly.py)
            # as many queues as they have (fewer than asked where the host refuses the
            # sockets' steering)
            st.dataplane = startup.open_dataplane(st.offloads, self.queues,
                                                  startup.parts(st.config, st.lease), st.ext,
                                                  st.config.backend_port, self._public6(bind=True),
                                                  st.kernel.tun_name)
            self.peer_routes.follow_lease(st.config.ipv6_network, st.lease.ipv6_subnet,
                                          self._routed6())
        st.kernel.hold(st.dataplane.tun_fds[0])     # persistent exactly on the kernel path
        # the lease's blackhole route; that of the subnet subnet.env still names, if another, goes
        st.blackhole.want(st.lease.subnet, previous=st.lease_manager.subnet_file_prev.get(4))
        # 7. iptables
        st.rules = startup.install_rules(o, startup.parts(st.config, st.lease),
                                         enable_nftables=st.config.enable_nftables)
        # 8. subnet.env (rewritten on the tick while a write fails)
        st.subnet_env.want(startup.parts(st.config, st.lease), st.ext.tun_mtu)
        # 9. engine and watches: the routes to the listed peers are in before the engine
        #    forwards, so that the source check accepts their datagrams from the first one
        if st.engine is None:
            self._make_engine()
            self._start_watches()
            with st.lock:
                self._start_engine(st.engine.start)
        else:                           # taken over: it forwards already, with the old routes
            self._start_watches()
        if http_later:
            self._serve_http(retry=True)
        # 10. what a restart or a new daemon takes over; systemd
        self.succession.keep_for_restart()
        if o.handover_socket:
            self.handover_server = startup.listen_for_handover(o.handover_socket, self.succession)
        # What startup made (modules, the first peer set) lives as long as the daemon: out of
        # the collector's sight, a full collection no longer walks it, and the Python engine's
        # packets no longer wait that out (docs/design.md#fig-gc-freeze); the collector, paused
        # while starting, runs again (daemon/interpreter.py).
        self.interpreter.ready()
        sd_notify(f"READY=1\nSTATUS=forwarding for {st.lease.subnet}")
        self._ready = True
        st.phase = "running"
        log.info("Running: flannel0=%s subnet %s, %d peer(s), engine %s%s, %d queue(s)",
                 st.dataplane.tun_name, st.lease.subnet, len(st.peers[4]), st.engine.name,
                 " behind the kernel path" if st.kernel and st.kernel.in_kernel else "",
                 st.dataplane.queues)

    def _serve_http(self, retry: bool = False):
        """/healthz, /metrics (and the rest: daemon/http.py) and the status socket."""
        o = self.state.opts
        self.servers = startup.start_http_servers(o, self.source, retry=retry)
        self.status_server = status.listen(o.status_socket, self.state, self.source,
                                           self.warnings)

    def _free_ports(self):
        """Our HTTP servers closed, for a successor that binds the same ports."""
        servers, self.servers = self.servers, []
        for s in servers:
            s.close()

    def _select_engine(self, inh):
        """The engine class, then what it decides: the queues and the offloads to try; the
        kernel path pinned for flannel0's name (a handed-over one's, else the one a kernel
        path left, else the first free: daemon/kernel_path.py)."""
        from ..engine.bpf_pins import pin_dir
        from ..host.offload import Offloads
        st = self.state
        o = st.opts
        pins = pin_dir(device_name(o.bpf_pins, inh.tun_name if inh is not None else None),
                       o.bpf_pins)
        choice = startup.choose_engine(o, pins, early_load.loader(self._early, pins))
        st.engine_cls, st.engine_why = choice.cls, choice.why
        st.kernel = DaemonKernelPath(choice, st.ext, st.config.backend_port, pins)
        if st.kernel.check():
            raise StartupError(f"--engine kernel: {st.kernel.check()}; fix that, or run with "
                               "--engine c or auto")
        if st.kernel.why:
            log.info("%s", st.kernel.why)
        if st.engine_cls.forwards_in_python:
            sys.setswitchinterval(PY_ENGINE_SWITCH_INTERVAL_S)
            # The peer watch's process imports while we take the lease and make the devices.
            from ..control import peer_process
            self._peer_child = peer_process.prepare()
        self.queues, note = queues.effective(o.queues, o.trace)
        if note:
            log.info("%s", note)
        st.offloads = Offloads(o.offload, st.engine_cls.name)

    def _public6(self, bind: bool = False):
        """Our PublicIPv6 (``bind``: the address the IPv6 sockets bind), None without an IPv6
        underlay (daemon/startup.py ipv6_underlay)."""
        return None if self.underlay6 is None else self.underlay6[1 if bind else 0]

    def _routed6(self) -> tuple:
        """(our PublicIPv6, the inner MTU over it) for the routes: (None, 0) without an IPv6
        underlay, whose sockets are open (control/routes.py Ipv6Parts)."""
        if self.underlay6 is None or not self.state.dataplane.sockets.get(V6):
            return None, 0
        return self.underlay6[0], self.underlay6[2]

    def _make_engine(self):
        """A new engine on our fds, with the routes of the peers we know; not started."""
        st = self.state
        o, dp, lease = st.opts, st.dataplane, st.lease
        engine = startup.new_engine(st.engine_cls, o, dp.tun_fds, dp.sockets,
                                    startup.subnets(lease), st.ext.tun_mtu,
                                    dp.offload_flags, self.own_sources)
        engine = self._wrap(engine, startup.subnets(lease))
        st.liveness.hold_for_test(engine, self._stop)
        with st.lock:
            self.peer_routes.load(engine)
            st.engine = engine
        log.info("Engine: %s (%s), %d queue(s); accepting datagrams from %s", engine.name,
                 st.engine_why, len(engine),
                 "known leases only (--accept-from leases)" if o.accept_from == "leases"
                 else "any source (--accept-from any, as flanneld)")
        log.info("Inner sources dropped: this host's own (%s%s and its %d address(es))%s",
                 lease.subnet, "" if lease.ipv6_subnet is None else f", {lease.ipv6_subnet}",
                 len(self.own_sources.addresses),
                 "; and any not in the sending lease's subnet (--strict-sources)"
                 if o.strict_sources else "")

    def _wrap(self, engine, subnets):
        """``engine`` (startup.new_engine's) behind the kernel path's programs, told what it
        was told (the strict rule, this host's own sources), when the daemon runs them."""
        st = self.state
        if st.kernel is None or not st.kernel.wraps:
            return engine
        try:
            engine = st.kernel.wrap(engine, st.dataplane.tun_name, own_ip6=self._own_ip6())
        except (OSError, ValueError, RuntimeError) as e:
            raise StartupError(f"failed to put the kernel path in front of the {engine.name} "
                               f"engine: {e}") from None
        engine.set_strict_sources(st.opts.strict_sources)
        self.own_sources.refresh(engine, subnets)
        return engine

    def _own_ip6(self):
        """The IPv6 underlay's address for the kernel path's programs: they send from, and
        listen on, one address, so none where PublicIPv6 is not the one the sockets bind."""
        if self.underlay6 is None or not self.state.dataplane.sockets.get(V6):
            return None
        public6, bind6 = self.underlay6[0], self.underlay6[1]
        return public6 if str(public6) == str(bind6) else None

    def _start_engine(self, start) -> None:
        """``start()`` (the engine's, or the handover's switch to it); the kernel path's
        programs attach with it: where they cannot, --engine kernel fails the start."""
        from ..engine.bpf_path import KernelPathError
        try:
            start()
        except (KernelPathError, OSError) as e:
            if self.state.kernel is None or not self.state.kernel.required:
                raise
            raise StartupError(f"--engine kernel: the kernel path's programs do not attach: "
                               f"{e}; fix that, or run with --engine c or auto") from None
        if self.state.kernel is None:
            return
        self.state.kernel.started(self.state.engine)
        if self.state.kernel.in_kernel:
            log.info("kernel path: the tc programs forward on %s and %s; the %s engine is the "
                     "slow path", self.state.dataplane.tun_name, self.state.ext.name,
                     self.state.engine.name)

    # ------------------------------------------------------------------ taking over
    def _take_over(self, inh):
        st = self.state
        self.succession.state_file = inh.state_file
        st.dataplane = startup.adopt_dataplane(st.offloads, inh, self.queues,
                                               startup.parts(st.config, st.lease))
        self.peer_routes.follow_lease(st.config.ipv6_network, st.lease.ipv6_subnet,
                                      self._routed6())
        self._take_peers(inh.state)
        self._make_engine()
        state = None

        def switch():
            nonlocal state
            state = inh.switch(st.engine.start)
        self._start_engine(switch)
        # what changed on the old daemon since its offer
        with st.lock:
            self._take_peers(state)
            self.peer_routes.load(st.engine)
        lease, _ = inherited.kept_lease(state, st.ext, st.config)
        if lease is not None and lease != st.lease:
            st.lease_manager.adopt(lease)
            if (lease.subnet, lease.ipv6_subnet) == (st.lease.subnet, st.lease.ipv6_subnet):
                st.lease = lease
            else:                       # it moved meanwhile: the serve loop moves us too
                self.lease_keeper.on_lease_change(lease)
        # IPv6 sockets named in the offer and kept (takeover.underlay6 opens new ones only when
        # none came): an operator sees the IPv6 underlay went on without a gap
        six = st.dataplane.sockets.get(V6, [])
        handed6 = (f", the IPv6 underlay's {len(six)} socket(s)"
                   if inh.state.get("udp6") and six else "")
        log.info("Took over from pid %s through %s: forwarding on %s (%d queue(s)%s) with %d "
                 "peer route(s) it knew", state.get("pid", "?"), inh.way, st.dataplane.tun_name,
                 len(st.dataplane.tun_fds), handed6, len(st.peers[4]))

    def _take_peers(self, state) -> None:
        own = self.state.lease.subnet
        self.state.peers = {version: PeerSnapshot.of(inherited.peers_of(state, ipv6=version == 6),
                                                     own) for version in (4, 6)}

    def _start_watches(self):
        st = self.state
        self.peer_routes.start_direct(st.dataplane.sockets.get(V6, []))
        child, self._peer_child = self._peer_child, None
        st.peer_watcher, st.config_watcher = startup.start_watches(
            self.registry, st.lease.subnet, st.config, st.ext, self.peer_routes.on_peers,
            in_process=st.engine_cls.forwards_in_python, prepared=child,
            listing=st.lease_manager.take_listing())
        startup.wait_for_peers(st.peer_watcher)
        st.lease_manager.start()

    # ------------------------------------------------------------------ main loop
    def _serve(self):
        st, succession = self.state, self.succession
        monitor = Monitor(st.opts.v, offloads=st.dataplane.offload_flags)
        watched = None
        while True:
            with st.lock:
                engine = st.engine
            if engine is not None and engine is not watched:   # each engine we start
                engine.on_end(lambda _engine: self._wake.set())
                watched = engine
            self._wake.wait(MONITOR_PERIOD_S)
            self._wake.clear()
            if self._stop.is_set():
                return 0
            # before anything that may take long; not once a successor is the main process
            st.liveness.tick(ping=succession.successor is None)
            # our engine is stopped on purpose, lease moves wait; or another daemon holds the host
            if succession.handing_over or succession.let_go.is_set():
                continue
            if self._upgrade.is_set():
                self._upgrade.clear()
                handover.spawn_successor(self.handover_server)
            if not self.lease_keeper.tick(self._stop):
                return 0
            with st.lock:
                engine, subnets = st.engine, startup.subnets(st.lease)
                save = self.peer_routes.tick()
            if save:
                succession.save_state()
            st.subnet_env.retry()
            st.blackhole.tick()
            st.forwarding.check()
            self.own_sources.refresh(engine, subnets)
            status = monitor.check(engine, st.dataplane.tun_name, on_purpose=lambda: (
                succession.handing_over or succession.let_go.is_set()
                or st.engine is not engine))
            if status is not None:
                return status

    def _move_host(self) -> lease_move.Host:
        """What a lease move changes, and how its new engine takes the place of ours."""
        st = self.state

        def new_engine(subnets):
            return self._wrap(startup.new_engine(st.engine_cls, st.opts, st.dataplane.tun_fds,
                                                 st.dataplane.sockets, subnets, st.ext.tun_mtu,
                                                 st.dataplane.offload_flags, self.own_sources),
                              subnets)

        def swap_engine(engine):
            with st.lock:
                old, st.engine = st.engine, engine
            return old

        def restore_engine(engine):
            with st.lock:
                st.engine = engine
                self.peer_routes.load(engine)
        return lease_move.Host(tun_name=st.dataplane.tun_name, mtu=st.ext.tun_mtu,
                               network=st.config.network, subnet_file=st.opts.subnet_file,
                               more_networks=tuple(
                                   p.network for p in startup.parts(st.config, st.lease)[1:]),
                               rules=st.rules, new_engine=new_engine, swap_engine=swap_engine,
                               restore_engine=restore_engine,
                               own_subnet=st.peer_watcher.set_own_subnet,
                               blackhole=st.blackhole.moved)

    # ------------------------------------------------------------------ shutdown
    def _shutdown(self):
        # The engine stops last: until then it forwards, and under systemd's fd store the next
        # process reads the queues from where it stopped.
        st, succession = self.state, self.succession
        st.phase = "stopping"
        succession.stop_reconciling()
        steps([
            ("end the peer watch's unused process",
             lambda: self._peer_child and self._peer_child.close()),
            ("stop the config watch", lambda: st.config_watcher and st.config_watcher.stop()),
            ("stop the HTTP servers", lambda: [s.close() for s in self.servers]),
            ("close the status socket", lambda: self.status_server and self.status_server.close()),
            ("stop keeping the last warnings", self.warnings.remove),
            ("close the etcd client", lambda: self.registry and self.registry.close()),
            ("leave the state to the next process", succession.leave_to_next),
            ("stop the engine", self._close_engine),
            # pinned, they go on forwarding until a new daemon adopts them (kernel_path.py)
            ("leave the kernel path forwarding", lambda: st.kernel and st.kernel.close(
                leave_attached=succession.successor is not None)),
            # the last fd of flannel0 closed removes it (persistent on the kernel path: not)
            ("close flannel0 and the UDP sockets", st.dataplane.close),
            ("say that the blackhole route stays",
             lambda: succession.successor is None and st.blackhole.leave()),
            ("close the address reader", self.own_sources.close),
            ("close the state", lambda: succession.state_file and succession.state_file.close()),
            # last: a daemon that asked us to exit reads our exit as the end of this connection
            ("close the handover socket", lambda: self.handover_server
             and self.handover_server.close()),
        ])
        if succession.successor is not None:
            log.info("Exiting: pid %d forwards on %s now, with the lease %s",
                     succession.successor, st.dataplane.tun_name, st.lease.subnet)
        elif st.lease is not None:
            log.info("Exiting; %sthe lease %s stays in etcd until it expires",
                     f"{LEFT_MESSAGE} (pinned at {st.kernel.pin_dir}, {st.dataplane.tun_name} "
                     "persistent); " if st.kernel is not None and st.kernel.left else "",
                     st.lease.subnet)

    def _close_engine(self):
        with self.state.lock:
            if self.state.engine is not None:
                self.state.engine.close()


__all__ = ["Daemon", "StartupError"]
