"""The flannel-udp daemon: flanneld's udp backend, start to finish.

Startup, in flanneld's order (docs/flannel-compat.md#process, docs/flannel-compat.md#tun-device)::

    1. external interface        flanneld's rules (dataplane.iface)
    2. etcd registry, signals, /healthz (and /metrics) server
    3. network config            <prefix>/config, retried every second until valid
    4. lease                     reuse by PublicIP, else the subnet.env subnet, else random
    5. flannel0                  ioctl(TUNSETIFF) by this process; <lease net>/32,
                                 MTU = interface MTU - 28, up, route <Network> dev flannel0;
                                 one fd per queue (--queues), vnet headers for --offload auto
    6. UDP socket(s)             bound to the interface address and the config's port, one
                                 per queue (SO_REUSEPORT); offloads probed (dataplane.offload)
    7. iptables                  --ip-masq (FLANNEL-POSTRTG), --iptables-forward-rules (FLANNEL-FWD)
    8. subnet.env                FLANNEL_NETWORK / SUBNET / MTU / IPMASQ
    9. engine + watches          one engine per queue (engine.multi); peer leases -> route
                                 table (engine.set_routes), own lease renewal
   10. READY=1 to systemd        when $NOTIFY_SOCKET is set

Then the main thread waits for signals: SIGTERM/SIGINT stop the engine,
close flannel0 (closing the fd removes it), keep the iptables rules (as flanneld) and
the lease in etcd and exit 0. SIGHUP, or our lease deleted in etcd,
re-acquires a lease without touching the peers' routes.

Beyond flanneld: ``--accept-from leases`` drops datagrams whose source is no
lease's PublicIP (counted as drop_bad_source, logged at most every 10 s); a
datagram whose inner source is this host's own is always dropped
(drop_inner_local, this host's addresses looked at each second:
own_sources.py), and with ``--strict-sources`` one whose inner source
is not in the sending lease's subnet (drop_inner_foreign):
docs/threat-model.md.
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import threading
import time

from . import flags as flagmod
from . import queues as queuemod
from .engine.api import MTU_MIN
from .iface import IfaceError, select_interface
from .own_sources import OwnSources
from .udpsock import SOCKET_BUFFER, open_udp_sockets

log = logging.getLogger("dataplane.daemon")

CONFIG_RETRY_S = 1.0
LEASE_RETRY_S = 1.0
MONITOR_PERIOD_S = 1.0
PEERS_READY_TIMEOUT_S = 5.0
BAD_SOURCE_LOG_EVERY_S = 10.0
EXAMPLE_CONFIG = '{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}'


class StartupError(RuntimeError):
    """A fatal startup problem; the message says what to do. Exit status 1."""


class _Stopped(Exception):
    """SIGTERM/SIGINT arrived while starting up."""


def sd_notify(state: str) -> bool:
    """Tell systemd (Type=notify) our state, as flanneld's SdNotify does."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(path)
            s.sendall(state.encode())
        return True
    except OSError as e:
        log.warning("could not notify systemd (%s): %s", path, e)
        return False


def choose_engine(requested: str):
    """(engine class, why) for --engine c|python|auto, in operators' words."""
    from .engine import c_available, c_import_error, engine_class
    if requested == "c":
        try:
            return engine_class("c"), "requested with --engine c"
        except ImportError as e:
            raise StartupError(f"--engine c: the C engine is not built ({e}). Reinstall with a C "
                               "compiler and cffi (pip install -e .), or use --engine python "
                               "or auto") from None
    try:
        if requested == "python":
            return engine_class("python"), "requested with --engine python"
        if c_available():
            return engine_class("c"), "auto: the C engine is built (the fast path)"
        return engine_class("python"), (f"auto: the C engine is not built ({c_import_error()}); "
                                        "install a C compiler and reinstall for the fast path")
    except ImportError as e:
        raise StartupError(f"the Python engine cannot be loaded ({e}); the installation is "
                           "incomplete: reinstall flannel-udp (pip install -e .)") from None


