"""The daemon's start steps, one function each: what it opens, and what the operator reads when it
fails (StartupError, exit status 1). The order is the daemon's (daemon/main.py).

(Over 450 lines as one piece: each step is a short function that calls down into control/ or
host/ and turns what fails there into the operator's sentence; the steps share those sentences'
words and StartupError, and split across files they would only be read side by side.)"""
from __future__ import annotations

import errno
import logging
import time

from ..engine.api import MTU_MIN
from ..host.udpsock import SOCKET_BUFFER
from .timefmt import when

log = logging.getLogger(__name__)

CONFIG_RETRY_S = 1.0
LEASE_RETRY_S = 1.0
HTTP_RETRY_S = 5.0          # for the ports an old daemon frees as it hands over
PEERS_READY_TIMEOUT_S = 5.0
EXAMPLE_CONFIG = '{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}'


class StartupError(RuntimeError):
    """A fatal startup problem; the message says what to do. Exit status 1."""


class Stopped(Exception):
    """SIGTERM/SIGINT arrived while starting up."""


def receive_inherited(opts):
    """What the previous daemon hands over: systemd's fd store, else (--handover) the running
    daemon's handover socket; None for a fresh start."""
    from . import handover, inherited
    inh = inherited.from_fd_store()
    if inh is None and opts.handover:
        if not opts.handover_socket:
            raise StartupError("--handover needs --handover-socket (the running daemon's)")
        try:
            inh = handover.connect(opts.handover_socket)
        except OSError as e:
            raise StartupError(f"--handover: the daemon on {opts.handover_socket} did not hand "
                               f"over: {e}; it keeps running") from None
    return inh


def select_interface(opts):
    from ..host.iface import IfaceError, select_interface as select
    try:
        ext = select(opts.iface, opts.iface_regex, opts.iface_can_reach, opts.public_ip)
    except IfaceError as e:
        raise StartupError(f"Failed to find any valid interface to use: {e}") from None
    if ext.tun_mtu < MTU_MIN:
        raise StartupError(f"interface {ext.name} has MTU {ext.mtu}: too small for "
                           "the 28-byte udp encapsulation")
    return ext


def check_ipv6(config, ext) -> None:
    """EnableIPv6: what IPv6 on flannel0 needs of this host, said before etcd holds a lease
    for a host that cannot carry it."""
    from ..host.netconf import IPV6_MTU_MIN, ipv6_unavailable
    if not config.enable_ipv6:
        return
    why = ipv6_unavailable()
    if why is not None:
        raise StartupError(f"the network config enables IPv6 (EnableIPv6) but {why}: boot "
                           "without ipv6.disable=1, or remove EnableIPv6 from the config of "
                           "every host's cluster")
    if ext.tun_mtu < IPV6_MTU_MIN:
        raise StartupError(
            f"the network config enables IPv6 (EnableIPv6) but flannel0's MTU would be "
            f"{ext.tun_mtu} ({ext.name} MTU {ext.mtu} - 28), below the {IPV6_MTU_MIN} bytes "
            f"every IPv6 link must carry: raise {ext.name}'s MTU to {IPV6_MTU_MIN + 28} or "
            "more, or remove EnableIPv6 from the config")


