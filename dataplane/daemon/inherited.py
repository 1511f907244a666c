"""What a new daemon takes over from the one before it: flannel0's queues, the UDP sockets, and
the state that goes with them (the lease, the peers, the network config they were set up for).

Two ways bring them, with one state document and one set of checks:

* systemd's fd store (daemon/fdstore.py) across ``systemctl restart``: the fds, and the state in a
  memfd stored next to them (:class:`StateFile`), which the running daemon rewrites whenever its
  lease or its peers change and once more as it stops;
* the handover socket (daemon/handover.py), for an upgrade without systemd: the running daemon
  sends the fds and the state, stops forwarding when asked, and exits once the new one forwards.

The new daemon keeps what it is handed only if it is what it would set up itself (:func:`mismatch`):
the same device, queues and vnet headers (the offloads), flannel0's MTU and address, the UDP
sockets on the same address and port, the same network config, a lease for our PublicIP that
fits it. Otherwise it says why in the log and starts afresh. It keeps the lease without writing to
etcd while it is valid, the peers' routes (the engine forwards at once, before etcd answers), the
route into flannel0 and the firewall rules (they outlive every process anyway).

While nobody reads flannel0, the kernel queues what the workloads send in the device's queues
and what the peers send in the sockets' receive buffers (udpsock.SOCKET_BUFFER). flannel0 is made
with queues of FLANNEL0_TXQUEUELEN packets for that (the TUN default, 500, lasts half a second
at 1,000 packets/s); they are never changed on a live device: the kernel drops what is sent to it
while it resizes them.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Interface, IPv4Network, IPv6Address, IPv6Network

from ..control.config import ConfigError, parse_config
from ..control.lease import Lease, LeaseAttrs, with_ipv6_of_key
from ..host.family import V4, V6
from ..host.tun import IFF_MULTI_QUEUE, IFF_VNET_HDR, TXQUEUELEN as FLANNEL0_TXQUEUELEN  # noqa: F401
from . import fdstore

log = logging.getLogger(__name__)

STATE_VERSION = 1
LEASE_MIN_LEFT_S = 60.0              # a lease closer to its end than this is acquired again
RELEASE_TIMEOUT_S = 10.0             # for flannel0 to go once every holder let it go
STATE_NAME = "state"


def tun_fd_name(i: int) -> str:
    return f"tun{i}"


def udp_fd_name(family, i: int) -> str:
    """The underlay socket of ``family`` (host/family.py) of queue ``i``; the IPv6 one's name
    is one that a daemon of an older version does not know, and closes."""
    return f"udp{i}" if family is V4 else f"udp6-{i}"


# ------------------------------------------------------------------ the state document

def lease_json(lease: Lease) -> dict:
    doc = {"subnet": str(lease.subnet), "public_ip": str(lease.public_ip),
           "lease_id": lease.lease_id, "expiration": lease.expiration,
           "mod_revision": lease.mod_revision, "key": lease.key}
    if lease.ipv6_subnet is not None:
        doc["ipv6_subnet"] = str(lease.ipv6_subnet)
    if lease.attrs.public_ipv6 is not None:
        doc["public_ipv6"] = str(lease.attrs.public_ipv6)
    return doc


def lease_of_json(doc: dict) -> Lease:
    # a state written before dual stack has no "ipv6_subnet": its key names the part, if any
    v6, pub6 = doc.get("ipv6_subnet"), doc.get("public_ipv6")
    return with_ipv6_of_key(Lease(
        subnet=IPv4Network(doc["subnet"]),
        attrs=LeaseAttrs(public_ip=IPv4Address(doc["public_ip"]),
                         public_ipv6=IPv6Address(pub6) if pub6 else None),
        ipv6_subnet=IPv6Network(v6) if v6 else None, expiration=doc.get("expiration"),
        lease_id=int(doc.get("lease_id", 0)), mod_revision=int(doc.get("mod_revision", 0)),
        key=doc.get("key", "")))


def state_of(state) -> dict:
    """The state document of a running daemon, whose DaemonState (daemon/state.py) is ``state``
    (JSON-ready)."""
    dp = state.dataplane
    six = dp.sockets.get(V6)
    with state.lock:
        peers = [[str(s), str(l.public_ip)] for s, l in sorted(state.peers[4].peers.items())]
        # the peers' IPv6 parts the engines route, apart: a daemon of an older version reads
        # "peers" as pairs and past a key it does not know. The engine routes the parts of
        # peers whose IPv4 goes direct too; "peers6_via" has their PublicIPs (an older version
        # takes only the parts of "peers")
        with6 = [(s, l) for s, l in sorted(state.peers[6].peers.items())
                 if l.ipv6_subnet is not None and l.attrs.forwards_ipv6]
        peers6 = [[str(s), str(l.ipv6_subnet)] for s, l in with6]
        via6 = [[str(s), str(l.public_ip)] for s, l in with6 if s not in state.peers[4].peers]
        # and their PublicIPv6s, so that the IPv6 underlay's routes are there from the switch
        pub6 = [[str(s), str(l.attrs.public_ipv6)] for s, l in with6
                if l.attrs.public_ipv6 is not None]
    return {
        "version": STATE_VERSION, "pid": os.getpid(), "engine": state.engine_cls.name,
        "tun": {"name": dp.tun_name, "queues": len(dp.tun_fds),
                "vnet": bool(state.offloads.vnet)},
        "udp": {"addr": str(state.ext.iface_addr), "port": state.config.backend_port},
        # the IPv6 underlay's sockets (none: {}), which an older daemon reads past
        "udp6": {"addr": six[0].getsockname()[0], "sockets": len(six)} if six else {},
        "mtu": state.ext.tun_mtu,
        "config": state.config.raw,
        "lease": lease_json(state.current_lease()),
        "peers": peers,
        "peers6": peers6,
        "peers_public_ipv6": pub6,
        "peers6_via": via6,
    }


def peers_of(state: dict, ipv6: bool = False) -> list[Lease]:
    """The engine's peers of the state: those of its IPv4 routes, or (``ipv6``) every peer
    whose IPv6 part it routes."""
    parts = {s: IPv6Network(v6) for s, v6 in state.get("peers6", [])}
    pub6 = {s: IPv6Address(a) for s, a in state.get("peers_public_ipv6", [])}
    pairs = state.get("peers", [])
    if ipv6:
        pairs = [(s, ip) for s, ip in pairs + state.get("peers6_via", []) if s in parts]
    return [Lease(subnet=IPv4Network(s),
                  attrs=LeaseAttrs(public_ip=IPv4Address(ip), forwards_ipv6=s in parts,
                                   public_ipv6=pub6.get(s)),
                  ipv6_subnet=parts.get(s))
            for s, ip in pairs]


class StateFile:
    """The state document in a memfd, for the fd store. Rewritten in place (the stored fd stays the
    same): the document first, then the length cut, and read back as the first JSON value in the
    file, so that a process killed between the two leaves a readable document."""

    def __init__(self, fd: int):
        self.fd = fd
        self._lock = threading.Lock()

    @classmethod
    def create(cls) -> "StateFile":
        return cls(os.memfd_create("flannel-udp-state", os.MFD_CLOEXEC))

    def write(self, doc: dict) -> None:
        data = json.dumps(doc, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            os.pwrite(self.fd, data, 0)
            os.ftruncate(self.fd, len(data))

    def read(self) -> dict:
        with self._lock:
            data = os.pread(self.fd, os.fstat(self.fd).st_size, 0)
        doc, _ = json.JSONDecoder().raw_decode(data.decode())
        if not isinstance(doc, dict):
            raise ValueError("the state is no JSON object")
        return doc

    def close(self) -> None:
        os.close(self.fd)


# ------------------------------------------------------------------ the checks

@dataclass
class Observed:
    """What the handed fds are, as the kernel reports them."""
    tun: list = field(default_factory=list)          # (name, IFF_* flags) per queue, or an error
    mtu: int = 0
    addrs: list = field(default_factory=list)        # IPv4Interface on the device
    udp: list = field(default_factory=list)          # (ip, port) per socket
    steering_refused: OSError | None = None          # host/udpsock.py steering_refusal()


def observe(tun_fds, socks) -> Observed:
    from ..host.netconf import link_facts
    from ..host.tun import tun_info
    obs = Observed()
    for fd in tun_fds:
        try:
            obs.tun.append(tun_info(fd))
        except OSError as e:
            obs.tun.append(e)
    names = {t[0] for t in obs.tun if isinstance(t, tuple)}
    if len(names) == 1:
        try:
            obs.mtu, obs.addrs = link_facts(names.pop())
        except Exception as e:          # no facts: the checks name what is missing
            log.debug("reading %s: %s", names, e)
    for s in socks:
        try:
            obs.udp.append(s.getsockname()[:2])
        except OSError as e:
            obs.udp.append(e)
    if len(tun_fds) == 1 and len(socks) == 1:
        from ..host.udpsock import steering_refusal
        try:
            obs.steering_refused = steering_refusal()
        except OSError as e:        # no answer: the checks then want the queues asked for
            log.debug("asking for the steering: %s", e)
    return obs


def mismatch(state: dict, obs: Observed, *, ext, config, lease: Lease | None, queues: int,
             vnet: bool) -> str | None:
    """Why the handed fds are not what this daemon would set up itself, or None. Without a
    ``lease`` (not yet acquired) flannel0's address is not looked at."""
    if state.get("version") != STATE_VERSION:
        return f"the state is of version {state.get('version')!r}, this daemon reads {STATE_VERSION}"
    try:
        old_config = parse_config(json.dumps(state.get("config")))
    except ConfigError as e:
        return f"the network config in the state does not parse: {e}"
    if old_config != config:
        return (f"the network config changed (Network {old_config.network} -> {config.network}, "
                f"port {old_config.backend_port} -> {config.backend_port}, ...)")
    # Where the host refuses the steering of several sockets, a daemon runs one queue whatever
    # --queues says (host/udpsock.py), on a device made for several or for one: we would too.
    fallback = queues > 1 and len(obs.tun) == len(obs.udp) == 1 and obs.steering_refused
    if not fallback and (len(obs.tun) != queues or len(obs.udp) != queues):
        return (f"flannel0 has {len(obs.tun)} queue(s) and {len(obs.udp)} socket(s); this daemon "
                f"runs {queues} queue(s) (--queues)")
    for t in obs.tun:
        if isinstance(t, OSError):
            return f"a flannel0 queue has no device any more ({t.strerror})"
    name = state.get("tun", {}).get("name")
    for got, flags in obs.tun:
        if got != name:
            return f"a queue belongs to {got}, not to {name}"
        if bool(flags & IFF_VNET_HDR) != vnet:
            return (f"{name} was opened {'with' if flags & IFF_VNET_HDR else 'without'} vnet "
                    f"headers and this daemon runs {'with' if vnet else 'without'} offloads "
                    "(--engine, --offload)")
        if not fallback and bool(flags & IFF_MULTI_QUEUE) != (queues > 1):
            return f"{name} is {'' if flags & IFF_MULTI_QUEUE else 'not '}a multi-queue device"
    if obs.mtu != ext.tun_mtu:
        return f"{name} has MTU {obs.mtu}, this daemon would set {ext.tun_mtu} ({ext.name} - 28)"
    want = IPv4Interface(f"{lease.subnet.network_address}/32") if lease is not None else None
    if want is not None and want not in obs.addrs:
        return (f"{name} has the address(es) {', '.join(map(str, obs.addrs)) or 'none'}, not "
                f"{want} of the lease {lease.subnet}")
    for got in obs.udp:
        if isinstance(got, OSError):
            return f"a UDP socket cannot be read ({got.strerror})"
        if got != (str(ext.iface_addr), config.backend_port):
            return (f"a UDP socket is bound to {got[0]}:{got[1]}, this daemon would bind "
                    f"{ext.iface_addr}:{config.backend_port}")
    return None


