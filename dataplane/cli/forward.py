"""`flannel-udp forward`: the dataplane with a static route table, no etcd.

For tests and measurements: the daemon's dataplane (host/assembly.py: the TUN
set up as the daemon and flanneld do, the UDP sockets, the offloads, the
engines) with the routes from the command line, forwarding until SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import signal
import threading
import time

from ..control.config import DEFAULT_UDP_PORT
from ..host.atomicfile import write_atomic
from ..host import sched
from ..engine.api import (BATCH_MAX, COALESCE_DEFAULT_US, COALESCE_MAX_US, ICMP_BURST_DEFAULT,
                          ICMP_RATE_DEFAULT, Engine,
                          MTU_MAX, MTU_MIN)

HELP = "forward between a TUN device and UDP with static routes (no etcd; for tests and perf)"
DESCRIPTION = """\
Forward packets between a TUN device and a UDP socket with a static route table.

The TUN is created in the current network namespace (run it under
`ip netns exec NS ...` to place it in a test host), gets --tun-addr (the /32
address, e.g. the lease network 10.5.1.0/32), the MTU, link up, and the
route `--network dev <tun>`. No etcd is involved.

example (host 192.168.77.1 with lease 10.5.1.0/24, one peer):
  flannel-udp forward --tun-addr 10.5.1.0/32 --network 10.5.0.0/16 \\
      --listen 192.168.77.1:8285 --route 10.5.2.0/24=192.168.77.2

--queues N runs N TUN queues, N UDP sockets on the --listen address
(SO_REUSEPORT) and N engines, as `flannel-udp run` does.

--engine kernel (or auto where the programs load) puts the kernel path's tc
programs on the TUN's egress and the --listen interface's ingress, the engine
behind them as the slow path.