def ipv6_underlay(opts, config, ext):
    """With EnableIPv6, the IPv6 underlay (docs/operating.md#dual-stack) as ``(PublicIPv6, the
    address its sockets bind, the inner MTU over it)``; None when there is none, and pods' IPv6
    goes over IPv4 to every peer. --public-ipv6 is checked here (a StartupError when it cannot
    be one); no IPv6 address on the interface, or an MTU that leaves less than 1280 bytes
    inside 48 bytes of IPv6 and UDP, is said and runs without it."""
    from ..host.iface import ENCAP_OVERHEAD6, IfaceError, underlay6
    from ..host.netconf import IPV6_MTU_MIN
    if not config.enable_ipv6:
        if opts.public_ipv6:
            log.warning("--public-ipv6 %s is not used: the network config does not enable IPv6 "
                        "(EnableIPv6)", opts.public_ipv6)
        return None
    try:
        public6, bind6 = underlay6(ext, opts.public_ipv6)
    except IfaceError as e:
        raise StartupError(str(e)) from None
    mtu6 = ext.mtu - ENCAP_OVERHEAD6
    if public6 is None:
        log.info("No IPv6 underlay: %s has no global IPv6 address and no --public-ipv6 is "
                 "given; pods' IPv6 goes to every peer over IPv4", ext.name)
        return None
    if bind6 is None:
        log.warning("No IPv6 underlay: --public-ipv6 %s is no address of %s, which has no "
                    "global IPv6 address to bind instead; pods' IPv6 goes over IPv4",
                    public6, ext.name)
        return None
    if mtu6 < IPV6_MTU_MIN:
        log.warning("No IPv6 underlay: %s's MTU %d leaves %d bytes inside IPv6 and UDP (48), "
                    "below IPv6's %d; pods' IPv6 goes over IPv4", ext.name, ext.mtu, mtu6,
                    IPV6_MTU_MIN)
        return None
    return public6, bind6, mtu6


def make_registry(opts):
    from ..control.registry import Registry
    tls = bool(opts.etcd_keyfile and opts.etcd_certfile)
    try:
        return Registry(opts.etcd_endpoints, opts.etcd_prefix,
                        keyfile=opts.etcd_keyfile if tls else None,
                        certfile=opts.etcd_certfile if tls else None,
                        cafile=opts.etcd_cafile or None,
                        username=opts.etcd_username or None, password=opts.etcd_password or None)
    except (ValueError, OSError) as e:
        raise StartupError(f"cannot set up the etcd client: {e}; check --etcd-endpoints, "
                           "--etcd-keyfile/--etcd-certfile/--etcd-cafile and "
                           "--etcd-username/--etcd-password") from None


def start_http_servers(opts, source, retry: bool = False) -> list:
    """The /healthz server (with /metrics unless --metrics-* moves it) and the metrics server;
    ``retry``: for HTTP_RETRY_S while a port is in use (the daemon we took over frees them)."""
    deadline = time.monotonic() + HTTP_RETRY_S
    while True:
        try:
            return _start_http_servers(opts, source)
        except OSError as e:
            if not (retry and e.errno == errno.EADDRINUSE and time.monotonic() < deadline):
                raise StartupError(str(e)) from None
        time.sleep(0.05)


def _start_http_servers(opts, source) -> list:
    from .http import HttpServer
    servers = []
    try:
        if opts.healthz_port:
            paths = ["healthz"]
            if opts.metrics_on_healthz():
                paths.append("metrics")
            if opts.trace:
                paths.append("trace")
            servers.append(HttpServer(opts.healthz_ip, opts.healthz_port, source, paths).start())
        listen = opts.metrics_listen()
        if listen:
            paths = ["healthz", "metrics"] + (["trace"] if opts.trace else [])
            servers.append(HttpServer(listen[0], listen[1], source, paths).start())
    except OSError:
        for s in servers:
            s.close()
        raise
    return servers


def refused(e) -> StartupError:
    """etcd refused this client (control/etcd_errors.py RegistryDeniedError): exit 1, as flanneld
    does, so that the service manager shows the failure instead of a daemon retrying for ever."""
    return StartupError(f"etcd refused this client: {e}")


