"""The kernel path: the tc programs of csrc/bpf/ loaded, configured and attached.

A KernelPath holds one loaded object (both programs and their maps) for one
host: ``configure`` writes what the engines are given at start (own PublicIP and
PublicIPv6, port, mtu, lease subnets, the source rules), ``set_routes``
the same routes as the engines' tables (api.Route, either underlay; written in
batches by bpf_routes.py's RouteMaps, which KernelPath is), and
``attach`` puts fu_egress on flannel0's egress and fu_ingress on the
external interface's ingress (clsact, through libbpf's netlink, in the
caller's network namespace). ``counters`` sums the per-CPU counters by
maps.h's names; ``test_run`` hands one packet to a program
(BPF_PROG_TEST_RUN) for the tests. Until ``configure`` has run, the programs
pass every packet on unchanged.

With ``pin_dir`` the path outlives the process: its maps and programs are
pinned there once attached, and a new KernelPath on the same directory takes
the pinned maps over, reads back what they hold (its next configure,
set_routes and set_local write only the difference) and leaves the running
programs on their hooks when they are the same code (bpf_pins.py says how an
upgrade goes); ``leave`` ends the process's part and leaves the path running.

Nothing here runs tc or bpftool. Which path runs is engine/choice.py's; the
kernel path in front of an engine is engine/kernel_engine.py, and the daemon's
hold on it daemon/kernel_path.py (docs/kernel-path.md).
"""
from __future__ import annotations

import ipaddress
import os
import struct
from socket import ntohl

from . import bpf_contract as bc
from .bpf_build import build
from .bpf_kernel import kernel_decaps_gso, link_is_ethernet
from . import bpf_pins
from .bpf_lib import BpfLibError, check, check_ptr, ffi, lib, percpu_sums, sized
from .bpf_routes import UNSENDABLE_MTU, RouteMaps
from .ipobjects import address4, network4
from ..host import malloc

# linux/pkt_cls.h: a tc program's verdicts
TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
VERDICTS = {TC_ACT_OK: "pass", TC_ACT_SHOT: "drop", TC_ACT_REDIRECT: "redirect"}
BPF_TC_F_REPLACE = 1
# Our filters' place on the clsact hooks: one handle and priority of our own, replaced in place.
TC_HANDLE, TC_PRIORITY = 0x4655, 1
_LOG_SIZE = 4 << 20
# linux/bpf.h's struct __sk_buff (uapi: fields are only ever appended), for a test run's
# context: its size as of Linux 5.16, and where its gso_size is.
_SKB_CTX_SIZE, _SKB_GSO_SIZE_AT = 192, 176


class KernelPathError(RuntimeError):
    """The kernel path cannot run here, and why (the verifier's log when it refused); or
    routes it cannot hold (bpf_routes.py)."""


def _v4(addr) -> bytes:
    return ipaddress.IPv4Address(addr).packed


def _addr_key(a, map4: str, map6: str):
    """(map, key) of an address in a pair of per-family maps keyed by it (fu_local*, fu_peers*)."""
    if a.version == 4:
        return map4, ffi.new("__u32 *", struct.unpack("=I", a.packed)[0])
    key = ffi.new("fu_addr6 *")
    ffi.memmove(key.addr, a.packed, 16)
    return map6, key