--stats-file gets, every second and at exit, a JSON object ("kernel": the
programs' counters, with the kernel path):
  {"engine": "c", "tun": "flannel0", "pid": 123, "time": 1700000000.0,
   "final": false, "stats": {"tun_rx_packets": ..., ...},
   "queues": 2, "queue_stats": [{...}, {...}],
   "offload": {"mode": "auto", "flags": 0, "enabled": {...}, "refused": {...}, "why_off": ...}}
"""

log = logging.getLogger("dataplane.forward")
ENCAP_OVERHEAD = 28
SOCKBUF = 4 << 20  # large socket buffers absorb bursts (docs/design.md#lessons)


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = value, str(DEFAULT_UDP_PORT)
    try:
        ip = str(ipaddress.IPv4Address(host))
        p = int(port)
        if not 1 <= p <= 65535:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected IPv4:PORT, e.g. 192.168.77.1:8285")
    return ip, p


def _route(value: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str, int | None]:
    subnet, sep, hop = value.partition("=")
    try:
        if not sep:
            raise ValueError
        net = ipaddress.ip_network(subnet)
        ip, sep, port = hop.partition(":")
        ip = str(ipaddress.IPv4Address(ip))
        p = int(port) if sep else None
        if p is not None and not 1 <= p <= 65535:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected SUBNET=PEER_IP[:PORT], e.g. 10.5.2.0/24=192.168.77.2 "
            "(the subnet may be IPv6, the peer is IPv4)")
    return net, ip, p


def _iface(value: str) -> ipaddress.IPv4Interface:
    try:
        iface = ipaddress.IPv4Interface(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected an IPv4 address, e.g. 10.5.1.0/32")
    return iface


def _network(value: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{value!r}: {e}")


def _iface6(value: str) -> ipaddress.IPv6Interface:
    try:
        return ipaddress.IPv6Interface(value if "/" in value else value + "/128")
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected an IPv6 address, e.g. fc00:5:0:1::/128")


def _network6(value: str) -> ipaddress.IPv6Network:
    try:
        return ipaddress.IPv6Network(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{value!r}: {e}")


def _mtu(value: str) -> int:
    try:
        mtu = int(value)
        if not MTU_MIN <= mtu <= MTU_MAX:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected an MTU in {MTU_MIN}..{MTU_MAX}")
    return mtu


def _count(lo: int):
    def parse(value: str) -> int:
        try:
            n = int(value)
            if not lo <= n < 2 ** 32:
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r}: expected an integer in {lo}..2**32-1")
        return n
    return parse


def _checked(check):
    """An argparse type from a check that takes an int and says why not with ValueError."""
    def parse(value: str) -> int:
        try:
            return check(int(value))
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{value!r}: {e}")
    return parse


_coalesce = _checked(Engine._check_coalesce)
_priority = _checked(sched.check_priority)


def _queues(value: str) -> int:
    from dataplane.host.queues import check
    try:
        n = int(value)
        check(n)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a number of queues ({e})")
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tun-name", default="flannel%d", metavar="NAME",
                   help="TUN device name or template (default: flannel%%d -> flannel0)")
    p.add_argument("--tun-addr", required=True, type=_iface, metavar="IP[/32]",
                   help="the TUN address, flanneld's <lease network>/32 (also the source of ICMP errors)")
    p.add_argument("--network", type=_network, metavar="CIDR",
                   help="the flannel network: adds the route `CIDR dev <tun>` (e.g. 10.5.0.0/16)")
    p.add_argument("--tun-addr6", type=_iface6, metavar="IPV6[/128]",
                   help="also give the TUN this IPv6 address, as the daemon does with a dual-stack "
                        "lease (<IPv6 lease network>/128); TSO6 and USO stay off on the TUN")
    p.add_argument("--network6", type=_network6, metavar="CIDR",
                   help="the IPv6 network: adds the route `CIDR dev <tun>` (needs --tun-addr6)")
    p.add_argument("--listen", required=True, type=_listen, metavar="IP:PORT",
                   help="bind the UDP socket here (the external interface address; port default "
                        f"{DEFAULT_UDP_PORT})")
    p.add_argument("--mtu", type=_mtu,
                   help="TUN MTU (default: MTU of the interface holding the --listen address - 28)")
    p.add_argument("--route", action="append", type=_route, default=[], metavar="SUBNET=PEER_IP[:PORT]",
                   help="packets to SUBNET (IPv4, or IPv6 for inner IPv6) go to PEER_IP:PORT (port "
                        "default: the --listen port); repeatable")
    p.add_argument("--route-file", metavar="PATH",
                   help="more routes, one SUBNET=PEER_IP[:PORT] per line (# comments); for "
                        "tables too long for the command line, e.g. 10,000 peers")
    p.add_argument("--engine", choices=("kernel", "c", "python", "auto"), default=None,
                   help="kernel: the tc programs with the C engine (else Python) as the slow "
                        "path; c, python: that engine alone; auto: the kernel path where its "
                        "programs load and attach, else C if built, else Python (default: "
                        "$DATAPLANE_ENGINE, else auto)")
    p.add_argument("--batch", type=int, default=None, metavar="N",
                   help=f"packets per batch, 1..{BATCH_MAX} (default: the engine's)")
    p.add_argument("--accept-from", choices=("leases", "any"), default="any",
                   help="leases: drop datagrams whose source is no --route peer; any: accept all "
                        "as flanneld (default: any)")
    p.add_argument("--icmp-rate", type=_count(0), default=ICMP_RATE_DEFAULT, metavar="N",
                   help="ICMP errors sent per second at most, as routers limit them; "
                        f"0 = unlimited (default {ICMP_RATE_DEFAULT})")
    p.add_argument("--icmp-burst", type=_count(1), default=ICMP_BURST_DEFAULT, metavar="N",
                   help=f"ICMP errors allowed in a burst above --icmp-rate (default {ICMP_BURST_DEFAULT})")
    p.add_argument("--coalesce-usecs", type=_coalesce, default=COALESCE_DEFAULT_US, metavar="US",
                   help="bounded-delay batching: after a pass that forwarded packets, wait US "
                        "microseconds for more before looking again (fewer wake-ups per packet, "
                        f"up to US more latency); 0..{COALESCE_MAX_US}, 0 = off (default {COALESCE_DEFAULT_US})")
    p.add_argument("--realtime-priority", type=_priority, default=0, metavar="N",
                   help="run the engine loop threads SCHED_FIFO at priority N (1..99), so that a "
                        "forwarder woken by a packet runs at once instead of after a busy "
                        "application's time slice; needs CAP_SYS_NICE; 0 = off (default 0)")
    p.add_argument("--sockbuf", type=int, default=SOCKBUF, metavar="BYTES",
                   help=f"UDP socket send/receive buffer size (default {SOCKBUF})")
    p.add_argument("--queues", type=_queues, default=None, metavar="N",
                   help="TUN queues, UDP sockets (SO_REUSEPORT) and engines, one each per queue "
                        "(default: the number of CPUs, at most 8; 1 = a single queue as flanneld)")
    p.add_argument("--offload", choices=("auto", "off"), default=None,
                   help="kernel offloads for the C engine: auto (TUN TSO/USO, UDP GSO/GRO, what "
                        "this kernel accepts) or off (default: auto)")
    p.add_argument("--stats-file", metavar="PATH",
                   help="write the engine's counters as JSON here every second and at exit")
    p.add_argument("--ready-file", metavar="PATH",
                   help="create this file once forwarding has started")


def read_route_file(path: str) -> list[tuple[ipaddress.IPv4Network, str, int | None]]:
    """The routes of a --route-file; ValueError names the first bad line."""
    routes = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                routes.append(_route(line))
            except argparse.ArgumentTypeError as e:
                raise ValueError(f"line {n}: {e}") from None
    return routes


def _write_json(path: str, obj: dict) -> None:
    write_atomic(path, json.dumps(obj))  # readers never see a half-written file


def main(args: argparse.Namespace) -> int:
    from dataplane.host import netconf
    from dataplane.engine import DEFAULT_BATCH, Route, choose_engine, multi
    from dataplane.host.assembly import AssemblyError, Dataplane, kernel_engine, open_sockets
    from dataplane.host.family import V4, Part
    from dataplane.host.offload import DEFAULT_MODE, Offloads
    from dataplane.host.queues import default_queues

    listen_ip, port = args.listen
    tun_addr = args.tun_addr
    if tun_addr.network.prefixlen != 32:
        log.warning("--tun-addr %s: flanneld uses a /32 (the lease network address)", tun_addr)
    try:
        choice = choose_engine(args.engine, kernel=True)
    except (ImportError, ValueError) as e:
        log.error("%s", e)
        return 2
    cls, why, kpath = choice.cls, choice.why, choice.kernel
    if choice.kernel_why:
        log.info("%s", choice.kernel_why)
    mtu = args.mtu
    if mtu is None:
        try:
            mtu = netconf.tun_mtu_for_addr(listen_ip)
        except OSError as e:
            log.error("cannot find the MTU of the interface holding %s (%s); is --listen an "
                      "address of this namespace? Or pass --mtu", listen_ip, e)
            return 2

    try:
        extra_routes = read_route_file(args.route_file) if args.route_file else []
    except (OSError, ValueError) as e:
        log.error("--route-file %s: %s", args.route_file, e)
        return 2
    if args.network6 is not None and args.tun_addr6 is None:
        log.error("--network6 needs --tun-addr6 (the TUN carries no IPv6 without an address)")
        return 2
    if args.realtime_priority:
        try:
            sched.probe(args.realtime_priority)
        except OSError as e:
            log.error("--realtime-priority %d: %s", args.realtime_priority, e.strerror or e)
            return 2

    stop = threading.Event()

    def on_signal(signum, frame):
        log.info("got %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    dataplane = Dataplane()
    engine = None
    tun_name = "?"
    offloads = Offloads(args.offload or DEFAULT_MODE, cls.name)
    try:
        # The daemon's assembly, so that the bench measures the daemon's data path.
        parts = [Part(args.network, address=tun_addr.with_prefixlen)]
        if args.tun_addr6:
            parts.append(Part(args.network6, address=args.tun_addr6.with_prefixlen))
        dataplane = Dataplane.open(
            offloads, tun_name=args.tun_name, mtu=mtu, queues=args.queues or default_queues(),
            parts=parts,
            sockets={V4: lambda n: open_sockets(listen_ip, port, n, bufsize=args.sockbuf)})
        tun_name, queues = dataplane.tun_name, dataplane.queues
        routes = [Route.make(net, ip, p or port) for net, ip, p in args.route + extra_routes]
        engine = dataplane.engine(cls, tun_addr=tun_addr.ip, mtu=mtu,
                                  batch=args.batch or DEFAULT_BATCH,
                                  accept_any=args.accept_from == "any", icmp_rate=args.icmp_rate,
                                  icmp_burst=args.icmp_burst, coalesce_us=args.coalesce_usecs,
                                  realtime_priority=args.realtime_priority)
        if kpath is not None:
            engine, kpath = kernel_engine(
                engine, kpath, tun_name=tun_name, ext_name=netconf.iface_for_addr(listen_ip),
                own_ip=listen_ip, port=port, required=choice.forced,
                owns_path=True), None
        engine.set_routes(routes)
        engine.start()
        if getattr(engine, "kernel_why", ""):
            why += f"; {engine.kernel_why}"
        log.info("engine %s (%s), %d queue(s); %s %s mtu %d%s; udp %s:%d; %d route(s)%s",
                 engine.name, why, queues, tun_name, tun_addr, mtu,
                 "".join((f", {p.family.name} {p.tun_addr}" if p.family is not V4 else "")
                         + (f", route {p.network} dev {tun_name}" if p.network else "")
                         for p in parts),
                 listen_ip, port, len(routes),
                 "".join(f"\n  {r.subnet} -> {r.peer_ip}:{r.port}" for r in routes))

        def dump(final: bool) -> None:
            if args.stats_file:
                per_queue = engine.queue_stats()
                total = multi.MultiEngine.sum_stats(per_queue)
                kernel = getattr(engine, "kernel_counters", lambda: None)()
                _write_json(args.stats_file, {"engine": engine.name, "tun": tun_name,
                                              **({"kernel": kernel} if kernel is not None else {}),
                                              "pid": os.getpid(), "time": time.time(),
                                              "final": final, "stats": total,
                                              "queues": queues, "queue_stats": per_queue,
                                              "offload": offloads.as_json(
                                                  engine.offloads_in_use())})

        dump(False)
        if args.ready_file:
            write_atomic(args.ready_file, f"{os.getpid()} {engine.name} {tun_name}\n")
        rc = 0
        while not stop.wait(1.0):
            ended = engine.ended()
            if ended:
                log.error("the %s engine's loop ended on its own (queue(s) %s); exiting",
                          engine.name, ", ".join(f"{i}: {why}" for i, why in ended.items()))
                rc = 1
                break
            dump(False)
        engine.stop()
        if not engine.join(5.0):
            log.error("the %s engine did not stop within 5 s", engine.name)
            rc = 1
        dump(True)
        s = engine.stats()
        log.info("stopped: tun->udp %d packets, udp->tun %d packets, drops %s",
                 s.get("udp_tx_packets", 0), s.get("tun_tx_packets", 0),
                 {k: v for k, v in s.items() if k.startswith("drop_") and v} or "none")
        return rc
    except AssemblyError as e:
        log.error("forward setup failed (tun %s): %s", e.tun_name or tun_name, e.error)
        return 1
    except (OSError, ValueError) as e:
        log.error("forward setup failed (tun %s): %s", tun_name, e)
        return 1
    finally:
        if engine is not None:
            engine.close()      # the kernel path's programs detached, its segmentation back
        if kpath is not None:   # loaded, never given to an engine
            kpath.close()
        dataplane.close()   # its last TUN fd removes the (non-persistent) TUN device
