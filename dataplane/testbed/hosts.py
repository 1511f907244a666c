"""Simulated hosts: network namespaces joined by veth pairs to a bridge.

(Over 450 lines as one piece: the hosts, their links and their addresses of both families
share one set of names and one teardown, which must remove all of it also when a test fails.)

::

      host h0 (netns fu-<pid>-<seq>-h0)      host h1 (netns fu-<pid>-<seq>-h1)   ...
      fu<id>h0  192.168.77.1/24              fu<id>h1  192.168.77.2/24
      default via 192.168.77.254             default via 192.168.77.254
            |  veth                                |  veth
      ------+------------ bridge fu<id>br ---------+-------------- switch netns
                           192.168.77.254/24        (fu-<pid>-<seq>-sw; room for an etcd)
                                   |
                           router netns (fu-<pid>-<seq>-rt), made by the first
                           add_host(behind_router=True): 192.168.77.253 on the
                           bridge above, 192.168.79.254 on its own bridge fu<id>rb
                                   |
      ------------- bridge fu<id>rb ------+--  host h2 behind the router: 192.168.79.3/24,
                                              default via 192.168.79.254

An IPv6 underlay (add_underlay6) takes the same shape: fd00:99::N/64 on the hosts' link,
fd00:79::N/64 behind the router, which has fd00:99::fd and fd00:79::fe and forwards between
them; each side has a route to the other's prefix via the router.

The underlay exists only inside these namespaces: nothing is added to the
caller's namespace, so the range cannot clash with the machine's own
networks. Each host has a default route through .254 so that a daemon that
picks "the default-route interface" (flanneld's rule) finds its veth.

Processes started with :meth:`Testbed.popen` (processes.py) are killed by
:meth:`Testbed.remove_host` and :meth:`Testbed.close`; the router is router.py's.
``close()`` deletes every namespace, which takes the veths, the bridge and
any TUN device with it. It runs on ``with`` exit, and at interpreter exit for
any testbed still open; a testbed of a killed run is swept (by its dead
pid) when the next one starts.
"""
from __future__ import annotations

import atexit
import ctypes
import ipaddress
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import weakref
from dataclasses import dataclass, field

from . import netns as ns
from .processes import Processes
from .router import (BEHIND_ROUTER, BEHIND_ROUTER6, DEFAULT_UNDERLAY6, ROUTER_HOST, SWITCH_HOST,
                     Router)

log = logging.getLogger(__name__)

DEFAULT_UNDERLAY = "192.168.77.0/24"
# where put_behind_router moves a host: the switch routes between it and DEFAULT_UNDERLAY
ROUTED_UNDERLAY = "192.168.78.0/24"


@dataclass
class Host:
    """One simulated host. ``ip`` is its underlay address, ``iface`` the name
    of its veth (inside ``netns``). Convenience calls go to the testbed."""
    name: str
    index: int
    netns: str
    ip: str
    iface: str
    mtu: int
    testbed: "Testbed" = field(repr=False, compare=False, default=None)
    ip6: str | None = None      # its IPv6 underlay address (Testbed.add_underlay6), if any
    behind_router: bool = False  # on the link behind the router (Testbed.add_host)

    def exec(self, argv, **kw) -> subprocess.CompletedProcess:
        return self.testbed.exec(self, argv, **kw)

    def popen(self, argv, **kw) -> subprocess.Popen:
        return self.testbed.popen(self, argv, **kw)


_open_testbeds: "weakref.WeakSet[Testbed]" = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for tb in list(_open_testbeds):
        try:
            tb.close()
        except Exception as e:  # best effort: the process is exiting
            log.warning("testbed cleanup at exit failed: %s", e)


