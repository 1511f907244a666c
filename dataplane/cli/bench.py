"""`flannel-udp bench`: packet rates, TCP, latency and cost of this project's
engines side by side with the kernel (direct routing, VXLAN), on one testbed."""
from __future__ import annotations

# Where results go by default when the package is installed rather than run from a checkout.
OUT_OUTSIDE_CHECKOUT = "flannel-udp-bench"

HELP = "measure the C and Python engines against direct routing and kernel VXLAN (root)"
DESCRIPTION = """\
Measure, in one run on one two-host testbed (network namespaces; traffic never
leaves them): direct routing, kernel VXLAN, the C engine and the Python engine.

Per path and UDP payload size (64 and 1400 bytes), named as RFC 2544 / FD.io
CSIT do: the NDR (highest offered rate with no datagram lost) and the PDR (< 0.5 %
loss; what this bench called "no-drop" before), found by bounded bisection; the
flood receive rate and the loss at flood; round-trip latency (p50, p90, p99,
p99.9, max and the sample count) under half the path's PDR; and for the engines
the CPU time and syscalls per forwarded packet. Per path, with size null: TCP
(iperf3: one stream, four streams, the reverse direction) and the idle round
trip. Then every path again, its latency at one common load: the lowest NDR of
the run, a rate every path carried whole. Figures are the median of the
trials; the table shows [min-max]. Ratios compare each engine to kernel VXLAN
and to direct routing from the same run, with a 95 % interval from the trials
(full run; "~" marks one that includes 1.0). Inner IPv6 (--paths c6,python6,vxlan6,
beside c,python,vxlan): the same measures between the hosts' IPv6 addresses over
the same IPv4 underlay, each path's figures divided by its IPv4 twin's (c6 / c).

The full run (5 trials) of four paths takes about 10 minutes (613-638 s measured
here); --quick (1 trial) about a minute. See
perf/README.md for the method and how to read the plot."""


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="one trial, short probes, no ratio intervals: about a minute")
    p.add_argument("--json", action="store_true",
                   help='print one JSON object {"rows", "ratios", "machine"} on stdout '
                        "instead of the table")
    p.add_argument("--out", metavar="DIR",
                   help="write results.json and bench.png into DIR (default: perf/out "
                        f"of a source checkout, else ./{OUT_OUTSIDE_CHECKOUT}; none with --json)")
    p.add_argument("--paths", default="direct,vxlan,c,python",
                   help="comma-separated paths (default: direct,vxlan,c,python); inner IPv6: "
                        "c6, python6 and vxlan6, each its IPv4 twin with a dual-stack config "
                        "(flannel0 or flannel.1 with an IPv6 address too, the peer's IPv6 /64 "
                        "routed) and the traffic between the hosts' IPv6 addresses, reported "
                        "as IPv6 / IPv4 of the same path (c6 / c) and the engines beside "
                        "vxlan6; also c-base "
                        "(C engine, one queue, no offloads) and c-offload (one queue, offloads "
                        "where the kernel has them), to measure the C engine's steps; "
                        "c-coalesce20 and python-coalesce20 (20 us coalescing), c-rt and "
                        "python-rt (real-time loop threads), c-rt-coalesce20/30/50/100 (real-time "
                        "with coalescing: the latency trade-off, perf/README.md); c-direct: "
                        "two `flannel-udp run --engine c` daemons over an etcd with DirectRouting "
                        "on (the same flow as direct, routed by the daemons); flanneld: the real "
                        "flanneld's udp backend on both hosts over an etcd (needs --flanneld, "
                        "skipped without it); kernel-flanneld: `flannel-udp run --engine "
                        "kernel` on host A beside that flanneld on host B (the same --flanneld)")
    p.add_argument("--flanneld", metavar="PATH",
                   help="the flanneld binary the flanneld and kernel-flanneld paths run (not part of this project; "
                        "figures of that path are that flanneld's udp backend on this testbed)")
    p.add_argument("--trials", type=int, default=None,
                   help="trials per measurement (default: 5, or 1 with --quick; ratio "
                        "intervals need 3 or more)")
    p.add_argument("--batch", type=int, default=None,
                   help="engine batch size passed to `flannel-udp forward` (default: its own)")
    p.add_argument("--routes", type=int, default=0, metavar="N",
                   help="load N more routes (peers that never send, as in an N-node cluster) "
                        "into the engines' tables, to measure the data path at scale "
                        "(default 0: one route per host)")
    p.add_argument("--forwarders-together", action="store_true",
                   help="run both hosts' forwarders on host B's core, leaving host A's core to "
                        "the generator: for when the default layout's generator is the limit "
                        "(rates marked >=); rates are then not comparable with a default run's, "
                        "ratios within the run are (perf/README.md#forwarders-together)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def choose_paths(spec: str, flanneld: str | None) -> list[str]:
    """The paths of ``--paths``, checked with ``--flanneld``; ValueError says what is wrong.
    Without --flanneld the flanneld path is still chosen: the run skips it, with the reason."""
    from dataplane.bench.daemon_paths import flanneld_problem
    from dataplane.bench.paths import ALL_PATHS
    paths = [p.strip() for p in spec.split(",") if p.strip()]
    bad = [p for p in paths if p not in ALL_PATHS]
    if bad or not paths:
        raise ValueError(f"unknown path(s) {', '.join(bad) or '(none)'}; "
                         f"choose from {', '.join(ALL_PATHS)}")
    problem = flanneld_problem(flanneld) if flanneld is not None else None
    if problem:
        raise ValueError(f"--flanneld {problem}: give the path of an executable flanneld")
    return paths


def main(args) -> int:
    import json
    import logging
    import os
    import sys

    from . import missing_extra
    from .interrupt import signals_interrupt
    if missing_extra("bench", "bench", ("rich", "matplotlib")):
        return 2
    from dataplane.host.atomicfile import write_atomic
    from dataplane.bench import build, report, runner

    if os.geteuid() != 0:
        print("flannel-udp bench: needs root (network namespaces, TUN devices)", file=sys.stderr)
        return 2
    try:
        paths = choose_paths(args.paths, args.flanneld)
    except ValueError as e:
        print(f"flannel-udp bench: {e}", file=sys.stderr)
        return 2
    if args.trials is not None and not 1 <= args.trials <= 20:
        print("flannel-udp bench: --trials must be 1..20", file=sys.stderr)
        return 2
    from dataplane.bench.paths import FILLER_MAX
    if not 0 <= args.routes <= FILLER_MAX:
        print(f"flannel-udp bench: --routes must be 0..{FILLER_MAX}", file=sys.stderr)
        return 2
    if args.quiet:
        logging.getLogger().setLevel(logging.WARNING)
    profile = runner.QUICK if args.quick else runner.FULL
    progress = runner.Progress(quiet=args.quiet)
    out_dir = args.out
    if out_dir is None and not args.json:
        out_dir = str(build.PERF_DIR / "out") if build.in_checkout() else OUT_OUTSIDE_CHECKOUT
    try:
        with signals_interrupt():
            result = runner.run(paths=paths, profile=profile, trials=args.trials,
                                batch=args.batch, routes=args.routes, progress=progress,
                                flanneld=args.flanneld,
                                forwarders_together=args.forwarders_together)
    except build.SetupError as e:
        print(f"flannel-udp bench: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nflannel-udp bench: interrupted: everything it started has been removed",
              file=sys.stderr)
        return 130
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        write_atomic(os.path.join(out_dir, "results.json"), json.dumps(result, indent=1) + "\n")
        report.plot(result, os.path.join(out_dir, "bench.png"))
        progress(f"wrote {os.path.join(out_dir, 'results.json')} and bench.png")
    if args.json:
        json.dump(report.public(result), sys.stdout)
        sys.stdout.write("\n")
    else:
        report.print_table(result)
    progress(f"done in {progress.elapsed:.0f}s")
    return 1 if result["machine"].get("errors") else 0
