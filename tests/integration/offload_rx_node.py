"""One host of the RX offload tests (tests/integration/test_offload_rx_netns.py),
run inside its namespace: ``python -m tests.integration.offload_rx_node MODE ...``.

``rx`` (host B): the engine under test on flannel0, a TUN opened with
IFF_VNET_HDR, its UDP socket (port 8285) with UDP_GRO, offloads as given.
It only receives: B's packets back to A leave through flannel1, a plain
TUN with a plain C engine on port 8286 (route PEER_SUBNET dev flannel1;
rp_filter off, as the two directions use two devices). So B's return path
does not depend on TUN reads with a vnet header, which belong to the
transmit half of the offloads.

``gso-relay`` (host A): a Python stand-in for a sender with UDP GSO. It reads
its TUN until EAGAIN and sends each run of equal-sized packets to the peer
in one sendmsg with UDP_SEGMENT (a shorter last one included), so B's
socket receives trains - the datagrams on the wire are exactly flanneld's,
one IP packet each. Datagrams it receives are written to its TUN.

Every mode writes its counters as JSON to --stats at exit (SIGTERM) and
creates --ready once it forwards.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import struct
import threading

from dataplane.host.atomicfile import write_atomic

SOL_UDP, UDP_SEGMENT, UDP_GRO = 17, 103, 104
SOCKBUF = 4 << 20
MTU = 1472
TRAIN_MAX = 40           # 40 * 1472 < 65507: one UDP payload


def _sock(ip: str, port: int, gro: bool = False) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for opt in (32, 33):   # SO_SNDBUFFORCE, SO_RCVBUFFORCE
        s.setsockopt(socket.SOL_SOCKET, opt, SOCKBUF)
    if gro:
        s.setsockopt(SOL_UDP, UDP_GRO, 1)
    s.bind((ip, port))
    return s


def _hostport(v: str) -> tuple[str, int]:
    h, _, p = v.rpartition(":")
    return h, int(p)


def _sysctl(key: str, value: str) -> None:
    with open(f"/proc/sys/net/ipv4/{key}", "w") as f:
        f.write(value)


def run_rx(a, stop: threading.Event) -> dict:
    from dataplane.host import netconf
    from dataplane.engine import OFF_TUN_VNET, OFF_UDP_GRO, Route, create_engine
    from dataplane.host.tun import open_tun

    peer_ip, peer_port = _hostport(a.peer)
    fds, socks, engines = [], [], {}
    try:
        fd0, _ = open_tun("flannel0", vnet_hdr=bool(a.offloads & OFF_TUN_VNET))
        fds.append(fd0)
        netconf.configure_tun("flannel0", f"{a.addr}/32", MTU)
        fd1, _ = open_tun("flannel1")
        fds.append(fd1)
        netconf.configure_tun("flannel1", f"{a.addr2}/32", MTU)
        netconf.add_network_route(a.peer_subnet, "flannel1")
        for key in ("all", "default", "flannel0", "flannel1"):
            _sysctl(f"conf/{key}/rp_filter", "0")
        s0 = _sock(a.underlay, 8285, gro=bool(a.offloads & OFF_UDP_GRO))
        s1 = _sock(a.underlay, 8286)
        socks += [s0, s1]
        route = [Route.make(a.peer_subnet, peer_ip, peer_port)]
        for name, fd, s, off, kind in (("rx", fd0, s0, a.offloads, a.engine),
                                       ("back", fd1, s1, 0, "c")):
            e = create_engine(kind, tun_fd=fd, udp_fd=s.fileno(), tun_addr=a.addr, mtu=MTU,
                        batch=64, accept_any=True)
            if off:
                e.set_offloads(off)
            e.set_icmp_limit(0, 1)
            e.set_routes(route)
            engines[name] = e
        for e in engines.values():
            e.start()
        open(a.ready, "w").close()
        stop.wait()
        for e in engines.values():
            e.stop()
            e.join(5)
        return {name: e.stats() for name, e in engines.items()}
    finally:
        for e in engines.values():
            e.close()
        for s in socks:
            s.close()
        for fd in fds:
            os.close(fd)


def run_gso_relay(a, stop: threading.Event) -> dict:
    from dataplane.host import netconf
    from dataplane.host.tun import open_tun

    peer = _hostport(a.peer)
    st = {"tun_packets": 0, "trains": 0, "train_datagrams": 0, "sends": 0, "send_errors": 0,
          "udp_packets": 0, "tun_write_errors": 0}
    fd, _ = open_tun("flannel0")
    s = None
    try:
        netconf.configure_tun("flannel0", f"{a.addr}/32", MTU)
        netconf.add_network_route(a.network, "flannel0")
        s = _sock(a.underlay, 8285)
        s.setblocking(False)
        ep = select.epoll()
        ep.register(fd, select.EPOLLIN)
        ep.register(s.fileno(), select.EPOLLIN)
        open(a.ready, "w").close()

        def send(run: list[bytes]) -> None:
            anc = [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", len(run[0])))] if len(run) > 1 else []
            try:
                s.sendmsg([b"".join(run)], anc, 0, peer)
                st["sends"] += 1
                if len(run) > 1:
                    st["trains"] += 1
                    st["train_datagrams"] += len(run)
            except OSError:
                st["send_errors"] += 1

        while not stop.is_set():
            for rfd, _ in ep.poll(0.2):
                if rfd == fd:
                    pkts = []
                    while len(pkts) < 256:
                        try:
                            pkts.append(os.read(fd, 65536))
                        except BlockingIOError:
                            break
                    st["tun_packets"] += len(pkts)
                    run: list[bytes] = []
                    for p in pkts:
                        # a run: equal sizes, a shorter one may end it
                        if run and (len(p) > len(run[0]) or len(run[-1]) < len(run[0])
                                    or len(run) == TRAIN_MAX):
                            send(run)
                            run = []
                        run.append(p)
                    if run:
                        send(run)
                else:
                    while True:
                        try:
                            d = s.recv(65536)
                        except BlockingIOError:
                            break
                        st["udp_packets"] += 1
                        try:
                            os.write(fd, d)
                        except OSError:
                            st["tun_write_errors"] += 1
        return {"relay": st}
    finally:
        if s is not None:
            s.close()
        os.close(fd)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("rx", "gso-relay"))
    p.add_argument("--addr", required=True)          # TUN address (lease network)
    p.add_argument("--addr2", default=None)          # rx: flannel1's address
    p.add_argument("--underlay", required=True)
    p.add_argument("--peer", required=True)          # IP:PORT of the other host
    p.add_argument("--peer-subnet", default=None)    # rx: the other host's lease
    p.add_argument("--network", default="10.5.0.0/16")
    p.add_argument("--offloads", type=int, default=0)
    p.add_argument("--engine", default="c")          # rx: the engine under test
    p.add_argument("--stats", required=True)
    p.add_argument("--ready", required=True)
    a = p.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stats = (run_rx if a.mode == "rx" else run_gso_relay)(a, stop)
    write_atomic(a.stats, json.dumps(stats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