def wait_for_config(registry, wait, fallback=None):
    """The network config, read again every CONFIG_RETRY_S until it is there and valid;
    ``wait(seconds)`` raises Stopped when the daemon is asked to stop meanwhile. ``fallback``
    (the config the previous daemon ran with, as JSON) is used when etcd does not answer: the
    fds it handed over carry traffic only once an engine reads them. A refusal (wrong password,
    certificate, permission) is a StartupError at once, fallback or not."""
    import json
    from ..control.config import ConfigError, parse_config
    from ..control.recurring import Recurring
    from ..control.registry import ConfigNotFoundError
    from ..control.etcd_errors import (RegistryDeniedError, RegistryError,
                                       RegistryUnavailableError)
    waiting = Recurring(log, "Waiting for the network config")
    advice = f"retrying every {CONFIG_RETRY_S:.0f} s"
    while True:
        try:
            try:
                cfg = registry.get_config()
            except RegistryError as e:
                if fallback is None or isinstance(e, (ConfigNotFoundError, RegistryDeniedError)):
                    raise
                cfg = parse_config(json.dumps(fallback))
                log.warning("cannot read the network config from etcd (%s): going on with the one "
                            "the previous daemon ran with", e)
        except ConfigNotFoundError:
            waiting.fail(f"flannel config not found in etcd at {registry.config_key}; put it "
                         f"with: etcdctl put {registry.config_key} '{EXAMPLE_CONFIG}'", advice)
        except ConfigError as e:
            waiting.fail(f"the network config at {registry.config_key} is invalid: {e}; fix it "
                         "with etcdctl put", advice)
        except RegistryDeniedError as e:
            raise refused(e) from None
        except RegistryUnavailableError as e:
            # The registry has said it (once, with the reminders), naming --etcd-endpoints.
            log.debug("cannot read the network config from etcd: %s", e)
        except RegistryError as e:
            waiting.fail(f"cannot read it from etcd ({e})", advice)
        else:
            if cfg.backend_type.lower() != "udp":
                raise StartupError(
                    f"the network config asks for backend {cfg.backend_type!r}: flannel-udp "
                    "implements only the udp backend; set \"Backend\":{\"Type\":\"udp\"}")
            if not cfg.enable_ipv4 or cfg.network is None:
                raise StartupError("the network config has no IPv4 Network: the udp backend "
                                   "is IPv4 only")
            waiting.ok()
            log.info("Network config: Network %s, SubnetLen %d, SubnetMin %s, SubnetMax %s, "
                     "backend udp port %d%s", cfg.network, cfg.subnet_len, cfg.subnet_min,
                     cfg.subnet_max, cfg.backend_port,
                     ", DirectRouting" if cfg.direct_routing else "")
            return cfg
        wait(CONFIG_RETRY_S)


def acquire_lease(subnets, registry, wait):
    """A lease from the lease manager, retried while etcd is away; a refusal is a StartupError."""
    from ..control.lease_manager import SubnetError
    from ..control.recurring import Recurring
    from ..control.etcd_errors import RegistryDeniedError, RegistryError, RegistryUnavailableError
    failing = Recurring(log, "Acquiring a lease")
    while True:
        try:
            lease = subnets.acquire()
        except RegistryDeniedError as e:
            raise refused(e) from None
        except RegistryUnavailableError as e:
            log.debug("cannot acquire a lease: %s", e)      # the registry has said it
            wait(LEASE_RETRY_S)
            continue
        except RegistryError as e:
            failing.fail(str(e), f"retrying every {LEASE_RETRY_S:.0f} s")
            wait(LEASE_RETRY_S)
            continue
        except SubnetError as e:
            raise StartupError(f"failed to acquire a lease: {e}; free subnets by deleting "
                               f"stale leases under {registry.subnets_prefix} or widen "
                               "the Network in the config") from None
        except Exception as e:
            raise StartupError(f"failed to acquire a lease: {e}") from None
        failing.ok()
        log.info("Lease acquired: %s (PublicIP %s), expires %s", lease.subnet,
                 lease.public_ip, when(lease.expiration))
        if lease.ipv6_subnet is not None:
            log.info("Lease's IPv6 part: %s", lease.ipv6_subnet)
        return lease


def choose_engine(opts, pin_dir: str | None = None, load=None):
    """The engine (engine/choice.py EngineChoice: the class, why, the kernel path's programs
    loaded or why not): --engine (or FLANNELD_ENGINE), else $DATAPLANE_ENGINE, else auto; the
    kernel path pinned at ``pin_dir`` (daemon/kernel_path.py), adopting what is there, or
    ``load``'s (daemon/early_load.py)."""
    import functools
    from ..engine.choice import EngineChoiceError, EngineUnavailable, choose_engine as choose
    from ..engine.choice import load_kernel_path
    flag = None if opts.sources.get("engine") == "default" else opts.engine
    try:
        return choose(flag, kernel=True,
                      load_kernel=load or functools.partial(load_kernel_path, pin_dir=pin_dir))
    except (EngineChoiceError, EngineUnavailable) as e:
        raise StartupError(str(e)) from None


