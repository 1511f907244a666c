"""`flannel-udp demo`: watch a packet cross the kernel/user boundary, on a real overlay."""
from __future__ import annotations

HELP = "start a two-host overlay and follow one packet across it, step by step"
DESCRIPTION = """\
Start a two-host overlay on simulated hosts (network namespaces): a real etcd,
two `flannel-udp run` daemons with --trace, their leases. Send a ping and a UDP
datagram from a workload on host A to one on host B and follow them with the
engines' own trace events and counters: the kernel route, the TUN read, the
lease lookup, the outer UDP datagram (+28 bytes), the receive and TUN write on
B, the reply; then what it costs (copies, syscalls, batching) compared with
kernel VXLAN and direct routing. Everything is torn down at the end, also on
Ctrl-C. Needs root; about 10 seconds.

  flannel-udp demo                 unattended
  flannel-udp demo --step          wait for Enter between steps (classroom)
  flannel-udp demo --json          the whole trace as one JSON object on stdout
  flannel-udp demo --out DIR       also write DIR/demo.json and DIR/path.svg
  flannel-udp demo --direct-routing
                                   the network config says "DirectRouting": true: follow
                                   the packet on the kernel route host to host instead
  flannel-udp demo --ipv6          a dual-stack config (EnableIPv6): also follow an IPv6
                                   ping between the workloads through the engines
  flannel-udp demo --engine kernel the daemons' kernel path (tc programs, the engine behind
                                   them): the same ping, no copy, no crossing; exits 3 with
                                   the reason where the programs cannot load here
"""

#: The exit status of --engine kernel where the kernel path cannot load (the Makefile's demo
#: target then says why and goes on).
KERNEL_UNAVAILABLE = 3


def add_arguments(p) -> None:
    p.add_argument("--engine", choices=("kernel", "c", "python", "auto"), default="auto",
                   help="engine of both daemons for the story (default: auto = c if built); "
                        "the batching measurement runs both engines; kernel: the kernel path's "
                        "tc programs in front of the engine (exit 3 where they cannot load)")
    p.add_argument("--step", action="store_true", help="wait for Enter between steps")
    p.add_argument("--json", action="store_true",
                   help="print the trace as one JSON object on stdout (no other output there)")
    p.add_argument("--out", metavar="DIR",
                   help="write demo.json and an SVG diagram of the path (path.svg) to DIR")
    p.add_argument("--direct-routing", action="store_true",
                   help='put "DirectRouting": true in the network config and show the packet '
                        "routed host to host by the kernels (flannel0 and the engines idle) "
                        "instead of through the engines")
    p.add_argument("--ipv6", action="store_true",
                   help='put "EnableIPv6": true in the network config (IPv6Network fc00:5::/56), '
                        "give the workloads IPv6 addresses from FLANNEL_IPV6_SUBNET and follow "
                        "an IPv6 ping through the engines too, over the IPv4 underlay (not with "
                        "--direct-routing)")
    p.add_argument("--one-engine", action="store_true",
                   help="measure batching with the chosen engine only (skip the switch)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the testbed does")


def _prerequisites() -> list[str]:
    import os
    import shutil
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, TUN devices): run it with sudo")
    if not os.path.exists("/dev/net/tun"):
        missing.append("/dev/net/tun")
    for binary, pkg in (("etcd", "etcd-server"), ("etcdctl", "etcd-client"), ("ip", "iproute2"),
                        ("ping", "iputils-ping"), ("ss", "iproute2")):
        if shutil.which(binary) is None:
            missing.append(f"{binary} (apt-get install {pkg})")
    return missing


