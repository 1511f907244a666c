"""What the demo starts and stops, in the order it starts it.

etcd and two ``flannel-udp run`` daemons with ``--trace`` (an :class:`Overlay`), a workload
namespace per host (``lab.py``), the wire tap on A's underlay veth, the UDP echo service in B's
workload; later, both daemons again with the other engine. Which engine runs is the project's one
choice (``engine/choice.py``), as the daemon itself makes it; ``--engine kernel`` puts the kernel
path's programs in front of it in both daemons. Reading what the overlay then holds
is ``facts.py``.
"""
from __future__ import annotations

import logging
import os
import time

from ..engine.choice import (EngineChoiceError, EngineUnavailable, c_available, c_import_error,
                             choose_engine)
from ..testbed.overlay import DEFAULT_NETWORK, Overlay, OverlayError
from . import facts, lab, readings
from .errors import DemoError

log = logging.getLogger(__name__)

ECHO_SECONDS = 50               # the echo service outlives any run of the story


class KernelPathUnavailable(DemoError):
    """--engine kernel where the programs cannot load here (the reason, and what to do)."""


def engine_kind(requested: str) -> str:
    """The engine both daemons run for ``--engine requested`` (c, python, auto; kernel: the
    kernel path, once its programs have loaded here as the daemons will load them)."""
    try:
        choice = choose_engine(requested, kernel=requested == "kernel")
    except EngineUnavailable as e:
        if requested == "kernel":
            raise KernelPathUnavailable(str(e)) from None
        raise DemoError(str(e)) from None
    except EngineChoiceError as e:
        raise DemoError(str(e)) from None
    if choice.kernel is not None:
        choice.kernel.close()          # only a probe: each daemon loads its own
        return "kernel"
    return choice.cls.name


def slow_engine(engine: str) -> str:
    """The engine that forwards what the kernel path hands on (the daemon's choice for kernel)."""
    return choose_engine("kernel").cls.name if engine == "kernel" else engine


def engines_to_compare(engine: str, compare: bool) -> tuple[list, dict]:
    """The engines the batching measurement runs, the story's first, and why one is left out."""
    engines, skipped = [engine], {}
    if compare and engine != "kernel":
        other = "python" if engine == "c" else "c"
        if other == "python" or c_available():
            engines.append(other)
        else:
            skipped["c"] = f"the C engine is not built ({c_import_error()})"
    return engines, skipped


IPV6_NETWORK = "fc00:5::/56"    # demo --ipv6: the config's IPv6Network (a /64 per host)


def start_overlay(engine: str, direct: bool, ipv6: bool = False) -> Overlay:
    """etcd and two daemons, ready; --trace switches on the engines' trace rings and serves them
    at /debug/trace. ``ipv6``: a dual-stack config (EnableIPv6), the namespaces with IPv6 on."""
    config = None
    if direct or ipv6:
        config = {"Network": DEFAULT_NETWORK, "Backend": {"Type": "udp"}}
        if direct:
            config["Backend"]["DirectRouting"] = True
        if ipv6:
            config.update(EnableIPv6=True, IPv6Network=IPV6_NETWORK)
    if engine != "kernel":
        return Overlay(hosts=2, engine=engine, daemon_args=("--trace",), config=config, ipv6=ipv6)
    try:
        return Overlay(hosts=2, engine=engine, daemon_args=("--trace",), config=config)
    except OverlayError as e:
        # The programs loaded here, but a daemon could not attach them in its namespace: forced
        # with --engine kernel, it exits with the reason, which is this demo's reason too.
        raise KernelPathUnavailable(f"--engine kernel: the daemons did not start with it: {e}") \
            from None


def wait_direct_routes(ov, timeout: float = 10.0) -> None:
    """Each daemon routes the other's subnet via its PublicIP once it has seen its lease."""
    a, b = ov.hosts
    want = [(h, f"{ov.subnet(p)} via {p.ip} dev {h.iface}") for h, p in ((a, b), (b, a))]
    end = time.monotonic() + timeout
    while True:
        missing = [(h, r) for h, r in want if not readings.has_route(facts.routes(ov, h), r)]
        if not missing:
            return
        if time.monotonic() > end:
            h, route = missing[0]
            said = [f"Subnet added: {p}" for p in readings.peers_added(ov.daemon(h).log_text())]
            raise DemoError(f"DirectRouting: host {h.name} has no route '{route}' after "
                            f"{timeout:.0f} s; its daemon says: {said[-2:] or 'no Subnet added'}")
        time.sleep(0.05)


def add_workloads(ov, subnet_envs: dict, into: dict) -> None:
    """A workload per host, addressed from its subnet.env (as dockerd --bip), put ``into`` the
    caller's dict as each is made, so that a failure midway still removes the first."""
    for (role, h), name in zip(zip("AB", ov.hosts), ("wa", "wb")):
        into[role] = lab.add_workload(ov, h, name, subnet_envs[role])


def start_tap(ov, port: int, wa, wb, direct: bool) -> lab.Tap:
    """The tap on A's underlay veth: the outer datagrams, or on the direct path the workloads'
    own packets."""
    return lab.Tap(ov, ov.hosts[0], port, os.path.join(ov.tb.workdir, "tap.jsonl"),
                   between=(wa.ip, wb.ip) if direct else ())


def start_echo(ov, wb) -> str:
    """The UDP echo service in B's workload; returns the file it logs each datagram to."""
    path = os.path.join(ov.tb.workdir, "echo.out")
    p = wb.popen([lab.PY, "-c", lab.UDP_ECHO, str(lab.ECHO_PORT), str(ECHO_SECONDS)], path)
    if not lab.wait_file_line(path, "ready", proc=p):
        raise DemoError("the UDP echo service in B's workload did not start")
    return path


def warm_up(wa, wb) -> None:
    # One ping first, so that ARP (and IPv6 neighbour discovery) in the workload namespaces is
    # done before we watch.
    wa.run(["ping", "-n", "-q", "-c", "1", "-W", "2", wb.ip], timeout=10)
    if wa.ip6 and wb.ip6:
        wa.run(["ping", "-6", "-n", "-q", "-c", "1", "-W", "2", wb.ip6], timeout=10)


def switch_engine(ov, kind: str, wa, wb, timeout: float = 15.0) -> None:
    """Both daemons again with the ``kind`` engine (the leases stay), until the path carries."""
    for h in ov.hosts:
        ov.restart_daemon(h, engine=kind)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if wa.run(["ping", "-n", "-q", "-c", "1", "-W", "1", wb.ip], timeout=5).returncode == 0:
            return
    raise DemoError("the overlay did not carry packets again after the engine switch")


def teardown(ov, tap, workloads: dict, on_progress) -> None:
    """Remove all of it, each part even when another fails: tap, workloads, daemons, etcd,
    namespaces."""
    if tap is not None:
        try:
            tap.stop()
        except Exception as e:
            log.warning("wire tap: %s", e)
    for w in list(workloads.values()):
        try:
            lab.remove_workload(w)
        except Exception as e:
            log.warning("workload %s: %s", w.name, e)
    if ov is not None:
        on_progress("tearing down: daemons, etcd, namespaces ...")
        ov.close()