def parts(config, lease) -> list:
    """The families the config enables, each with the lease's subnet in it (host/family.py
    Part): IPv4, and with EnableIPv6 IPv6 (its subnet None while the lease has no IPv6 part)."""
    from ..host.family import Part
    out = [Part(config.network, lease.subnet)]
    if config.enable_ipv6:
        out.append(Part(config.ipv6_network, lease.ipv6_subnet))
    return out


def subnets(lease) -> list:
    """The lease's subnets, one per family it has, IPv4 first."""
    return [s for s in (lease.subnet, lease.ipv6_subnet) if s is not None]


def open_dataplane(offloads, queues: int, parts, ext, port: int, bind6=None,
                   tun_name: str = "flannel%d"):
    """5.-6. The dataplane's assembly (host/assembly.py) in the daemon's words: flannel0 with one
    fd per queue, for each of ``parts`` the lease has a subnet of its address (<lease net>/32,
    <IPv6 lease net>/128) and the route of its network, MTU, queues long enough for a restart
    (inherited.FLANNEL0_TXQUEUELEN), up; the UDP socket(s) (:func:`open_sockets`), fewer queues
    where the host refuses their steering, and with ``bind6`` (the IPv6 underlay's address) as
    many on it; the offloads."""
    from ..host.assembly import AssemblyError, Dataplane
    from ..host.family import V4, V6
    from .inherited import FLANNEL0_TXQUEUELEN
    carried = [p for p in parts if p.subnet is not None]
    v4, *more = carried
    sockets = {V4: lambda n: open_sockets(ext, port, n)}
    if bind6 is not None:
        sockets[V6] = lambda n: open_sockets(ext, port, n, ip=bind6)
    try:
        try:
            dp = Dataplane.open(offloads, tun_name=tun_name, mtu=ext.tun_mtu, queues=queues,
                                parts=carried, sockets=sockets)
        except AssemblyError as e:
            if not _left_other_queues(e, tun_name, queues):
                raise
            dp = Dataplane.open(offloads, tun_name=tun_name, mtu=ext.tun_mtu, queues=queues,
                                parts=carried, sockets=sockets)
    except AssemblyError as e:
        v6 = "".join(f", {p.family.name} address {p.tun_addr}, route {p.network}" for p in more)
        raise _assembly_failed(e, f"{v4.tun_addr}, MTU {ext.tun_mtu}, route {v4.network}{v6}") \
            from None
    _accept_local(dp.tun_name)
    from .kernel_path import remove_other_leases
    remove_other_leases(dp.tun_name, carried)       # a persistent flannel0's
    log.info("Opened %s: address %s, MTU %d (%s MTU %d - 28), route %s dev %s, %d queue(s) of "
             "%d packets", dp.tun_name, v4.tun_addr, ext.tun_mtu, ext.name, ext.mtu, v4.network,
             dp.tun_name, len(dp.tun_fds), FLANNEL0_TXQUEUELEN)
    for p in more:
        log.info("%s carries %s: address %s, route %s dev %s", dp.tun_name, p.family.name,
                 p.tun_addr, p.network, dp.tun_name)
    return dp


def _left_other_queues(e, tun_name: str, queues: int) -> bool:
    """A flannel0 a kernel path left (persistent) with another queue layout than --queues asks
    refuses the attach (EINVAL): removed, to be made again (its routes with it), said once."""
    from ..host.tun import remove_persistent
    if e.step != "tun" or getattr(e.error, "errno", None) != errno.EINVAL or "%" in tun_name:
        return False
    try:
        if not remove_persistent(tun_name):
            return False
    except OSError:
        return False
    log.warning("%s, left by the daemon before (the kernel path keeps it), has another queue "
                "layout than --queues %d asks: made again, which loses what crosses it meanwhile",
                tun_name, queues)
    return True


