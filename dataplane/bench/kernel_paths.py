"""The bench's ``kernel`` and ``kernel6`` paths: the kernel path (csrc/bpf/) on both hosts.

Each host runs the C engine's ``flannel-udp forward`` exactly as the ``c`` path does (``c6``
for ``kernel6``), as the slow path, and the tc programs on its flannel0's egress and its veth's
ingress, their maps filled by KernelPath from the same route as the engine's ``--route``. What
the programs carry never reaches the engines; what they hand on (counted by reason) does. The
counters of both are in the report: the engine's per host, and the programs' as ``bpf_*``.

Where the programs cannot load (no clang, no libbpf, not root, a kernel that refuses them) the
path is skipped with the loader's reason; the rest of the bench runs on.

Over a veth a TCP super-packet the egress program encapsulated whole (SKB_GSO_UDP_TUNNEL)
arrives whole at the peer. Where the kernel cannot clear the tunnel's GSO bits when the
ingress program decapsulates (no BPF_F_ADJ_ROOM_DECAP_L4_UDP: Linux 6.18), the program hands it
on and the peer's socket would truncate it; so on such a kernel each host's veth cuts them
itself (``tx-udp_tnl-segmentation off``, as a NIC without tunnel segmentation does in
software), put back at teardown. docs/kernel-path.md has the details.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import socket

from ..engine.api import Route
from .paths import FLANNEL_PORT, EnginePath, PathSkipped
from .topo import BenchTopo, Side

CLONE_NEWNET = 0x40000000


@contextlib.contextmanager
def in_netns(name: str):
    """This thread in network namespace ``name`` (netlink, ifindexes, the programs' hooks),
    then back in its own."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name}")
        try:
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(home)
        os.close(target)


class KernelBenchPath(EnginePath):
    """The C engine's path plus the programs on each host. Its forwarders' cost is counted as
    the engines' (what they still carry, nothing if the programs take it all)."""

    def __init__(self, topo: BenchTopo, family: int = 4, **kw):
        super().__init__(topo, "c", name="kernel6" if family == 6 else "kernel", family=family,
                         **kw)
        self.kps: dict[str, object] = {}
        self.cut = False        # the veths' tunnel segmentation turned off (to put back)

    def _programs(self, side: Side):
        from ..engine.bpf_path import KernelPath
        peer = self.topo.peer(side)
        routes = [Route.make(str(peer.subnet), peer.ip, FLANNEL_PORT)]
        if self.family == 6:
            routes.append(Route.make(str(peer.subnet6), peer.ip, FLANNEL_PORT))
        with in_netns(side.host.netns):
            kp = KernelPath()
            try:
                kp.configure(own_ip=side.ip, port=FLANNEL_PORT, mtu=self.mtu(),
                             own_subnets=[side.subnet] + ([side.subnet6] if self.family == 6 else []))
                kp.set_routes(routes)
                kp.set_local([side.ip, side.tun_ip, side.app_ip] +
                             ([side.tun_ip6, side.app_ip6] if self.family == 6 else []))
                kp.attach(socket.if_nametoindex("flannel0"), socket.if_nametoindex(side.iface))
            except BaseException:
                kp.close()
                raise
        return kp

    def _segmentation(self, on: bool) -> None:
        for side in self.topo.sides:
            side.run(["ethtool", "-K", side.iface, "tx-udp_tnl-segmentation",
                      "on" if on else "off"], check=False)

    def setup(self) -> None:
        from ..engine.bpf_build import BpfBuildError
        from ..engine.bpf_lib import BpfLibError
        from ..engine.bpf_kernel import kernel_decaps_gso
        from ..engine.bpf_path import KernelPathError
        super().setup()
        try:
            self.cut = not kernel_decaps_gso()
            if self.cut:
                self._segmentation(False)
            for side in self.topo.sides:
                self.kps[side.name] = (side.host.netns, self._programs(side))
        except (KernelPathError, BpfBuildError, BpfLibError) as e:
            self.teardown()
            # the verifier's log can run long: its first lines say why
            why = "\n".join(str(e).splitlines()[:4])[:600]
            raise PathSkipped(f"the kernel path's programs do not load or attach here: {why}") \
                from None
        except BaseException:
            self.teardown()
            raise

    def teardown(self) -> None:
        for netns, kp in self.kps.values():
            with in_netns(netns):
                kp.close()
        self.kps.clear()
        if self.cut:
            self._segmentation(True)
            self.cut = False
        super().teardown()

    def counters(self, after: float | None = None, timeout: float = 3.0) -> dict:
        out = super().counters(after, timeout)
        for name, (_, kp) in self.kps.items():
            moved = {f"bpf_{k}": v for k, v in kp.counters().items() if v}
            out.setdefault(name, {}).update(moved)
        return out