def main(args) -> int:
    import json
    import logging
    import os
    import sys

    from . import missing_extra
    from .interrupt import signals_interrupt
    if missing_extra("demo", "demo", ("rich",)):
        return 2
    from ..demo.render import Renderer, make_console
    from ..demo.bringup import KernelPathUnavailable
    from ..demo.story import Demo, DemoError

    if not args.verbose:
        # The daemons log to their own files; here only warnings would distract.
        logging.getLogger("dataplane").setLevel(logging.WARNING)
    missing = _prerequisites()
    if missing:
        print("flannel-udp demo needs: " + "; ".join(missing), file=sys.stderr)
        return 2
    if args.engine == "kernel" and (args.ipv6 or args.direct_routing):
        print("flannel-udp demo: --engine kernel follows the IPv4 ping through the tc programs: "
              "not with --ipv6 or --direct-routing", file=sys.stderr)
        return 2
    if args.ipv6 and args.direct_routing:
        print("flannel-udp demo: --ipv6 follows the IPv6 ping through the engines, and "
              "--direct-routing follows the IPv4 one around them: use one or the other",
              file=sys.stderr)
        return 2

    if args.engine == "kernel":
        # Before any output: where the programs cannot load, the reason is all there is to say.
        from ..demo.bringup import engine_kind
        try:
            engine_kind("kernel")
        except KernelPathUnavailable as e:
            print(f"flannel-udp demo {e}", file=sys.stderr)
            return KERNEL_UNAVAILABLE
    if args.json:
        # stdout carries exactly one JSON object; the story's progress goes to stderr.
        err = make_console(sys.stderr)
        renderer = None
        demo = Demo(args.engine, on_progress=lambda t: err.print(f"... {t}", style="dim"),
                    compare_engines=not args.one_engine, direct_routing=args.direct_routing,
                    ipv6=args.ipv6)
    else:
        renderer = Renderer(make_console(), pause=args.step)
        demo = Demo(args.engine, on_step=renderer.on_step, on_progress=renderer.progress,
                    compare_engines=not args.one_engine, direct_routing=args.direct_routing,
                    ipv6=args.ipv6)
        renderer.demo = demo
        renderer.c.rule("flannel-udp demo: one packet across the overlay, DirectRouting on"
                        if args.direct_routing else
                        "flannel-udp demo: one packet across the overlay, the kernel path"
                        if args.engine == "kernel" else
                        "flannel-udp demo: one packet across a TUN/UDP overlay",
                        characters="=" if renderer.ascii else "─")

    try:
        with signals_interrupt():
            result = demo.run()
    except KeyboardInterrupt:
        print("\ninterrupted: everything the demo started has been removed", file=sys.stderr)
        return 130
    except KernelPathUnavailable as e:
        print(f"flannel-udp demo {e}", file=sys.stderr)
        return KERNEL_UNAVAILABLE
    except Exception as e:   # DemoError, a daemon that did not come up (OverlayError), ...
        if args.verbose or not isinstance(e, (DemoError, RuntimeError, OSError)):
            import traceback
            traceback.print_exc()
        print(f"demo failed: {e}\n(everything it started has been removed)", file=sys.stderr)
        return 1

    if args.out:
        from ..host.atomicfile import write_atomic
        from ..demo import svg, svg_kernel
        os.makedirs(args.out, exist_ok=True)
        write_atomic(os.path.join(args.out, "demo.json"),
                     json.dumps(result, indent=1, default=_jsonable))
        if not args.direct_routing:      # the diagram draws the path through the engines
            # or through the programs
            (svg_kernel if result.get("datapath") == "kernel" else svg).write(
                result, os.path.join(args.out, "path.svg"))
    if args.json:
        json.dump(result, sys.stdout, default=_jsonable)
        sys.stdout.write("\n")
        return 0
    c = renderer.c
    c.print()
    c.print(f"Torn down (daemons, etcd, namespaces). {result['duration_s']} s in all.",
            style="bold")
    if args.out:
        c.print(f"Wrote {args.out}/demo.json" + ("" if args.direct_routing else
                                                 f" and {args.out}/path.svg"))
    c.print("Again, one step at a time: flannel-udp demo --step   |   the raw trace: "
            "flannel-udp demo --json   |   with the Python engine: --engine python"
            + ("" if args.engine == "kernel" else "   |   the kernel path: --engine kernel"),
            style="dim")
    return 0


def _jsonable(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    return str(v)