def tun_addr6(subnet6) -> str | None:
    """flannel0's IPv6 address for the lease's IPv6 part: its network address as a /128, as
    flannel's vxlan backend gives its IPv6 device, and as flannel0's IPv4 address is the
    lease's network address as a /32 (docs/flannel-compat.md#tun-device). A /128 rather than
    the prefix: the kernel then routes nothing of the lease's subnet to flannel0 (the subnet
    is the pods', behind their bridge), and the route of IPv6Network does the rest."""
    from ..host.family import V6
    return None if subnet6 is None else V6.host(subnet6.network_address)


def adopt_dataplane(offloads, inh, queues: int, parts):
    """flannel0 and the sockets handed over (``inh``, checked by daemon/inherited.py): as
    :func:`open_dataplane` would leave them, their route and accept_local put back if someone
    removed them, and with a dual-stack lease IPv6 as open_dataplane gives it (a daemon of a
    version that forwarded no IPv6 handed over a flannel0 without it), the offloads probed on
    them (host/assembly.py)."""
    from ..host.assembly import AssemblyError, Dataplane
    from ..host.netconf import add_network_route, set_accept_local
    v4, *more = [p for p in parts if p.subnet is not None]
    try:
        dp = Dataplane.adopt(offloads, inh.tun_fds, inh.tun_name, inh.sockets, queues)
    except AssemblyError as e:
        raise _assembly_failed(e, f"handed over, route {v4.network}") from None
    try:
        if add_network_route(v4.network, dp.tun_name):
            log.warning("the route %s dev %s was missing: added again", v4.network, dp.tun_name)
        set_accept_local(dp.tun_name)
        for p in more:
            ensure_ipv6(dp.tun_name, p)
    except Exception as e:
        dp.close()
        raise StartupError(f"failed to configure the {dp.tun_name} handed over (route "
                           f"{v4.network}, accept_local"
                           f"{''.join(f', {p.family.name} {p.tun_addr}' for p in more)}): "
                           f"{e}") from None
    return dp


def ensure_ipv6(tun_name: str, part) -> None:
    """A flannel0 that is up already (handed over, or a lease whose IPv6 part moved) gets
    the IPv6 address of ``part``'s subnet (any other global one goes) and the route of its
    network; what had to change is logged. Raises what netconf raises."""
    from ..host.netconf import add_network_route, ipv6_addresses, prepare_ipv6, set_ipv6_address
    addr6, network6 = part.tun_addr, part.network
    before = ipv6_addresses(tun_name)
    if not any(str(a) == addr6 for a in before):
        prepare_ipv6(tun_name)      # idempotent; on an up link they hold from now on
    removed = set_ipv6_address(tun_name, addr6)
    if not any(str(a) == addr6 for a in before):
        log.info("%s carries IPv6: address %s%s", tun_name, addr6,
                 f" (instead of {', '.join(map(str, removed))})" if removed else "")
    if add_network_route(network6, tun_name):
        log.info("Added the route %s dev %s", network6, tun_name)


def _accept_local(tun_name: str) -> None:
    from ..host.netconf import set_accept_local
    try:
        set_accept_local(tun_name)
    except OSError as e:
        log.warning("could not set accept_local on %s (ICMP net unreachable will not reach local "
                    "senders): %s", tun_name, e)


def _assembly_failed(e, setup: str) -> StartupError:
    """What the operator reads when a step of host/assembly.py fails; ``setup`` is what flannel0
    was to get. (The sockets' step raises open_sockets' own StartupError.)"""
    if e.step == "tun":
        return StartupError(f"failed to open the TUN device /dev/net/tun: {e.error}; run as root "
                            "(CAP_NET_ADMIN) with the tun module loaded (modprobe tun)")
    if e.step == "offloads":
        return StartupError(f"probing the offloads failed: {e.error}; run with --offload off")
    return StartupError(f"failed to configure {e.tun_name} ({setup}): {e.error}")


def listen_for_handover(path: str, daemon):
    """The handover socket (daemon/handover.py); None, with a warning, when it cannot be made."""
    from .handover import HandoverServer
    try:
        return HandoverServer(path, daemon).start()
    except OSError as e:
        log.warning("cannot listen for a handover on %s (%s): an upgrade will have to stop this "
                    "daemon first", path, e)
        return None