def kept_lease(state: dict, ext, config, now: float | None = None) -> tuple[Lease | None, str]:
    """(the handed lease, "") if this daemon may keep it without asking etcd, else (None, why)."""
    try:
        lease = lease_of_json(state["lease"])
    except (KeyError, TypeError, ValueError) as e:
        return None, f"the state holds no lease ({e})"
    if lease.public_ip != ext.ext_addr:
        return None, f"the lease is for PublicIP {lease.public_ip}, this host is {ext.ext_addr}"
    if not config.subnet_compatible(lease.subnet):
        return None, f"the lease {lease.subnet} does not fit the network config"
    if not config.ipv6_subnet_compatible(lease.ipv6_subnet):
        return None, (f"the lease's IPv6 part ({lease.ipv6_subnet or 'none'}) does not fit the "
                      f"network config (EnableIPv6 {'on' if config.enable_ipv6 else 'off'})")
    now = time.time() if now is None else now
    if not lease.reservation and (lease.expiration or 0) - now < LEASE_MIN_LEFT_S:
        return None, f"the lease {lease.subnet} expires in less than {LEASE_MIN_LEFT_S:.0f} s"
    return lease, ""


# ------------------------------------------------------------------ what was handed

class Inherited:
    """Fds and state handed to this daemon, and what the way they came needs at the switch."""
    way = "?"
    state_file: StateFile | None = None    # the memfd systemd keeps, when the state is in one

    def __init__(self, state: dict, tun_fds: list, sockets: dict):
        """``sockets``: the underlay's family (host/family.py) -> its sockets, one per queue."""
        self.state = state
        self.tun_fds = tun_fds
        # as host/assembly.py Dataplane holds them, IPv4's first; the IPv6 underlay's, one per
        # queue, or none (daemon/takeover.py underlay6)
        self.sockets = {f: list(s) for f, s in sockets.items() if s}

    @property
    def queues(self) -> int:
        """How many queues the sockets handed serve: one IPv4 socket each."""
        return len(self.sockets.get(V4, ()))

    @property
    def tun_name(self) -> str:
        return self.state["tun"]["name"]

    @property
    def config_raw(self):
        return self.state.get("config")

    @property
    def old_running(self) -> bool:
        """Whether the previous daemon still runs (and holds its HTTP ports) until the switch."""
        return False

    def switch(self, start_engine) -> dict:
        """Start our engine in place of the old one's; returns the newest state."""
        start_engine()
        return self.state

    def release(self) -> None:
        """Let the fds go so that a fresh start can make flannel0 and bind the port again."""
        self._close()

    def _close(self) -> None:
        for fd in self.tun_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        for socks in self.sockets.values():
            for s in socks:
                s.close()
        self.tun_fds, self.sockets = [], {}