class KernelPath(RouteMaps):
    error = KernelPathError         # routes the programs cannot hold (RouteMaps)

    def __init__(self, obj_path: str | None = None, pin_dir: str | None = None):
        """``pin_dir``: keep the path on bpffs there and adopt what a process before left
        there (bpf_pins.py; the Pins section below)."""
        if os.geteuid() != 0:
            raise KernelPathError("loading BPF programs needs root (CAP_BPF and CAP_NET_ADMIN)")
        try:
            self._lib = lib()
        except BpfLibError as e:
            raise KernelPathError(str(e)) from None
        path = str(obj_path or build())
        self._obj = check_ptr(self._lib.bpf_object__open_file(path.encode(), ffi.NULL),
                              f"opening {path}")
        self._logs = {}
        progs = {}
        for name in (bc.PROG_EGRESS, bc.PROG_INGRESS):
            prog = check_ptr(self._lib.bpf_object__find_program_by_name(self._obj, name.encode()),
                             f"program {name} in {path}")
            # libbpf fills it only when the load fails (retrying with log level 1)
            buf = self._logs[name] = ffi.new("char[]", _LOG_SIZE)
            self._lib.bpf_program__set_log_buf(prog, buf, _LOG_SIZE)
            progs[name] = prog
        self.pin_dir = pin_dir
        self.maps_state = bpf_pins.reuse_maps(self._object_maps(), pin_dir)
        rc = self._lib.bpf_object__load(self._obj)
        malloc.fix_thresholds()         # the kernel's BTF (5 MB), read and freed by the load
        if rc < 0:
            logs = "\n".join(f"--- {n} ---\n{ffi.string(b).decode(errors='replace')[-8000:]}"
                             for n, b in self._logs.items() if b[0] != b"\0")
            self._lib.bpf_object__close(self._obj)
            self._obj = None
            raise KernelPathError(f"the kernel refused the programs of {path} "
                                  f"({os.strerror(-rc)}); the verifier said:\n{logs}")
        self._logs.clear()
        self.prog_fd = {n: self._lib.bpf_program__fd(p) for n, p in progs.items()}
        self.map_fd = {}
        for name in (bc.MAP_CONFIG, bc.MAP_ROUTES4, bc.MAP_ROUTES6, bc.MAP_PEERS4, bc.MAP_PEERS6,
                     bc.MAP_LOCAL4, bc.MAP_LOCAL6, bc.MAP_COUNTERS):
            m = check_ptr(self._lib.bpf_object__find_map_by_name(self._obj, name.encode()),
                          f"map {name} in {path}")
            self.map_fd[name] = self._lib.bpf_map__fd(m)
        self._cfg = ffi.new("fu_config *")
        self._init_route_maps()
        self._local: set = set()
        self._hooks: list = []           # (hook, opts, created) to undo
        self._adopt()

    # ---- maps ----------------------------------------------------------------------------

    def _update(self, m: str, key, value) -> None:
        check(self._lib.bpf_map_update_elem(self.map_fd[m], key, value, 0), f"writing {m}")

    def _delete(self, m: str, key) -> None:
        rc = self._lib.bpf_map_delete_elem(self.map_fd[m], key)
        if rc < 0 and rc != -2:          # ENOENT: gone already
            check(rc, f"deleting from {m}")

    def _write_config(self) -> None:
        self._update(bc.MAP_CONFIG, ffi.new("__u32 *", 0), self._cfg)

    def configure(self, *, own_ip, port: int, mtu: int, own_subnets=(),
                  strict: bool = False, accept_any: bool = False,
                  decap_gso: bool | None = None, own_ip6=None) -> None:
        """What the engines are given at start: own PublicIP (the outer source and the address
        datagrams come to), the UDP port, the largest inner packet (flannel0's MTU), the
        lease's subnets, of either family (UDP -> TUN step 4), step 5 on or off, step 2 off (accept_any).
        ``own_ip6``: own PublicIPv6, the IPv6 underlay's (None: no IPv6 underlay; routes to
        IPv6 peers are then refused).
        ``decap_gso``: whether the ingress program decapsulates a peer program's TCP
        super-packets itself; by default where the kernel allows it (kernel_decaps_gso)."""
        if decap_gso is None:
            decap_gso = kernel_decaps_gso()
        c = self._cfg
        c.own_ip = struct.unpack("=I", _v4(own_ip))[0]
        c.port, c.mtu = int(port), int(mtu)
        flags = c.flags & (bc.F_TUN_L2 | bc.F_EXT_L2)
        c.flags = flags | (bc.F_STRICT if strict else 0) | (bc.F_ACCEPT_ANY if accept_any else 0) | \
            (bc.F_DECAP_GSO if decap_gso else 0)
        nets = {n.version: n for n in map(ipaddress.ip_network, own_subnets)}
        net, net6 = nets.get(4), nets.get(6)
        c.own_net = struct.unpack("=I", net.network_address.packed)[0] if net else 0
        c.own_mask = struct.unpack("=I", net.netmask.packed)[0] if net else 0
        ffi.memmove(c.own_net6, net6.network_address.packed if net6 else bytes(16), 16)
        ffi.memmove(c.own_mask6, net6.netmask.packed if net6 else bytes(16), 16)
        ffi.memmove(c.own_ip6, ipaddress.IPv6Address(own_ip6).packed if own_ip6 else bytes(16), 16)
        self._write_config()

    def set_local(self, addrs) -> None:
        """This host's own addresses (both families), replacing the last set (step 4)."""
        new = {ipaddress.ip_address(a) for a in addrs}
        for a in self._local - new:
            self._delete(*self._local_key(a))
        for a in new - self._local:
            self._update(*self._local_key(a), ffi.new("__u32 *", 1))
        self._local = new

    @staticmethod
    def _local_key(a):
        return _addr_key(a, bc.MAP_LOCAL4, bc.MAP_LOCAL6)

    @staticmethod
    def _peer_key(peer):
        return _addr_key(peer, bc.MAP_PEERS4, bc.MAP_PEERS6)

    def counters(self) -> dict:
        """maps.h's counters by name, summed over the CPUs."""
        return dict(zip(bc.COUNTER_NAMES, percpu_sums(self.map_fd[bc.MAP_COUNTERS],
                                                      bc.N_COUNTERS, "reading the counters")))

    # ---- hooks ---------------------------------------------------------------------------

    def set_devices(self, tun_ifindex: int, ext_ifindex: int, tun_l2: bool, ext_l2: bool) -> None:
        """Where the programs redirect to, and whether each device's packets start with an
        Ethernet header (attach asks the kernel; a test run always hands one in)."""
        if tun_l2 and not ext_l2:
            raise KernelPathError("an Ethernet flannel device with an external interface that has "
                                  "no Ethernet header is not supported")
        c = self._cfg
        c.tun_ifindex, c.ext_ifindex = tun_ifindex, ext_ifindex
        c.flags = (c.flags & ~(bc.F_TUN_L2 | bc.F_EXT_L2)) | (bc.F_TUN_L2 if tun_l2 else 0) | \
            (bc.F_EXT_L2 if ext_l2 else 0)
        self._write_config()

    def attach(self, tun_ifindex: int, ext_ifindex: int) -> None:
        """fu_egress on flannel0's (tun_ifindex) egress, fu_ingress on the external
        interface's ingress, in the caller's network namespace; the clsact qdisc made where
        there is none (and removed again by detach)."""
        self.set_devices(tun_ifindex, ext_ifindex, link_is_ethernet(tun_ifindex),
                         link_is_ethernet(ext_ifindex))
        for ifindex, point, prog in ((tun_ifindex, "BPF_TC_EGRESS", bc.PROG_EGRESS),
                                     (ext_ifindex, "BPF_TC_INGRESS", bc.PROG_INGRESS)):
            hook = sized("struct bpf_tc_hook")
            hook.ifindex = ifindex
            hook.attach_point = getattr(self._lib, point)
            rc = self._lib.bpf_tc_hook_create(hook)
            if rc < 0 and rc != -17:    # EEXIST: a clsact qdisc is there already
                check(rc, f"adding the clsact qdisc to ifindex {ifindex}")
            if self._runs_already(ifindex, point, prog):
                self._hooks.append((hook, False))
                continue
            self._fresh.add(prog)
            opts = sized("struct bpf_tc_opts")
            opts.prog_fd = self.prog_fd[prog]
            opts.handle, opts.priority, opts.flags = TC_HANDLE, TC_PRIORITY, BPF_TC_F_REPLACE
            check(self._lib.bpf_tc_attach(hook, opts), f"attaching {prog} to ifindex {ifindex}")
            self._hooks.append((hook, rc == 0))
        if self.pin_dir:
            self._pin()

    def detach(self) -> None:
        """Our filters off their hooks, and the clsact qdiscs we made removed. A device gone
        already took them with it."""
        while self._hooks:
            hook, created = self._hooks.pop()
            opts = sized("struct bpf_tc_opts")
            opts.handle, opts.priority = TC_HANDLE, TC_PRIORITY
            self._lib.bpf_tc_detach(hook, opts)
            if created:
                hook.attach_point = self._lib.BPF_TC_INGRESS | self._lib.BPF_TC_EGRESS
                self._lib.bpf_tc_hook_destroy(hook)

    # ---- pins: the path outlives the process (bpf_pins.py) -------------------------------

    def _object_maps(self) -> dict:
        out, m = {}, ffi.NULL
        while True:
            m = self._lib.bpf_object__next_map(self._obj, m)
            if m == ffi.NULL:
                return out
            out[ffi.string(self._lib.bpf_map__name(m)).decode()] = m

    def _adopt(self) -> None:
        """With pinned maps taken over: what they hold read back, so the caller's next
        configure / set_routes / set_local write only what changed (a peer that stays is never
        missing); and whether the programs running are this object's (the kernel's tags)."""
        self.adopted = self.maps_state == "reused"
        self._fresh = set()              # programs of this object put on a hook here
        self._running = bpf_pins.pinned_programs(self.pin_dir, self.prog_fd) if self.adopted \
            else {}
        self.same_programs = bool(self._running) and all(
            self._running.get(n) and self._running[n].tag == bpf_pins.prog_info(fd).tag
            for n, fd in self.prog_fd.items())
        if not self.adopted:
            return
        check(self._lib.bpf_map_lookup_elem(self.map_fd[bc.MAP_CONFIG], ffi.new("__u32 *", 0),
                                            self._cfg), "reading the pinned config")
        # 16,000 routes and peers at a restart beside a large network, before the old daemon
        # lets go: each key read into one buffer and made an object from its ints, without
        # ipaddress's constructors (engine/ipobjects.py), each peer once. (An LPM trie takes no
        # batched lookup: one call per key.)
        peer4: dict = {}                 # int -> the IPv4Address of every route and peer
        count4: dict = {}                # int -> how many routes name it (ints hash in C)
        hop = ffi.new("fu_hop *")
        lookup = self._lib.bpf_map_lookup_elem
        for m, ctype in ((bc.MAP_ROUTES4, "fu_key4"), (bc.MAP_ROUTES6, "fu_key6")):
            fd = self.map_fd[m]
            for key in self._each_key(m, ctype):
                if lookup(fd, key, hop) != 0:
                    continue
                if m == bc.MAP_ROUTES4:
                    net, prefixlen = int.from_bytes(ffi.buffer(key.addr), "big"), key.prefixlen
                    if prefixlen > 32 or net & (0xFFFFFFFF >> prefixlen):   # not ours: as
                        subnet = ipaddress.ip_network((net, prefixlen))    # before, refused
                    else:
                        subnet = network4(net, prefixlen)
                else:
                    subnet = ipaddress.ip_network((bytes(ffi.buffer(key.addr)), key.prefixlen))
                mtu = hop.mtu
                if hop.peer_ip or not any(hop.peer_ip6):
                    ip = ntohl(hop.peer_ip)
                    peer = peer4.get(ip) or peer4.setdefault(ip, address4(ip))
                    count4[ip] = count4.get(ip, 0) + 1
                    if not ip and mtu == UNSENDABLE_MTU:         # 0.0.0.0's (_hop_bytes)
                        mtu = 0
                else:                                            # the IPv6 underlay's
                    peer = ipaddress.IPv6Address(bytes(ffi.buffer(hop.peer_ip6)))
                    self._peers[peer] = self._peers.get(peer, 0) + 1
                self._routes[subnet] = (peer, mtu)
        for key in self._each_key(bc.MAP_PEERS4, "__u32"):     # set_routes removes a stale one
            count4.setdefault(ntohl(key[0]), 0)
        for key in self._each_key(bc.MAP_PEERS6, "fu_addr6"):
            self._peers.setdefault(ipaddress.IPv6Address(bytes(ffi.buffer(key.addr))), 0)
        self._peers.update({peer4.get(ip) or address4(ip): n for ip, n in count4.items()})
        self._local = {ipaddress.IPv4Address(struct.pack("=I", k[0]))
                       for k in self._each_key(bc.MAP_LOCAL4, "__u32")}
        self._local |= {ipaddress.IPv6Address(bytes(ffi.buffer(k.addr)))
                        for k in self._each_key(bc.MAP_LOCAL6, "fu_addr6")}

    def _keys(self, m: str, ctype: str) -> list:
        """Each key of map ``m``, each its own cdata (what a test keeps)."""
        out = []
        for key in self._each_key(m, ctype):
            out.append(ffi.new(ctype + " *", key[0]))
        return out

    def _each_key(self, m: str, ctype: str):
        """Each key of map ``m``, in one of two buffers taken in turns (the one before is the
        kernel's place in the walk): read it before the next."""
        bufs, prev = (ffi.new(ctype + " *"), ffi.new(ctype + " *")), ffi.NULL
        next_key, fd = self._lib.bpf_map_get_next_key, self.map_fd[m]
        while True:
            key = bufs[0] if prev is not bufs[0] else bufs[1]
            if next_key(fd, prev, key) != 0:
                return
            yield key
            prev = key

    def _runs_already(self, ifindex: int, point: str, prog: str) -> bool:
        """The same code, pinned, is on this hook already: left as it is."""
        return self.same_programs and bpf_pins.filter_prog_id(
            ifindex, point, TC_HANDLE, TC_PRIORITY) == self._running[prog].id

    def _pin(self) -> None:
        """Once the programs are on the hooks: the maps pinned (unless they are the pinned ones
        already), and the programs that run (those this object put on a hook: where the pinned
        code ran on one hook only, a device made again, say, the other keeps its pin)."""
        os.makedirs(self.pin_dir, exist_ok=True)
        if not self.adopted:
            for name, m in self._object_maps().items():
                bpf_pins.pin(self._lib.bpf_map__fd(m), os.path.join(self.pin_dir, name))
        for name, fd in self.prog_fd.items():
            if name in self._fresh or not self.same_programs:
                bpf_pins.pin(fd, os.path.join(self.pin_dir, name))

    def leave(self) -> None:
        """The process goes, the path stays: the object closed without detaching (the filters
        hold the programs, the programs and the pins the maps). For a restart or an upgrade;
        ``close`` takes the programs off their hooks."""
        self._hooks.clear()
        self.close()

    def leave_attached(self) -> None:
        """Forget our filters without removing them: after close they stay on their hooks,
        holding the programs and maps (a successor's attach replaces them in place)."""
        self._hooks.clear()

    # ---- tests ---------------------------------------------------------------------------

    def test_run(self, prog: str, data: bytes, gso_size: int = 0) -> tuple[int, bytes]:
        """BPF_PROG_TEST_RUN: ``data`` (an Ethernet frame: the kernel hands the program one
        in a test run) through program ``prog``; its verdict and the frame it left.
        ``gso_size``: the packet as a GSO one of that segment size."""
        opts = sized("struct bpf_test_run_opts")
        if gso_size:
            ctx = bytearray(_SKB_CTX_SIZE)
            struct.pack_into("=I", ctx, _SKB_GSO_SIZE_AT, gso_size)
            opts.ctx_in, opts.ctx_size_in = ffi.from_buffer(ctx), len(ctx)
        inp = ffi.from_buffer(data)
        out = ffi.new("char[]", len(data) + 4096)
        opts.data_in, opts.data_size_in = inp, len(data)
        opts.data_out, opts.data_size_out = out, len(out)
        opts.repeat = 1
        check(self._lib.bpf_prog_test_run_opts(self.prog_fd[prog], opts), f"test run of {prog}")
        return opts.retval, ffi.buffer(out, opts.data_size_out)[:]

    def close(self) -> None:
        self.detach()
        if self._obj is not None:
            self._lib.bpf_object__close(self._obj)
            self._obj = None

    def __enter__(self) -> "KernelPath":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