def open_sockets(ext, port: int, queues: int, ip=None) -> list:
    """The UDP socket(s) on the interface address (or ``ip``, the IPv6 underlay's) and the
    config's port, one per queue; ONE when the host refuses the steering of several
    (host/assembly.py open_sockets, which says so once in a warning): open_dataplane then keeps
    as many TUN queues as it got sockets, and asks as many of the IPv6 underlay."""
    from ..host import assembly
    from ..host.udpsock import STEERING_CALL, endpoint
    underlay6, ip = ip is not None, ext.iface_addr if ip is None else ip
    addr = endpoint(ip, port)
    try:
        socks = assembly.open_sockets(str(ip), port, queues, bufsize=SOCKET_BUFFER)
    except OSError as e:
        call = getattr(e, "call", "")
        if e.errno == errno.EADDRINUSE:
            hint = "; is flanneld or another flannel-udp still running on this host?"
        elif e.errno == errno.EADDRNOTAVAIL and call.startswith("bind("):
            hint = (f"; {ip} is no address of this host (any more), or still tentative "
                    f"(IPv6 duplicate address detection): check --iface"
                    f"{' and --public-ipv6' if underlay6 else ''}")
        elif e.errno == errno.EACCES and call.startswith("bind("):
            hint = "; a port this low needs CAP_NET_BIND_SERVICE"
        elif call == STEERING_CALL:
            hint = "; run with --queues=1"
        else:
            hint = ""
        raise StartupError(f"failed to open the UDP socket(s) on {addr}: "
                           f"{e if call else e.strerror}{hint}") from None
    if underlay6 and len(socks) != queues:      # the IPv4 group's count is the queues
        for s in socks:
            s.close()
        raise StartupError(f"the UDP sockets on {addr}: {len(socks)} for {queues} queue(s) "
                           "(the host steers one group and not the other); run with --queues=1")
    log.info("Listening for encapsulated packets on UDP %s%s", addr,
             f" ({len(socks)} sockets, SO_REUSEPORT)" if len(socks) > 1 else "")
    return socks


def install_rules(opts, parts, enable_nftables: bool = False):
    """--ip-masq and --iptables-forward-rules (host/firewall_stack.py) for each of ``parts``
    (:func:`parts`: with EnableIPv6 the IPv6 rules too); None when neither is asked for (or,
    for the forward rules alone, when no tool can install them: flanneld only warns then).
    `enable_nftables` is the network config's EnableNFTables: nftables even where iptables
    exists."""
    from ..control.subnetfile import read_previous_rules, read_previous_rules6
    from ..host.family import V4, V6
    from ..host.firewall_rules import Previous
    from ..host.firewall_stack import Stack
    from ..host.firewall_tools import MasqError
    if not (opts.ip_masq or opts.iptables_forward_rules):
        return None
    rules = None
    try:
        previous = {V4: Previous(*read_previous_rules(opts.subnet_file)),
                    V6: Previous(*read_previous_rules6(opts.subnet_file))}
        rules = Stack(parts, masq=opts.ip_masq, forward=opts.iptables_forward_rules,
                      previous=previous, random_fully=not opts.ip_masq_fully_random_disable,
                      enable_nftables=enable_nftables)
        rules.install()
    except MasqError as e:
        if opts.ip_masq:
            if rules is not None:   # what install() put in stays, as at any exit
                try:
                    rules.stop()
                except Exception as cleanup:
                    log.warning("while stopping the rules: %s", cleanup)
            raise StartupError(str(e)) from None
        log.warning("forward rules not installed: %s", e)
        return None
    rules.start_resync(opts.iptables_resync)
    return rules


