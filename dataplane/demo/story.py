"""The demo's story: a real two-host overlay, one ping and one UDP packet, followed.

Every number the demo shows is read from the running system while it runs:

====================  =========================================================
what                  where it comes from
====================  =========================================================
leases, config        etcd (``etcdctl get``), written there by the two daemons
subnet.env, routes    the daemons' files, ``ip route`` / ``ip route get`` per host
engine steps          the engines' trace rings (``GET /debug/trace`` on each
                      daemon, started with ``--trace``): TUN_READ, ROUTE_HIT,
                      UDP_SEND, UDP_RECV, TUN_WRITE - recorded by the same loop
                      that forwards, so the demo shows what the daemon does
syscalls, bytes       the engine counters on each daemon's ``GET /metrics``
the programs          with ``--engine kernel``: their counters on the same
                      ``/metrics`` (``datapath="kernel"``, kernel_readings.py)
the outer datagram    an AF_PACKET tap on host A's underlay veth (the "wire")
====================  =========================================================

:class:`Demo` runs the story and hands each finished step to ``on_step`` (the
renderer), so a classroom can pause between steps (``--step``); ``run()``
returns the whole trace as one JSON-able dict. Teardown is in ``finally``:
daemons, etcd, namespaces and probes go, also on Ctrl-C or an error.

It only puts the parts in order: ``bringup.py`` starts and stops what the
story runs on, ``facts.py`` reads what the overlay holds, ``probes.py`` sends
the probes and measures around them, ``trace.py`` follows the packets in the
trace rings, and ``steps.py`` / ``steps_direct.py`` word the steps.
"""
from __future__ import annotations

import time

from . import bringup, facts, kernel_readings, probes, readings, steps, steps_direct, steps_kernel
from . import trace as tr
from .errors import DemoError

__all__ = ["Demo", "DemoError"]