class Testbed:
    """N simulated hosts on one L2 segment. A context manager.

    :param hosts: number of hosts to create at once (more with :meth:`add_host`).
    :param underlay: the private /24 (or larger) the hosts live in; host i gets
        the (i+1)-th address, the switch the .254 one.
    :param mtu: MTU of the veths (flannel0 gets mtu - 28).
    :param sweep: delete stale namespaces of dead runs first.
    :param disable_ipv6: keep IPv6 off in every namespace (clean TUN counters).
    """

    def __init__(self, hosts: int = 2, *, underlay: str = DEFAULT_UNDERLAY, mtu: int = 1500,
                 sweep: bool = True, disable_ipv6: bool = True):
        self.underlay = ipaddress.IPv4Network(underlay)
        if self.underlay.num_addresses < 256:
            raise ValueError("underlay must be a /24 or larger")
        self.mtu = int(mtu)
        self.disable_ipv6 = disable_ipv6
        self.run_id = ns.new_run_id()
        self.tag = ns.short_id(self.run_id)
        self.switch = ns.ns_name(self.run_id, "sw")
        self.bridge = f"{ns.PREFIX}{self.tag}br"
        self.switch_ip = str(self.underlay.network_address + SWITCH_HOST)
        self.router: Router | None = None  # once a host is behind it
        self.hosts: list[Host] = []
        self._procs = Processes()
        self._closed = False
        self._namespaces: list[str] = []
        self._workdir: str | None = None
        self._bpffs: str | None = None     # the hosts' bpffs (bpf_pins), once one is asked for
        self._etcds: list = []
        if sweep:
            ns.sweep_stale()
            _sweep_stale_workdirs()
        _open_testbeds.add(self)
        try:
            self._make_switch()
            for _ in range(hosts):
                self.add_host()
        except BaseException:
            self.close()
            raise

    # -- topology -------------------------------------------------------

    def _make_switch(self) -> None:
        ns.create(self.switch, disable_ipv6=self.disable_ipv6)
        self._namespaces.append(self.switch)
        # A bridge without an address of its own takes the lowest MAC of its ports, so adding
        # a host can move it to the new port and removing that host moves it back: hosts that
        # resolved .254 meanwhile keep the vanished MAC, and their traffic to the switch (etcd)
        # is black-holed until their neighbour entry expires (up to ~45 s). A fixed address
        # (locally administered, per run) never moves.
        ns.run_ip(["-batch", "-"], netns=self.switch, input=(
            f"link add {self.bridge} type bridge stp_state 0 forward_delay 0\n"
            f"link set {self.bridge} address {self._fixed_mac(0)}\n"
            f"link set {self.bridge} mtu {self.mtu} up\n"
            f"addr add {self.switch_ip}/{self.underlay.prefixlen} dev {self.bridge}\n"))

    def make_router(self) -> Router:
        """The router (router.py), made once. The switch sends no redirects, so the hosts keep
        their path through it."""
        if self.router is None:
            netns = ns.ns_name(self.run_id, "rt")
            ns.create(netns, disable_ipv6=self.disable_ipv6)
            self._namespaces.append(netns)
            self.router = Router(netns, tag=self.tag, switch=self.switch,
                                 switch_bridge=self.bridge, switch_ip=self.switch_ip,
                                 underlay=self.underlay, mtu=self.mtu, mac=self._fixed_mac(1))
            self.router.wire()
            self._switch_routes()
        return self.router

    def _switch_routes(self) -> None:
        """The switch forwards between subnets of its bridge and sends no redirects (the hosts
        are to keep going through it)."""
        for key in ("net/ipv4/ip_forward", "net/ipv4/conf/all/send_redirects",
                    f"net/ipv4/conf/{self.bridge}/send_redirects"):
            ns.write_sysctl(self.switch, key, "0" if "redirects" in key else "1")

    def _fixed_mac(self, bridge: int) -> str:
        """A bridge's MAC address, locally administered and unique per run and bridge: see
        _make_switch."""
        pid, seq = self.run_id
        return "02:%02x:%02x:%02x:%02x:%02x" % (0x66 + bridge, (pid >> 16) & 0xff,
                                                (pid >> 8) & 0xff, pid & 0xff, seq & 0xff)

    def add_host(self, name: str | None = None, *, behind_router: bool = False) -> Host:
        """Create one more host (namespace + veth into the bridge + address).
        ``name`` defaults to ``h<index>``, index being the lowest free one. ``behind_router``:
        on the router's own link instead (:data:`BEHIND_ROUTER`, same last byte), so that its
        underlay address is one router away from the others and on none of their links."""
        self._check_open()
        used = {h.index for h in self.hosts}
        index = next(i for i in range(SWITCH_HOST - 1) if i not in used)
        name = name or f"h{index}"
        if any(h.name == name for h in self.hosts):
            raise ValueError(f"host {name!r} exists")
        netns = ns.ns_name(self.run_id, name)
        lan, bridge, link = self.underlay, self.bridge, self.switch
        if behind_router:
            router = self.make_router()
            lan, bridge, link = ipaddress.IPv4Network(BEHIND_ROUTER), router.bridge, router.netns
        ip = str(lan.network_address + index + 1)
        iface = f"{ns.PREFIX}{self.tag}h{index}"
        port = f"{ns.PREFIX}{self.tag}s{index}"
        if len(iface) > 15:
            raise ValueError(f"interface name {iface} too long")
        ns.create(netns, disable_ipv6=self.disable_ipv6)
        self._namespaces.append(netns)
        try:
            ns.add_veth(link, port, netns, iface, mtu=self.mtu, master=bridge,
                        peer_cidr=f"{ip}/{lan.prefixlen}",
                        gateway=str(lan.network_address + SWITCH_HOST))
        except BaseException:
            self._delete_ns(netns)
            raise
        host = Host(name=name, index=index, netns=netns, ip=ip, iface=iface, mtu=self.mtu,
                    testbed=self, behind_router=behind_router)
        self.hosts.append(host)
        log.debug("testbed host %s: netns %s, %s on %s", name, netns, ip, iface)
        return host

    def add_netns(self, host: Host | str, name: str) -> str:
        """An empty namespace (IPv6 on, loopback up) for a workload ``name`` of ``host``, deleted
        with the testbed: where a CNI plugin puts a pod (testbed/cni.py); add_pod wires one
        itself."""
        self._check_open()
        netns = ns.ns_name(self.run_id, f"{self.host(host).name}{name}")
        ns.create(netns, disable_ipv6=False)
        self._namespaces.append(netns)
        return netns

    def add_pod(self, host: Host | str, name: str, address: str, gateway: str) -> str:
        """A workload namespace (IPv6 on) hanging off ``host`` by a veth: ``address`` (with its
        prefix) and a default route via ``gateway`` in the pod, ``gateway`` with the same
        prefix on the host's end, which forwards for it; as a CNI bridge would give it, without
        duplicate address detection (its second would only slow the tests). Returns the pod's
        namespace, deleted with the testbed."""
        host = self.host(host)
        near = f"{ns.PREFIX}{self.tag}{host.index}{name}"
        if len(near) > 15:
            raise ValueError(f"interface name {near} too long")
        plen = ipaddress.ip_interface(address).network.prefixlen
        netns = self.add_netns(host, name)
        try:
            ns.run_ip(["-batch", "-"], netns=host.netns, input=(
                f"link add {near} type veth peer name eth0 netns {netns}\n"
                f"addr add {gateway}/{plen} dev {near} nodad\n"
                f"link set {near} up\n"))
            ns.run_ip(["-batch", "-"], netns=netns, input=(
                f"addr add {address} dev eth0 nodad\n"
                "link set eth0 up\n"
                f"route add default via {gateway} dev eth0\n"))
            family = "ipv6" if ipaddress.ip_address(gateway).version == 6 else "ipv4"
            key = "net.ipv6.conf.all.forwarding" if family == "ipv6" else "net.ipv4.ip_forward"
            subprocess.run(ns.exec_argv(host.netns, ["sysctl", "-qw", f"{key}=1"]), check=True,
                           capture_output=True, timeout=10)
        except BaseException:
            self._delete_ns(netns)
            raise
        return netns

    def add_underlay6(self, host: Host | str, network: str | None = None) -> Host:
        """An IPv6 underlay address on ``host``'s veth, with the same last number as its IPv4
        one (``fd00:99::1`` for h0; behind the router ``fd00:79::3`` for h2, which sets up the
        router's IPv6 legs), usable at once (``nodad``: a daemon binds it as it starts), and a
        route to the other side of the router (a gateway that exists once a host behind it
        has an IPv6 underlay); IPv6 is turned on for that veth alone where the testbed keeps
        it off."""
        host = self.host(host)
        here, there = DEFAULT_UNDERLAY6, BEHIND_ROUTER6
        gateway = ipaddress.IPv6Network(here).network_address + ROUTER_HOST
        if host.behind_router:
            here, there = there, here
            gateway = self.make_router().ipv6()
        net = ipaddress.IPv6Network(network or here)
        ip = str(net.network_address + host.index + 1)
        # Neighbour solicitations go from the link-local address only: without DAD (IPv6
        # turned off and on again so that a present one is made anew) the first datagrams
        # do not wait a second for it.
        ns.write_sysctl(host.netns, f"net/ipv6/conf/{host.iface}/accept_dad", "0")
        for off in ("1", "0"):
            ns.write_sysctl(host.netns, f"net/ipv6/conf/{host.iface}/disable_ipv6", off)
        ns.run_ip(["-batch", "-"], netns=host.netns, input=(
            f"addr add {ip}/{net.prefixlen} dev {host.iface} nodad\n"
            f"route add {there} via {gateway} dev {host.iface}\n"))
        host.ip6 = ip
        log.debug("testbed host %s: IPv6 underlay %s on %s", host.name, ip, host.iface)
        return host

    def put_behind_router(self, host: Host | str, network: str = ROUTED_UNDERLAY) -> Host:
        """Move ``host`` into another underlay subnet (its address there has the same last
        byte) whose gateway is the switch namespace, which then routes between the two: from
        the other hosts it is reached through a gateway, no longer on their link. Same bridge,
        one IP hop: what a host behind a router is to the kernel's route lookup."""
        host = self.host(host)
        net = ipaddress.IPv4Network(network)
        router = net.network_address + SWITCH_HOST
        have = ns.run_ip(["-o", "addr", "show", "dev", self.bridge], netns=self.switch).stdout
        if f" {router}/" not in have:
            ns.run_ip(["addr", "add", f"{router}/{net.prefixlen}", "dev", self.bridge],
                      netns=self.switch)
        # a router between two subnets of one bridge: forward, and send no redirects (the
        # hosts are to keep going through it)
        self._switch_routes()
        ip = str(net.network_address + host.index + 1)
        ns.run_ip(["-batch", "-"], netns=host.netns, input=(
            f"addr flush dev {host.iface}\n"
            f"addr add {ip}/{net.prefixlen} dev {host.iface}\n"
            f"route replace default via {router} dev {host.iface}\n"))
        host.ip = ip
        log.debug("testbed host %s: behind the router now, %s on %s", host.name, ip, host.iface)
        return host

    def remove_host(self, host: Host | str) -> None:
        """Kill the host's processes and delete its namespace (its veth and
        TUNs go with it)."""
        host = self.host(host)
        self.hosts.remove(host)
        # A deleted namespace is torn down asynchronously by the kernel, so its
        # veth can answer for a moment after `ip netns del`; deleting the
        # switch-side end removes the pair at once.
        links = [self.switch] + ([self.router.netns] if self.router else [])
        for link in links:
            ns.run_ip(["link", "del", f"{ns.PREFIX}{self.tag}s{host.index}"], netns=link,
                      check=False)
        self._delete_ns(host.netns)
        # Its IP is reused by the next add_host(); a cached MAC of the old veth
        # would black-hole that host for the neighbour timeout (~30 s).
        for where in links + [h.netns for h in self.hosts]:
            ns.run_ip(["neigh", "flush", "to", host.ip], netns=where, check=False)

    def host(self, key: Host | str | int) -> Host:
        """A host by Host, name or index."""
        if isinstance(key, Host):
            if key not in self.hosts:
                raise KeyError(f"host {key.name} is not (or no longer) in this testbed")
            return key
        for h in self.hosts:
            if h.name == key or h.index == key:
                return h
        raise KeyError(f"no host {key!r}")

    def __getitem__(self, key) -> Host:
        return self.host(key)

    def __iter__(self):
        return iter(list(self.hosts))

    def __len__(self) -> int:
        return len(self.hosts)

    def namespaces(self) -> list[str]:
        """Every namespace of this testbed (switch first)."""
        return list(self._namespaces)

    def _netns(self, where) -> str:
        if where in ("switch", self.switch):
            return self.switch
        if isinstance(where, str) and where in self._namespaces:
            return where
        return self.host(where).netns

    # -- processes --------------------------------------------------------

    def argv(self, where, argv) -> list[str]:
        """The argv that runs ``argv`` in a host (Host, name, index) or in
        ``"switch"``."""
        return ns.exec_argv(self._netns(where), list(argv))

    def exec(self, where, argv, *, timeout: float = 30, check: bool = False,
             input=None, env=None, text: bool = True) -> subprocess.CompletedProcess:
        """Run ``argv`` in a host and wait (bounded by ``timeout``); output captured."""
        self._check_open()
        return subprocess.run(self.argv(where, argv), capture_output=True, text=text,
                              timeout=timeout, check=check, input=input, env=env)

    def popen(self, where, argv, **kw) -> subprocess.Popen:
        """Start ``argv`` in a host in its own session (processes.py ``Processes.popen``);
        killed by :meth:`kill`, :meth:`remove_host` or :meth:`close`."""
        self._check_open()
        return self._procs.popen(self._netns(where), argv, **kw)

    def kill(self, proc: subprocess.Popen, *, sig: int = signal.SIGTERM,
             timeout: float = 5.0) -> int | None:
        """Stop a process started by :meth:`popen`; its exit code (processes.py)."""
        return self._procs.kill(proc, sig=sig, timeout=timeout)

    def udp_out(self, where) -> tuple[int, int]:
        """(IPv4, IPv6) UDP datagrams sent from a namespace so far: the kernel's own counters
        (a UDP_SEGMENT send counts once), which tell the underlay an engine's traffic took."""
        lines = self.exec(where, ["cat", "/proc/net/snmp", "/proc/net/snmp6"],
                          check=True).stdout.splitlines()
        names, values = [line.split() for line in lines if line.startswith("Udp:")][:2]
        v6 = next(line.split()[1] for line in lines if line.startswith("Udp6OutDatagrams "))
        return int(values[names.index("OutDatagrams")]), int(v6)

    def start_etcd(self, **kw):
        """Start a real etcd in the switch namespace, listening on the switch
        address (``http://192.168.77.254:<port>``, reachable from every host).
        Returns the started :class:`dataplane.testbed.etcd.EtcdServer`
        (``.client_url``); it is closed by :meth:`close`."""
        self._check_open()
        from .etcd import EtcdServer  # lazy: the testbed works without etcd installed
        server = EtcdServer(host=self.switch_ip, netns=self.switch, **kw)
        self._etcds.append(server)
        server.start()
        return server

    @property
    def workdir(self) -> str:
        """A temporary directory for this testbed's files (logs, stats,
        ready files); removed by :meth:`close`."""
        if self._workdir is None:
            self._workdir = tempfile.mkdtemp(prefix=f"{ns.PREFIX}-tb-{self.run_id[0]}-")
        return self._workdir

    def bpf_pins(self, where) -> str:
        """The host's own --bpf-pins: a directory on a bpffs of this testbed's, mounted in its
        workdir (`ip netns exec` remounts /sys, which hides /sys/fs/bpf from the hosts; one
        mount for all of them, and every host its own directory, so that no daemon adopts
        another host's kernel path). Unmounted by :meth:`close`, every pin with it."""
        if self._bpffs is None:
            path = os.path.join(self.workdir, "bpffs")
            os.makedirs(path, exist_ok=True)
            _mount_bpffs(path)
            self._bpffs = path
        return os.path.join(self._bpffs, self.host(where).name)

    # -- teardown ---------------------------------------------------------

    def _delete_ns(self, netns: str) -> None:
        self._procs.kill_in(netns)
        ns.delete(netns)
        if netns in self._namespaces:
            self._namespaces.remove(netns)

    def close(self) -> None:
        """Kill tracked processes (by PID), then delete every namespace. Idempotent."""
        if self._closed:
            return
        self._closed = True
        errors = []
        self._procs.kill_in(None)
        for server in self._etcds:
            try:
                server.close()
            except Exception as e:
                errors.append(f"etcd: {e}")
        self._etcds.clear()
        for netns in reversed(self._namespaces[:]):
            try:
                self._delete_ns(netns)
            except Exception as e:
                errors.append(f"{netns}: {e}")
        self.hosts.clear()
        if self._bpffs is not None:
            _unmount(self._bpffs)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        _open_testbeds.discard(self)
        if errors:
            raise ns.NetnsError("testbed teardown left: " + "; ".join(errors))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("testbed is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Testbed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<Testbed {self.switch[:-3]} hosts={[h.name for h in self.hosts]}"
                f"{' closed' if self._closed else ''}>")


def _sweep_stale_workdirs() -> None:
    """Remove the workdirs (``<tmp>/fu-tb-<pid>-*``) of dead runs."""
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in ns.dead_run_names(names, "tb"):
        _unmount(os.path.join(tmp, name, "bpffs"))
        shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


def _mount_bpffs(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"bpffs", path.encode(), b"bpf", 0, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mounting a bpffs at {path}: {os.strerror(err)}")


def _unmount(path: str) -> None:
    """Unmount what is mounted at ``path`` (nothing: nothing done); lazily, as a process of a
    killed test may still hold a pin's fd."""
    if os.path.ismount(path):
        ctypes.CDLL(None, use_errno=True).umount2(path.encode(), 2)      # MNT_DETACH