def new_engine(cls, opts, tun_fds, sockets, subnets, mtu: int, offload_flags: int,
               own_sources):
    """One engine per queue behind one MultiEngine (host/assembly.py make_engine), configured,
    not started, on ``sockets`` (host/family.py Family -> that underlay's sockets, one per
    queue); its ICMP errors come from <lease net>, flannel0's address, and with a dual-stack
    lease its ICMPv6 errors from flannel0's IPv6 address (:func:`tun_addr6`), each subnet's
    network address (Engine.set_tun_addr; IPv4's is the constructor's). It knows this
    host's own sources (own_sources: host/own_sources.py; ``subnets`` the lease's, one per
    family) before it forwards a packet."""
    from ..host import sched
    from ..host.assembly import make_engine
    if opts.realtime_priority:
        try:
            sched.probe(opts.realtime_priority)
        except OSError as e:
            raise StartupError(f"--realtime-priority {opts.realtime_priority}: "
                               f"{e.strerror or e}") from None
    try:
        engine = make_engine(cls, tun_fds, sockets, tun_addr=subnets[0].network_address, mtu=mtu,
                             accept_any=opts.accept_from == "any", icmp_rate=opts.icmp_rate,
                             icmp_burst=opts.icmp_burst, offloads=offload_flags,
                             coalesce_us=opts.coalesce_usecs, trace=opts.trace,
                             realtime_priority=opts.realtime_priority)
    except (OSError, ValueError) as e:
        hint = "; run with --offload off" if offload_flags else ""
        raise StartupError(f"failed to create the {cls.name} engine: {e}{hint}") from None
    engine.set_strict_sources(opts.strict_sources)
    for subnet in subnets:
        engine.set_tun_addr(subnet.network_address)
    own_sources.refresh(engine, subnets)
    return engine


def make_lease_manager(opts, registry, ext, config, on_lease_change, prev=None, public6=None):
    """The lease manager for our PublicIP (and ``public6``, the IPv6 underlay's PublicIPv6);
    it prefers ``prev``, else subnet.env's subnet (and IPv6 subnet, which only a dual-stack
    flanneld has written there so far)."""
    from ..control.lease_manager import LeaseManager
    from ..control.subnetfile import previous_ipv6_subnet, previous_subnet, read_subnet_env
    prev6 = None
    if prev is None:
        env = read_subnet_env(opts.subnet_file)
        prev, prev6 = previous_subnet(env), previous_ipv6_subnet(env)
        if prev is not None:
            log.info("Previous subnet from %s: %s%s", opts.subnet_file, prev,
                     "" if prev6 is None else f", IPv6 {prev6}")
    return LeaseManager(registry, (ext.ext_addr, public6), (prev, prev6),
                        opts.subnet_lease_renew_margin, on_lease_change, config=config)


def start_watches(registry, subnet, config, ext, on_peers, in_process: bool, prepared=None,
                  listing=None):
    """9. The peer watch, reporting to ``on_peers``, and the config watch, started: (peer
    watcher, config watcher). With the Python engine (``in_process``) the peer watch runs in a
    process of its own (``prepared`` early, control/peer_process.py), so that a burst of lease
    events does not hold the interpreter the engine forwards in. ``listing``: the leases the
    lease's acquisition listed (LeaseManager.take_listing), the in-process watch's first table,
    so that a start lists and parses them once."""
    from ..control.configwatch import ConfigWatcher
    from ..control.peer_process import PeerWatchProcess
    from ..control.peers import PeerWatcher
    # A lease naming one of these is never a route (it would send to ourselves).
    own_ips = {ext.ext_addr, ext.iface_addr}
    if in_process:
        peers = PeerWatchProcess(registry, subnet, on_peers, network=config.network,
                                 prepared=prepared, own_ips=own_ips)
    else:
        peers = PeerWatcher(registry, subnet, on_peers, network=config.network, own_ips=own_ips,
                            listing=listing)
    peers.start()
    try:
        return peers, ConfigWatcher(registry, config).start()
    except BaseException:
        peers.stop()
        raise


def wait_for_peers(peer_watcher) -> None:
    """READY should mean "routes to the known peers are in": the first listing, but not for
    ever (the watcher keeps retrying on its own if etcd is away)."""
    if not peer_watcher.wait_ready(PEERS_READY_TIMEOUT_S):
        log.warning("Peer leases not listed yet (etcd slow or away); routes follow when it "
                    "answers")