class FromFdStore(Inherited):
    way = "systemd's fd store"

    def __init__(self, state: dict, tun_fds: list, sockets: dict,
                 state_file: StateFile | None, names: list):
        super().__init__(state, tun_fds, sockets)
        self.state_file = state_file
        self.names = names

    def release(self) -> None:
        name = self.state.get("tun", {}).get("name")
        fdstore.remove(self.names)
        self._close()
        if self.state_file is not None:
            self.state_file.close()
            self.state_file = None
        if name:
            wait_gone(name)


def from_fd_store() -> FromFdStore | None:
    """What systemd passed to this process, or None."""
    named = fdstore.listen_fds()
    if not named:
        return None
    by_name = dict(named)
    tun_fds, sockets, state_file, state = [], {V4: [], V6: []}, None, {}
    while tun_fd_name(len(tun_fds)) in by_name and udp_fd_name(V4, len(tun_fds)) in by_name:
        sockets[V4].append(socket.socket(fileno=by_name.pop(udp_fd_name(V4, len(tun_fds)))))
        tun_fds.append(by_name.pop(tun_fd_name(len(tun_fds))))
    while udp_fd_name(V6, len(sockets[V6])) in by_name:
        sockets[V6].append(socket.socket(fileno=by_name.pop(udp_fd_name(V6, len(sockets[V6])))))
    if STATE_NAME in by_name:
        state_file = StateFile(by_name.pop(STATE_NAME))
        try:
            state = state_file.read()
        except (OSError, ValueError) as e:
            log.warning("The state in systemd's fd store does not read: %s", e)
    for name, fd in by_name.items():
        log.warning("systemd passed an fd named %r that this daemon does not know: closed", name)
        os.close(fd)
    names = [n for n, _ in named if n not in by_name]
    log.info("systemd passed %d flannel0 queue(s), %d UDP socket(s)%s%s from the previous "
             "process (pid %s)", len(tun_fds), len(sockets[V4]),
             f", {len(sockets[V6])} IPv6 one(s)" if sockets[V6] else "",
             " and its state" if state else "", state.get("pid", "?"))
    return FromFdStore(state, tun_fds, sockets, state_file, names)


def wait_gone(name: str, timeout: float = RELEASE_TIMEOUT_S) -> bool:
    """Wait until no device is called ``name`` (its last holder closed it)."""
    from ..host.netconf import link_exists
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not link_exists(name):
            return True
        time.sleep(0.02)
    log.warning("%s still exists %.0f s after it was let go", name, timeout)
    return False
