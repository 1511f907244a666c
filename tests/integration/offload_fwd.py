"""A forwarder with TUN/UDP offloads, for the offload tests (run inside a host's netns).

`flannel-udp forward` does not take offload options here, so this is the
same set-up (flanneld's TUN configuration, a UDP socket, static routes) with
the TUN opened with IFF_VNET_HDR, TUNSETOFFLOAD, and the engine told so:

  python -m tests.integration.offload_fwd --engine c --offloads 3 \\
      --tun-addr 10.5.1.0/32 --network 10.5.0.0/16 --listen 192.168.77.1:8285 \\
      --route 10.5.2.0/24=192.168.77.2:8285 --stats FILE

--offloads are the engine's OFF_* bits; with OFF_TUN_VNET the TUN gets
TUN_F_CSUM|TUN_F_TSO4, plus TUN_F_USO4|TUN_F_USO6 if the kernel takes them. It prints
"ready <tun offload flags>" once forwarding, writes the counters as JSON to
--stats every 0.2 s and at exit, and stops on SIGTERM.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import socket
import threading

from dataplane.host import netconf, tun
from dataplane.host.atomicfile import write_atomic
from dataplane.engine import OFF_TUN_VNET, Route, create_engine


def probe_tun_offload(fd: int) -> int:
    """The richest TUNSETOFFLOAD set the kernel accepts. USO needs Linux
    >= 6.2, and the kernel takes USO4 only together with USO6 (EINVAL);
    IPv6 super-packets are then dropped as not IPv4, as IPv6 is anyway."""
    base = tun.TUN_F_CSUM | tun.TUN_F_TSO4
    for flags in (base | tun.TUN_F_USO4 | tun.TUN_F_USO6, base):
        try:
            tun.set_offload(fd, flags)
            return flags
        except OSError:
            continue
    raise OSError("TUNSETOFFLOAD refused TUN_F_CSUM|TUN_F_TSO4")


def _write_json(path: str, obj: dict) -> None:
    write_atomic(path, json.dumps(obj))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--offloads", type=int, default=0)
    ap.add_argument("--tun-addr", required=True)
    ap.add_argument("--network", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--route", action="append", default=[])
    ap.add_argument("--mtu", type=int, default=None)
    ap.add_argument("--stats", required=True)
    a = ap.parse_args()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ip, port = a.listen.rsplit(":", 1)
    mtu = a.mtu or netconf.tun_mtu_for_addr(ip)
    vnet = bool(a.offloads & OFF_TUN_VNET)
    fd, name = tun.open_tun("flannel%d", vnet_hdr=vnet)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    engine = None
    try:
        tun_flags = probe_tun_offload(fd) if vnet else 0
        netconf.configure_tun(name, a.tun_addr, mtu)
        netconf.add_network_route(a.network, name)
        for opt in (32, 33):       # SO_SNDBUFFORCE, SO_RCVBUFFORCE
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        sock.bind((ip, int(port)))
        routes = []
        for r in a.route:
            net, hop = r.split("=")
            pip, pport = hop.split(":")
            routes.append(Route.make(net, pip, int(pport)))
        engine = create_engine(a.engine, tun_fd=fd, udp_fd=sock.fileno(),
                               tun_addr=ipaddress.IPv4Interface(a.tun_addr).ip, mtu=mtu)
        engine.set_offloads(a.offloads)
        engine.set_routes(routes)
        engine.start()

        def dump(final: bool) -> None:
            _write_json(a.stats, {"engine": engine.name, "final": final, "mtu": mtu,
                                  "tun_offload": tun_flags, "stats": engine.stats()})

        dump(False)
        print("ready", tun_flags, flush=True)
        while not stop.wait(0.2):
            dump(False)
        engine.stop()
        engine.join(5)
        dump(True)
        return 0
    finally:
        if engine is not None:
            engine.close()
        sock.close()
        os.close(fd)


if __name__ == "__main__":
    raise SystemExit(main())