class Demo:
    """One run of the demo. ``on_step(step)`` is called as each step is ready."""

    def __init__(self, engine: str = "auto", *, on_step=None, on_progress=None,
                 compare_engines: bool = True, direct_routing: bool = False, ipv6: bool = False):
        if ipv6 and direct_routing:
            # one story each: the ping6 through the engines, or the IPv4 ping around them
            raise DemoError("--ipv6 follows the ping6 through the engines: not with "
                            "--direct-routing")
        self.engine_req = engine
        # A dual-stack config: the workloads get IPv6 too, and an IPv6 ping is followed as well.
        self.ipv6 = ipv6
        # DirectRouting in the network config: the followed packets take the kernel route
        # host to host, so the story shows that path (and its counters) instead of the engine's.
        self.direct = direct_routing
        self.kernel = False                # --engine kernel: set once the programs load
        self.on_step = on_step or (lambda step: None)
        self.on_progress = on_progress or (lambda text: None)
        self.compare_engines = compare_engines
        self.ov = None
        self.workloads: dict = {}          # role -> lab.Workload, as each is made
        self.tap = None
        self.echo_log = None               # what B's echo service answered (probes.udp reads it)
        self.meter = None
        self.result: dict = {"version": 1, "steps": []}

    def emit(self, step: dict) -> dict:
        """Number a step of steps.py / steps_direct.py, keep it and hand it to the renderer."""
        s = {"id": step["id"], "n": len(self.result["steps"]) + 1}
        s.update(step)
        self.result["steps"].append(s)
        self.on_step(s)
        return s

    def run(self) -> dict:
        t0 = time.monotonic()
        try:
            self._bring_up()
            self._add_workloads()
            self._probe_ping()
            self._probe_udp()
            if self.ipv6:
                self._probe_ping6()
            if self.kernel:
                self._probe_slow()
            self._stop_tap()
            if self.direct:
                self._follow_direct()
            elif self.kernel:
                self._follow_kernel()
            else:
                self._follow()
                self._costs()
        finally:
            self._teardown()
        self.result["duration_s"] = round(time.monotonic() - t0, 2)
        return self.result

    # 1. the overlay ----------------------------------------------------------------------
    def _bring_up(self):
        """etcd, the two daemons and their leases; what they hold becomes the first step."""
        path = bringup.engine_kind(self.engine_req)
        # --engine kernel: the daemons run the tc programs with this engine behind them.
        self.kernel = path == "kernel"
        self.engine = bringup.slow_engine(path)
        self.sc = steps.SYSCALL_NAMES[self.engine]
        self.result.update(engine=self.engine, syscall_names=self.sc)
        if self.kernel:
            self.result["datapath"] = "kernel"
        self.on_progress(f"starting etcd and two daemons (engine {path}) ...")
        t = time.monotonic()
        if self.direct:
            self.result["direct_routing"] = True
        if self.ipv6:
            self.result["ipv6"] = True
        self.ov = bringup.start_overlay(path, self.direct, self.ipv6)
        self.a, self.b = self.ov.hosts
        if self.direct:
            bringup.wait_direct_routes(self.ov)
        startup = round(time.monotonic() - t, 2)
        config, self.port, leases = facts.etcd_contents(self.ov)
        hosts = facts.hosts(self.ov, path, self.port, leases, self.direct)
        self.result.update(network_config=config, leases=leases, hosts=hosts, port=self.port,
                           etcd=self.ov.etcd_url, startup_s=startup)
        self.emit(steps.overlay(self.result, self.a.mtu))

    def _add_workloads(self):
        """A workload per host, the kernels' routing answers for it, then the tap and the echo
        service the probes need."""
        hosts = self.result["hosts"]
        bringup.add_workloads(self.ov, {r: h["subnet_env"] for r, h in hosts.items()},
                              self.workloads)
        wa, wb = self.workloads["A"], self.workloads["B"]
        for role, w in self.workloads.items():
            hosts[role]["workload"] = facts.workload(w)
        facts.kernel_answers(self.ov, hosts, wa, wb, self.direct)
        self.emit(steps.workloads(self.result))
        self.tap = bringup.start_tap(self.ov, self.port, wa, wb, self.direct)
        self.echo_log = bringup.start_echo(self.ov, wb)
        bringup.warm_up(wa, wb)
        self.meter = probes.Meter(self.ov, self.direct)

    # 2. the probes -------------------------------------------------------------------------
    def _probe_ping(self):
        wa, wb = self.workloads["A"], self.workloads["B"]
        self.result["probes"] = {"ping": probes.ping(self.meter, wa, wb)}

    def _probe_ping6(self):
        wa, wb = self.workloads["A"], self.workloads["B"]
        if not (wa.ip6 and wb.ip6):
            raise DemoError("--ipv6: a workload has no IPv6 address (no FLANNEL_IPV6_SUBNET in "
                            "its host's subnet.env)")
        self.result["probes"]["ping6"] = probes.ping6(self.meter, wa, wb)

    def _probe_udp(self):
        wa, wb = self.workloads["A"], self.workloads["B"]
        self.result["probes"]["udp"] = probes.udp(self.meter, wa, wb, self.echo_log)

    def _probe_slow(self):
        wa, wb = self.workloads["A"], self.workloads["B"]
        self.result["probes"]["slow"] = probes.ping_ttl(self.meter, wa, wb, ttl=2)

    def _stop_tap(self):
        frames = self.tap.stop() if self.tap else []
        self.tap = None
        self.result["wire_frames"] = frames

    # 3. following the packets --------------------------------------------------------------
    def _legs(self, probe: str, proto: str, family: int = 4) -> dict:
        """The probe's request and reply found in the trace rings (and on the wire), into its
        window; returns the request."""
        p = self.result["probes"][probe]
        wa, wb = self.workloads["A"], self.workloads["B"]
        ends = (wa.ip6, wb.ip6) if family == 6 else (wa.ip, wb.ip)
        p["request"], p["reply"] = tr.follow_both(p["events"], self.result["wire_frames"],
                                                  ends, (self.a.ip, self.b.ip),
                                                  self.port, proto)
        missing = tr.missing_events(p["request"], p["reply"])
        if missing:
            raise DemoError(f"{probe}: the engines' trace lacks {', '.join(missing)} "
                            f"(events: {p['events']})")
        return p["request"]

    def _follow(self):
        """The ping step by step through both engines, then the UDP datagram in one step."""
        req = self._legs("ping", "icmp")
        hit = req["route_hit"]
        hit["lease"] = readings.lease_for(self.result["leases"], hit["peer"],
                                          req["tun_read"]["packet"]["dst"])
        for build in steps.PING_STEPS:
            self.emit(build(self.result))
        self._legs("udp", "udp")
        self.emit(steps.udp_packet(self.result))
        if self.ipv6:
            req6 = self._legs("ping6", "icmp6", family=6)
            req6["route_hit"]["lease"] = readings.lease_for(
                self.result["leases"], req6["route_hit"]["peer"], req6["tun_read"]["packet"]["dst"])
            self.emit(steps.ping6(self.result))

    # 4. costs -------------------------------------------------------------------------------
    def _costs(self):
        """What the ping cost, a burst per engine to measure batching, the closing table."""
        self.emit(steps.ping_cost(self.result))
        wa, wb = self.workloads["A"], self.workloads["B"]
        engines, skipped = bringup.engines_to_compare(self.engine, self.compare_engines)
        bursts = {}
        for kind in engines:
            if kind != self.engine:
                self.on_progress(f"restarting both daemons with the {kind} engine (the leases "
                                 "stay) ...")
                bringup.switch_engine(self.ov, kind, wa, wb)
            self.on_progress(f"{kind} engine: {probes.BURST_COUNT} datagrams from A's workload "
                             "to B's ...")
            bursts[kind] = probes.burst(self.meter, wa, wb, self.ov.tb.workdir, kind)
        self.result["bursts"] = bursts
        self.emit(steps.batching(self.result, skipped))
        self._summary(steps.summary(self.result))

    def _summary(self, step: dict):
        self.result["summary"] = step["data"]
        self.emit(step)

    # the direct path (--direct-routing) ---------------------------------------------------
    def _follow_direct(self):
        """The probes as the wire tap saw them, plain; the engines idle; the cost."""
        frames = self.result["wire_frames"]
        wa, wb = self.workloads["A"], self.workloads["B"]
        for name, proto in (("ping", "icmp"), ("udp", "udp")):
            p = self.result["probes"][name]
            p["request"], p["reply"] = tr.direct_legs(frames, p, (wa.ip, wb.ip), proto)
        ping = self.result["probes"]["ping"]
        if not ping["request"]["wire"] or not ping["reply"]["wire"]:
            raise DemoError(f"the tap on A's veth did not see the ping between {wa.ip} and "
                            f"{wb.ip} as a plain packet (not routed directly?): "
                            f"{len(frames)} frame(s) between the workloads")
        for build in steps_direct.FOLLOW_STEPS:
            self.emit(build(self.result))
        self._summary(steps_direct.summary(self.result))

    # the kernel path (--engine kernel) -----------------------------------------------------
    def _follow_kernel(self):
        """The probes as the programs' counters and the wire tap saw them; the engines idle; what
        the engine still answers; the cost."""
        frames, port = self.result["wire_frames"], self.port
        wa, wb = self.workloads["A"], self.workloads["B"]
        a, b = (self.a.ip, self.b.ip)
        for name, proto in (("ping", "icmp"), ("udp", "udp"), ("slow", "icmp")):
            p = self.result["probes"][name]
            p["kernel"] = kernel_readings.window_delta(p)
            if name == "slow":
                continue
            p["request"] = {"wire": kernel_readings.wire_leg(frames, (a, b), (wa.ip, wb.ip),
                                                             proto, p["t0"], p["t1"])}
            p["reply"] = {"wire": kernel_readings.wire_leg(frames, (b, a), (wb.ip, wa.ip),
                                                           proto, p["t0"], p["t1"])}
        ping = self.result["probes"]["ping"]
        if not ping["request"]["wire"]:
            raise DemoError(f"the tap on A's veth did not see the ping's datagram to "
                            f"{b}:{port} ({len(frames)} frame(s) in all)")
        for build in steps_kernel.FOLLOW_STEPS:
            self.emit(build(self.result))
        self.emit(steps_kernel.slow_path(self.result))
        self._summary(steps_kernel.summary(self.result))

    # 5. teardown ----------------------------------------------------------------------------
    def _teardown(self):
        bringup.teardown(self.ov, self.tap, self.workloads, self.on_progress)
        self.tap = self.ov = None
        self.result["torn_down"] = True