class Daemon:
    """One run of `flannel-udp run`. Also the MetricsSource of /metrics."""

    def __init__(self, opts: flagmod.Options):
        self.opts = opts
        self._stop = threading.Event()
        self._reacquire = threading.Event()
        self._pending_lease = None
        self._lock = threading.RLock()        # guards engine, lease, peers, routes
        self.ext = None                       # ExternalInterface
        self.registry = None
        self.config = None
        self.lease = None
        self.subnets = None                   # SubnetManager
        self.peer_watcher = None
        self.config_watcher = None
        self.peers: dict = {}                 # subnet -> Lease
        self.tun_fds: list = []               # one per queue
        self.tun_name = None
        self.socks: list = []                 # one per queue
        self.queues = 1
        self.offloads = None                  # offload.Offloads
        self.offload_flags = 0
        self.rules = None
        self.engine = None                    # engine.multi.MultiEngine
        self.engine_cls = None
        self.engine_why = ""
        self.own_sources = OwnSources()       # what the engine knows of this host's addresses
        self.servers = []
        self._old_handlers = {}
        from .metrics import CarriedCounters
        self._carried = CarriedCounters()     # etcd health counts across replaced watches

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        self._install_signals()
        try:
            try:
                self._startup()
            except _Stopped:
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

    def _wait(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise _Stopped()

    # ------------------------------------------------------------------ startup
    def _startup(self):
        o = self.opts
        # 1. external interface
        try:
            self.ext = select_interface(o.iface, o.iface_regex, o.iface_can_reach, o.public_ip)
        except IfaceError as e:
            raise StartupError(f"Failed to find any valid interface to use: {e}") from None
        if self.ext.tun_mtu < MTU_MIN:
            raise StartupError(f"interface {self.ext.name} has MTU {self.ext.mtu}: too small for "
                               "the 28-byte udp encapsulation")
        # 2. registry, health and metrics
        self.registry = self._make_registry()
        self._start_servers()
        # 3. config
        self.config = self._wait_for_config()
        # 4. lease
        self._make_subnet_manager()
        self.lease = self._acquire_lease()
        # the engine decides the queues' fds (vnet headers for its offloads)
        self._select_engine()
        # 5. flannel0
        self._open_tun()
        # 6. UDP socket
        self._open_socket()
        # 7. iptables
        self._setup_rules()
        # 8. subnet.env
        self._write_subnet_env()
        # 9. engine and watches
        self._start_engine()
        self._start_watches()
        # 10. systemd
        sd_notify("READY=1")
        log.info("Running: flannel0=%s subnet %s, %d peer(s), engine %s, %d queue(s)",
                 self.tun_name, self.lease.subnet, len(self.peers), self.engine.name,
                 self.queues)

    def _make_registry(self):
        from .registry import Registry
        o = self.opts
        tls = bool(o.etcd_keyfile and o.etcd_certfile)
        try:
            return Registry(o.etcd_endpoints, o.etcd_prefix,
                            keyfile=o.etcd_keyfile if tls else None,
                            certfile=o.etcd_certfile if tls else None,
                            cafile=o.etcd_cafile or None,
                            username=o.etcd_username or None, password=o.etcd_password or None)
        except (ValueError, OSError) as e:
            raise StartupError(f"cannot set up the etcd client: {e}; check --etcd-endpoints, "
                               "--etcd-keyfile/--etcd-certfile/--etcd-cafile and "
                               "--etcd-username/--etcd-password") from None

    def _start_servers(self):
        from .metrics import HttpServer
        o = self.opts
        try:
            if o.healthz_port:
                paths = ["healthz"]
                if o.metrics_on_healthz():
                    paths.append("metrics")
                if o.trace:
                    paths.append("trace")
                self.servers.append(HttpServer(o.healthz_ip, o.healthz_port, self, paths).start())
            listen = o.metrics_listen()
            if listen:
                paths = ["healthz", "metrics"] + (["trace"] if o.trace else [])
                self.servers.append(HttpServer(listen[0], listen[1], self, paths).start())
        except OSError as e:
            raise StartupError(str(e)) from None

    def _wait_for_config(self):
        from .config import ConfigError
        from .registry import ConfigNotFoundError, RegistryError
        last = None
        while True:
            try:
                cfg = self.registry.get_config()
            except ConfigNotFoundError:
                msg = (f"flannel config not found in etcd at {self.registry.config_key}; put it "
                       f"with: etcdctl put {self.registry.config_key} '{EXAMPLE_CONFIG}'")
            except ConfigError as e:
                msg = (f"the network config at {self.registry.config_key} is invalid: {e}; fix it "
                       "with etcdctl put")
            except RegistryError as e:
                msg = (f"cannot read the network config from etcd ({e}); is etcd running and "
                       "are --etcd-endpoints right?")
            else:
                if cfg.backend_type.lower() != "udp":
                    raise StartupError(
                        f"the network config asks for backend {cfg.backend_type!r}: flannel-udp "
                        "implements only the udp backend; set \"Backend\":{\"Type\":\"udp\"}")
                if not cfg.enable_ipv4 or cfg.network is None:
                    raise StartupError("the network config has no IPv4 Network: the udp backend "
                                       "is IPv4 only")
                log.info("Network config: Network %s, SubnetLen %d, SubnetMin %s, SubnetMax %s, "
                         "backend udp port %d", cfg.network, cfg.subnet_len, cfg.subnet_min,
                         cfg.subnet_max, cfg.backend_port)
                return cfg
            if msg != last:
                log.warning("%s (retrying every %.0f s)", msg, CONFIG_RETRY_S)
                last = msg
            self._wait(CONFIG_RETRY_S)

    # -- lease ---------------------------------------------------------
    def _make_subnet_manager(self, prev=None):
        from .subnetfile import read_previous_subnet
        from .subnets import SubnetManager
        if prev is None:
            prev = read_previous_subnet(self.opts.subnet_file)
            if prev is not None:
                log.info("Previous subnet from %s: %s", self.opts.subnet_file, prev)
        self.subnets = SubnetManager(self.registry, self.ext.ext_addr, prev,
                                     self.opts.subnet_lease_renew_margin, self._on_lease_change,
                                     config=self.config)

    def _acquire_lease(self):
        from .registry import RegistryError
        from .subnets import SubnetError
        last = None
        while True:
            try:
                lease = self.subnets.acquire()
            except RegistryError as e:
                msg = f"cannot acquire a lease: etcd unavailable ({e}); retrying"
                if msg != last:
                    log.warning("%s", msg)
                    last = msg
                self._wait(LEASE_RETRY_S)
                continue
            except SubnetError as e:
                raise StartupError(f"failed to acquire a lease: {e}; free subnets by deleting "
                                   f"stale leases under {self.registry.subnets_prefix} or widen "
                                   "the Network in the config") from None
            except Exception as e:
                raise StartupError(f"failed to acquire a lease: {e}") from None
            log.info("Lease acquired: %s (PublicIP %s), expires %s", lease.subnet,
                     lease.public_ip, _when(lease.expiration))
            return lease

    def _on_lease_change(self, lease):
        """SubnetManager callback (its thread): our lease was lost in etcd (deleted, expired,
        taken) and it acquired one again. The main thread applies it."""
        log.warning("Our lease was lost in etcd and re-acquired: %s (PublicIP %s), expires %s",
                    lease.subnet, lease.public_ip, _when(lease.expiration))
        with self._lock:
            self._pending_lease = lease

    def _current_lease(self):
        sm = self.subnets
        lease = sm.lease if sm is not None else None
        return lease or self.lease

    def _apply_lease(self, new):
        """Adopt `new` (same or another subnet) without touching the peers' routes."""
        with self._lock:
            old = self.lease
            self.lease = new
        if new.subnet != old.subnet:
            log.warning("The new lease has another subnet (%s, was %s): moving flannel0 and the "
                        "iptables rules; local workloads must use the new subnet (see %s)",
                        new.subnet, old.subnet, self.opts.subnet_file)
            self._retarget(old.subnet, new.subnet)
            self._write_subnet_env()
        self._rebuild_routes("lease re-acquired")

    def _reacquire_lease(self):
        """SIGHUP: acquire again (the same lease if etcd still holds it for our PublicIP)."""
        current = self._current_lease()
        try:
            self.subnets.stop()
        except Exception as e:
            log.debug("stopping the subnet manager: %s", e)
        self._make_subnet_manager(prev=current.subnet)
        new = self._acquire_lease()
        self.subnets.start()
        self._apply_lease(new)

    def _retarget(self, old_subnet, new_subnet):
        from .netconf import configure_tun
        try:
            from pyroute2 import IPRoute
            with IPRoute() as ipr:
                idx = ipr.link_lookup(ifname=self.tun_name)[0]
                ipr.addr("del", index=idx, address=str(old_subnet.network_address), prefixlen=32)
        except Exception as e:
            log.warning("could not remove the old flannel0 address: %s", e)
        configure_tun(self.tun_name, f"{new_subnet.network_address}/32", self.ext.tun_mtu)
        if self.rules is not None:
            self.rules.update_subnet(new_subnet)
        # The engine's ICMP source is its tun_addr: restart it on the same fds.
        with self._lock:
            old_engine = self.engine
            old_engine.close()
            self.engine = self._new_engine(self.engine_cls)
            self.engine.set_routes(self._routes())
            self.engine.start()
        if self.peer_watcher is not None:
            self.peer_watcher.set_own_subnet(new_subnet)

    # -- devices -------------------------------------------------------
    def _open_tun(self):
        from .netconf import add_network_route, configure_tun
        try:
            self.tun_fds, self.tun_name = self.offloads.open_tun("flannel%d", self.queues)
        except OSError as e:
            raise StartupError(f"failed to open the TUN device /dev/net/tun: {e}; run as root "
                               "(CAP_NET_ADMIN) with the tun module loaded (modprobe tun)") from None
        addr = f"{self.lease.subnet.network_address}/32"
        try:
            configure_tun(self.tun_name, addr, self.ext.tun_mtu)
            add_network_route(self.config.network, self.tun_name)
        except Exception as e:
            raise StartupError(f"failed to configure {self.tun_name} ({addr}, MTU "
                               f"{self.ext.tun_mtu}, route {self.config.network}): {e}") from None
        self._accept_local()
        log.info("Opened %s: address %s, MTU %d (%s MTU %d - 28), route %s dev %s, %d queue(s)",
                 self.tun_name, addr, self.ext.tun_mtu, self.ext.name, self.ext.mtu,
                 self.config.network, self.tun_name, len(self.tun_fds))

    def _accept_local(self):
        """The engine's ICMP net-unreachable comes back through flannel0 with the source
        <lease net> (flannel0's own address). The kernel drops a packet whose source is a local
        address as a martian unless accept_local is set on the receiving device, so without
        this the ICMP (flanneld's included) never reaches the sender. Only flannel0 is touched.
        It is safe because the engine writes nothing else with a local source into flannel0: a
        datagram whose inner source is this host's own is dropped first (own_sources.py,
        docs/threat-model.md)."""
        path = f"/proc/sys/net/ipv4/conf/{self.tun_name}/accept_local"
        try:
            with open(path, "w") as f:
                f.write("1")
        except OSError as e:
            log.warning("could not set %s (ICMP net unreachable will not reach local senders): "
                        "%s", path, e)

    def _open_socket(self):
        port = self.config.backend_port
        try:
            self.socks = open_udp_sockets(str(self.ext.iface_addr), port, self.queues,
                                          bufsize=SOCKET_BUFFER, blocking=False)
        except OSError as e:
            hint = ("is flanneld or another flannel-udp still running on this host?"
                    if e.errno == errno.EADDRINUSE else "check --iface")
            raise StartupError(f"failed to bind the UDP socket to {self.ext.iface_addr}:{port}: "
                               f"{e.strerror}; {hint}") from None
        log.info("Listening for encapsulated packets on UDP %s:%d%s", self.ext.iface_addr, port,
                 f" ({len(self.socks)} sockets, SO_REUSEPORT)" if len(self.socks) > 1 else "")
        try:
            self.offload_flags = self.offloads.probe(self.tun_fds, self.socks)
        except OSError as e:
            raise StartupError(f"probing the offloads failed: {e}; run with --offload off") \
                from None
        log.info("%s", self.offloads.summary())

    def _setup_rules(self):
        from .ipmasq import MasqError, Previous, Rules
        from .subnetfile import read_previous_rules
        o = self.opts
        if not (o.ip_masq or o.iptables_forward_rules):
            return
        try:
            self.rules = Rules(self.config.network, self.lease.subnet, masq=o.ip_masq,
                               forward=o.iptables_forward_rules,
                               previous=Previous(*read_previous_rules(o.subnet_file)))
            self.rules.install()
        except MasqError as e:
            if o.ip_masq:
                raise StartupError(str(e)) from None
            log.warning("forward rules not installed: %s", e)
            self.rules = None
            return
        self.rules.start_resync(o.iptables_resync)

    def _write_subnet_env(self):
        from .subnetfile import write_subnet_env
        try:
            write_subnet_env(self.opts.subnet_file, self.config.network, self.lease.subnet,
                             self.ext.tun_mtu, self.opts.ip_masq)
            log.info("Wrote subnet file to %s", self.opts.subnet_file)
        except OSError as e:
            log.warning("Failed to write subnet file %s: %s (continuing; workloads that read it "
                        "will not start)", self.opts.subnet_file, e)

    # -- engine and peers ------------------------------------------------
    def _new_engine(self, cls):
        from .engine import multi
        o = self.opts
        engine = multi.create(cls, self.tun_fds, [s.fileno() for s in self.socks],
                              tun_addr=self.lease.subnet.network_address, mtu=self.ext.tun_mtu,
                              port=self.config.backend_port, accept_any=o.accept_from == "any",
                              icmp_rate=o.icmp_rate, icmp_burst=o.icmp_burst,
                              offloads=self.offload_flags, trace=o.trace)
        # Before it forwards a packet: this host's own sources, and the strict rule.
        engine.set_strict_sources(o.strict_sources)
        self.own_sources.refresh(engine, self.lease.subnet)
        return engine

    def _select_engine(self):
        """The engine class, then what it decides: the queues and the offloads to try."""
        from .offload import Offloads
        o = self.opts
        requested = o.engine
        if o.sources.get("engine") == "default" and os.environ.get("DATAPLANE_ENGINE"):
            requested = os.environ["DATAPLANE_ENGINE"].strip().lower()
            if requested not in ("c", "python", "auto"):
                raise StartupError(f"DATAPLANE_ENGINE={requested!r}: use c, python or auto")
        self.engine_cls, why = choose_engine(requested)
        if requested != o.engine:
            why += " (from $DATAPLANE_ENGINE)"
        self.engine_why = why
        self.queues, note = queuemod.effective(o.queues, o.trace)
        if note:
            log.info("%s", note)
        self.offloads = Offloads(o.offload, self.engine_cls.name)

    def _start_engine(self):
        o = self.opts
        try:
            self.engine = self._new_engine(self.engine_cls)
        except (OSError, ValueError) as e:
            hint = "; run with --offload off" if self.offload_flags else ""
            raise StartupError(f"failed to create the {self.engine_cls.name} engine: "
                               f"{e}{hint}") from None
        self.engine.start()
        log.info("Engine: %s (%s), %d queue(s); accepting datagrams from %s", self.engine.name,
                 self.engine_why, len(self.engine),
                 "known leases only (--accept-from leases)" if o.accept_from == "leases"
                 else "any source (--accept-from any, as flanneld)")
        log.info("Inner sources dropped: this host's own (%s and its %d address(es))%s",
                 self.lease.subnet, len(self.own_sources.addresses),
                 "; and any not in the sending lease's subnet (--strict-sources)"
                 if o.strict_sources else "")

    def _start_watches(self):
        from .peers import PeerWatcher
        from .configwatch import ConfigWatcher
        self.peer_watcher = PeerWatcher(self.registry, self.lease.subnet, self._on_peers,
                                        network=self.config.network)
        self.peer_watcher.start()
        self.config_watcher = ConfigWatcher(self.registry, self.config).start()
        # READY should mean "routes to the known peers are in": wait for the first snapshot,
        # but not forever (the watcher keeps retrying on its own if etcd is away).
        if not self.peer_watcher.wait_ready(PEERS_READY_TIMEOUT_S):
            log.warning("Peer leases not listed yet (etcd slow or away); routes follow when it "
                        "answers")
        self.subnets.start()

    def _on_peers(self, added, removed):
        """PeerWatcher callback (its thread): rebuild the whole table, publish it in one swap."""
        n = self._rebuild_routes()
        for lease in removed or ():
            log.info("Peer removed: %s (was via %s); %d peer(s) in the route table",
                     _subnet(lease), _public_ip(lease), n)
        for lease in added or ():
            log.info("Peer added: %s via %s:%d; %d peer(s) in the route table", _subnet(lease),
                     _public_ip(lease), self.config.backend_port, n)

    def _routes(self):
        from .engine import Route
        port = self.config.backend_port
        own = self.lease.subnet
        return [Route.make(l.subnet, l.public_ip, port) for l in self.peers.values()
                if l.subnet != own]

    def _rebuild_routes(self, why: str = ""):
        with self._lock:
            current = self.peer_watcher.peers().values() if self.peer_watcher is not None else []
            own = self.lease.subnet
            self.peers = {l.subnet: l for l in current if l.subnet != own}
            routes = self._routes()
            if self.engine is not None:
                self.engine.set_routes(routes)
        log.debug("Route table: %d route(s)%s", len(routes), f" ({why})" if why else "")
        return len(routes)

    # ------------------------------------------------------------------ main loop
    def _serve(self):
        last_bad = 0
        last_bad_log = 0.0
        last_drops = None
        last_drop_log = time.monotonic()
        while not self._stop.wait(MONITOR_PERIOD_S):
            with self._lock:
                pending, self._pending_lease = self._pending_lease, None
            if pending is not None:
                self._apply_lease(pending)
            if self._reacquire.is_set():
                self._reacquire.clear()
                try:
                    self._reacquire_lease()
                except _Stopped:
                    return 0
                except StartupError as e:
                    log.error("%s; retrying in 5 s", e)
                    self._reacquire.set()
                    if self._stop.wait(5):
                        return 0
            with self._lock:
                engine, subnet = self.engine, self.lease.subnet
            self.own_sources.refresh(engine, subnet)
            ended = engine.ended()
            if ended:
                log.error("The %s forwarding engine stopped unexpectedly (queue(s) %s of %d); "
                          "exiting so that the service manager restarts the daemon (the lease "
                          "is kept)", engine.name, ", ".join(map(str, ended)), len(engine))
                return 1
            if not self._tun_attached():
                log.error("%s was deleted from under the daemon (its fd no longer has a device): "
                          "nothing can be forwarded; exiting with status 1 so that the service "
                          "manager restarts the daemon (the lease is kept)", self.tun_name)
                return 1
            try:
                st = engine.stats()
            except Exception:
                continue
            bad = st.get("drop_bad_source", 0)
            now = time.monotonic()
            if bad > last_bad and now - last_bad_log >= BAD_SOURCE_LOG_EVERY_S:
                log.warning("Dropped %d datagram(s) from sources that hold no lease (%d in total): "
                            "if peers reach this host through address translation (NAT), run "
                            "with --accept-from any", bad - last_bad, bad)
                last_bad, last_bad_log = bad, now
            if self.opts.v >= 1 and now - last_drop_log >= BAD_SOURCE_LOG_EVERY_S:
                drops = {k: v for k, v in st.items() if k.startswith("drop_") and v}
                if last_drops is not None:
                    delta = {k: v - last_drops.get(k, 0) for k, v in drops.items()
                             if v > last_drops.get(k, 0)}
                    if delta:
                        log.info("Drops in the last %.0f s: %s", now - last_drop_log,
                                 ", ".join(f"{k[5:]}={v}" for k, v in sorted(delta.items())))
                last_drops, last_drop_log = drops, now
        return 0

    def _tun_attached(self) -> bool:
        from .tun import tun_attached
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
        with self._lock:
            if self.engine is not None:
                self.engine.close()

    def _close_tun(self):
        fds, self.tun_fds = self.tun_fds, []
        for fd in fds:              # the last close removes flannel0
            os.close(fd)

    # ------------------------------------------------------------------ MetricsSource
    def engine_stats(self):
        with self._lock:
            return self.engine.stats() if self.engine is not None else None

    def engine_info(self):
        if self.engine is None:
            return {}
        return {"engine": self.engine.name, "reason": self.engine_why,
                "accept_from": self.opts.accept_from}

    def peers_count(self):
        return len(self.peers)

    def queues_count(self):
        return len(self.engine) if self.engine is not None else 0

    def offloads_enabled(self):
        return self.offloads.enabled() if self.offloads is not None else {}

    def bad_leases(self):
        w = self.peer_watcher
        return (len(w.bad()), w.bad_total) if w is not None else None

    def config_mismatch(self):
        w = self.config_watcher
        return w.mismatch if w is not None else None

    def lease_info(self):
        lease = self._current_lease()
        if lease is None:
            return None
        return {"subnet": str(lease.subnet), "expiry": lease.expiration}

    def trace_enabled(self):
        return self.opts.trace and self.engine is not None

    def trace_events(self, after):
        with self._lock:
            return self.engine.trace_events(after) if self.engine is not None else []

    def trace_remote(self):
        return self.opts.trace_remote

    def readiness(self):
        """/readyz: a lease that has not expired, a forwarding engine with its flannel0, and the
        peer watch connected to etcd (else routes go stale unnoticed)."""
        lease, engine = self._current_lease(), self.engine
        w = self.peer_watcher
        watch = w.watch_loop if w is not None else None
        checks = {"lease": None, "engine": None, "etcd_watch": None}
        if lease is None:
            checks["lease"] = "no lease acquired yet"
        elif lease.expiration and lease.expiration <= time.time():
            checks["lease"] = f"lease {lease.subnet} expired at {_when(lease.expiration)}"
        ended = engine.ended() if engine is not None else []
        if engine is None:
            checks["engine"] = "not started yet"
        elif ended:
            checks["engine"] = f"queue(s) {', '.join(map(str, ended))} stopped"
        elif not self._tun_attached():
            checks["engine"] = f"{self.tun_name} was deleted"
        if watch is None:
            checks["etcd_watch"] = "peer leases not listed yet"
        elif not watch.connected.is_set():
            checks["etcd_watch"] = (f"not connected to etcd, reconnecting ({watch.reconnects} "
                                    "reconnect(s) so far)")
        return checks

    def etcd_watches(self):
        out = {}
        for name, owner in (("subnets", self.peer_watcher), ("config", self.config_watcher),
                            ("own_lease", self.subnets)):
            watch = owner.watch_loop if owner is not None else None
            counts = self._carried.read(f"watch {name}", watch, ("reconnects", "resyncs"))
            if watch is not None or any(counts.values()):
                out[name] = {"connected": watch is not None and watch.connected.is_set(), **counts}
        return out

    def lease_counts(self):
        if self.subnets is None:
            return None
        return self._carried.read("lease", self.subnets, ("renewals", "reacquisitions",
                                                          "races_lost"))


def _subnet(lease):
    return getattr(lease, "subnet", lease)


def _public_ip(lease):
    return getattr(lease, "public_ip", "?")


def _when(ts):
    if not ts:
        return "never (no TTL)"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


__all__ = ["Daemon", "StartupError", "choose_engine", "sd_notify"]

