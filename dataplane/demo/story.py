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
the outer datagram    an AF_PACKET tap on host A's underlay veth (the "wire")
====================  =========================================================

:class:`Demo` runs the story and hands each finished step to ``on_step`` (the
renderer), so a classroom can pause between steps (``--step``); ``run()``
returns the whole trace as one JSON-able dict. Teardown is in ``finally``:
daemons, etcd, namespaces and probes go, also on Ctrl-C or an error.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import os
import time

from ..control.config import DEFAULT_UDP_PORT
from . import lab, readings
from . import trace as tr

log = logging.getLogger(__name__)

PING_SIZE = 56                       # ping's default: 56 data + 8 ICMP + 20 IP = 84 bytes
UDP_TEXT = "hello from a workload on host A"
BURST_COUNT = 3000                   # datagrams per engine in the batching measurement
BURST_SIZE = 36                      # UDP payload: 36 + 8 + 20 = a 64-byte IP packet
BURST_CHUNK = 100                    # sent back to back, then a short pause: real traffic is bursty
BURST_GAP_S = 0.002


SYSCALL_NAMES = {"c": {"send": "sendmmsg()", "recv": "recvmmsg()"},
                 "python": {"send": "sendto()", "recv": "recvfrom_into()"}}


class DemoError(RuntimeError):
    pass


def _now() -> float:
    return time.monotonic()


class Demo:
    """One run of the demo. ``on_step(step)`` is called as each step is ready."""

    def __init__(self, engine: str = "auto", *, on_step=None, on_progress=None,
                 compare_engines: bool = True, direct_routing: bool = False):
        self.engine_req = engine
        # DirectRouting in the network config: the followed packets take the kernel route
        # host to host, so the story shows that path (and its counters) instead of the engine's.
        self.direct = direct_routing
        self.on_step = on_step or (lambda step: None)
        self.on_progress = on_progress or (lambda text: None)
        self.compare_engines = compare_engines
        self.ov = None
        self.workloads: dict[str, lab.Workload] = {}
        self.tap = None
        self.result: dict = {"version": 1, "steps": []}

    # -- plumbing ---------------------------------------------------------------------
    def _app_send(self, wa, wb, A) -> None:
        """The first step of every followed ping: the application's own send."""
        self.step("app_send", "ping in A's workload sends an echo request", host="A",
                  side="user -> kernel", syscalls=["sendmsg() by ping"], copies=1,
                  why="The application's own cost, the same on every path: one syscall, and "
                      "its bytes copied into a kernel buffer (an skb).",
                  data={"from": wa.ip, "to": wb.ip, "size": PING_SIZE,
                        "ip_len": PING_SIZE + 28, "route_in_workload":
                            A["route_get_workload"]})

    def step(self, sid: str, title: str, **kw) -> dict:
        s = {"id": sid, "n": len(self.result["steps"]) + 1, "title": title, **kw}
        self.result["steps"].append(s)
        self.on_step(s)
        return s

    def _stats(self, host, raw: dict | None = None) -> dict:
        """The engine counters, as the daemon exports them on GET /metrics."""
        m = self.ov.metrics(host)
        if raw is not None:
            raw.update({k: v for k, v in m.items() if k.startswith("flannel_udp_")})
        return tr.stats_from_metrics(m)

    def _trace(self, host, after: int = 0) -> list:
        # The daemon's GET /debug/trace: the engine's own trace ring, head bytes in hex.
        return self.ov.trace_events(host, after=after)

    def _last_seq(self, host) -> int:
        ev = self._trace(host)
        return ev[-1]["seq"] if ev else 0

    # -- the story ----------------------------------------------------------------------
    def run(self) -> dict:
        t0 = _now()
        try:
            self._setup()
            self._probe_ping()
            self._probe_udp()
            self._stop_tap()
            if self.direct:
                self._follow_direct()
                self._summary_direct()
            else:
                self._follow()
                self._costs()
                self._summary()
        finally:
            self._teardown()
        self.result["duration_s"] = round(_now() - t0, 2)
        return self.result

    # 1. the overlay ----------------------------------------------------------------------
    def _setup(self):
        from ..engine import c_available
        from ..testbed.overlay import Overlay
        engine = self.engine_req
        if engine == "auto":
            engine = "c" if c_available() else "python"
        if engine == "c" and not c_available():
            raise DemoError("--engine c: the C engine is not built (pip install -e . with a C "
                            "compiler), or use --engine python")
        self.engine = engine
        self.result["engine"] = engine
        # The C engine batches the UDP side (one sendmmsg/recvmmsg per batch); Python has
        # neither call, so it makes one sendto()/recvfrom_into() per datagram.
        self.sc = SYSCALL_NAMES[engine]
        self.result["syscall_names"] = self.sc
        self.on_progress(f"starting etcd and two daemons (engine {engine}) ...")
        t = _now()
        # --trace switches on the engine's trace ring and serves it at /debug/trace.
        config = None
        if self.direct:
            from ..testbed.overlay import DEFAULT_NETWORK
            config = {"Network": DEFAULT_NETWORK,
                      "Backend": {"Type": "udp", "DirectRouting": True}}
            self.result["direct_routing"] = True
        self.ov = Overlay(hosts=2, engine=engine, daemon_args=("--trace",), config=config)
        ov = self.ov
        a, b = ov.hosts
        self.a, self.b = a, b
        if self.direct:
            self._wait_direct_routes()
        startup = round(_now() - t, 2)

        prefix = ov.prefix
        r = ov.etcdctl("get", "--prefix", f"{prefix}/")
        lines = r.stdout.splitlines()
        kv = dict(zip(lines[::2], lines[1::2]))
        config = json.loads(kv.get(f"{prefix}/config", "{}"))
        leases = []
        for key, value in kv.items():
            if "/subnets/" in key:
                v = json.loads(value)
                subnet = key.rsplit("/", 1)[1].replace("-", "/")
                leases.append({"key": key, "subnet": subnet, "public_ip": v.get("PublicIP"),
                               "value": v})
        hosts = {}
        for role, h in (("A", a), ("B", b)):
            env = ov.subnet_env(h)
            d = ov.daemon(h)
            hosts[role] = {
                "name": h.name, "netns": h.netns, "underlay_ip": h.ip, "iface": h.iface,
                "subnet": str(ov.subnet(h)), "flannel0": ov.flannel_ip(h),
                "subnet_env": env, "subnet_file": d.subnet_file, "daemon_pid": d.pid,
                "daemon_argv": " ".join(["flannel-udp", *ov.daemon_command(h, engine)]),
                "routes": readings.squeezed_lines(ov.exec(h, ["ip", "route"]).stdout),
                "flannel0_link": readings.flannel0_facts(
                    ov.exec(h, ["ip", "-o", "addr", "show", "flannel0"]).stdout,
                    ov.exec(h, ["ip", "-o", "link", "show", "flannel0"]).stdout),
                "socket": readings.udp_socket_line(ov.exec(h, ["ss", "-uanp"]).stdout,
                                                   config.get("Backend", {}).get("Port", DEFAULT_UDP_PORT)),
                "lease": next((l for l in leases if l["subnet"] == str(ov.subnet(h))), None),
            }
            if self.direct:
                # The daemon's own words per peer, and its /metrics count of peers per mode.
                hosts[role]["peer_log"] = [ln.split("Subnet added: ", 1)[1].strip()
                                           for ln in d.log_text().splitlines()
                                           if "Subnet added: " in ln]
                hosts[role]["peers_by_mode"] = {
                    k.split('mode="', 1)[1].rstrip('"}'): v for k, v in ov.metrics(h).items()
                    if k.startswith('flannel_udp_peers_by_mode{mode="')}
        self.port = int(config.get("Backend", {}).get("Port", DEFAULT_UDP_PORT))
        self.result.update(network_config=config, leases=leases, hosts=hosts, port=self.port,
                           etcd=ov.etcd_url, startup_s=startup)
        self.step("overlay", "A two-host overlay: etcd, two daemons, their leases",
                  side="control plane", host="A+B",
                  why="Each daemon picked its interface, took a lease on a subnet in etcd (key = "
                      "subnet, value = its PublicIP), opened flannel0 (MTU = interface MTU "
                      f"{a.mtu} - 28 = {hosts['A']['flannel0_link'].get('mtu')}), routed the "
                      "whole network into it and wrote subnet.env. The lease table in etcd is "
                      "the overlay's only routing protocol." + (
                          " With DirectRouting each lease also says so, and each daemon routed "
                          "the other's subnet via its PublicIP on the shared link (proto 153), "
                          "more specific than the route into flannel0." if self.direct else ""),
                  data={"leases": leases, "hosts": hosts, "config": config,
                        "startup_s": startup})

        # Workloads: one namespace per host, addressed from subnet.env (as dockerd --bip).
        for role, h, name in (("A", a, "wa"), ("B", b, "wb")):
            w = lab.add_workload(ov, h, name, hosts[role]["subnet_env"])
            self.workloads[role] = w
            hosts[role]["workload"] = {"ip": w.ip, "gateway": w.gateway, "netns": w.netns,
                                       "host_iface": w.host_iface, "mtu": w.mtu}
        wa, wb = self.workloads["A"], self.workloads["B"]
        # The kernel's own answers, before any packet moves.
        hosts["A"]["route_get_workload"] = tr.parse_route_get(
            wa.run(["ip", "route", "get", wb.ip]).stdout)
        hosts["A"]["route_get"] = tr.parse_route_get(ov.exec(a, [
            "ip", "route", "get", wb.ip, "from", wa.ip, "iif", wa.host_iface]).stdout)
        # Direct: the packet reaches the other host on its underlay veth, not out of flannel0.
        b_in, a_in = (b.iface, a.iface) if self.direct else ("flannel0", "flannel0")
        hosts["B"]["route_get"] = tr.parse_route_get(ov.exec(b, [
            "ip", "route", "get", wb.ip, "from", wa.ip, "iif", b_in]).stdout)
        hosts["B"]["route_get_reply"] = tr.parse_route_get(ov.exec(b, [
            "ip", "route", "get", wa.ip, "from", wb.ip, "iif", wb.host_iface]).stdout)
        hosts["A"]["route_get_reply"] = tr.parse_route_get(ov.exec(a, [
            "ip", "route", "get", wa.ip, "from", wb.ip, "iif", a_in]).stdout)
        for role, h in (("A", a), ("B", b)):
            hosts[role]["routes_with_workload"] = readings.squeezed_lines(
                ov.exec(h, ["ip", "route"]).stdout)
        self.step("workloads", "Workloads: one 'container' per host, on FLANNEL_SUBNET",
                  side="kernel", host="A+B",
                  why="A container host puts its workloads on a bridge addressed from "
                      "FLANNEL_SUBNET and forwards between them and flannel0; here one namespace "
                      "per host plays the container.",
                  data={"A": hosts["A"]["workload"], "B": hosts["B"]["workload"]})

        # The wire tap and the echo service.
        self.tap = lab.Tap(ov, a, self.port, os.path.join(ov.tb.workdir, "tap.jsonl"),
                           between=(wa.ip, wb.ip) if self.direct else ())
        echo_out = self.echo_out = os.path.join(ov.tb.workdir, "echo.out")
        p = wb.popen([lab.PY, "-c", lab.UDP_ECHO, str(lab.ECHO_PORT), "50"], echo_out)
        if not lab.wait_file_line(echo_out, "ready", proc=p):
            raise DemoError("the UDP echo service in B's workload did not start")
        # One warm-up ping so that ARP in the workload namespaces is done before we watch.
        wa.run(["ping", "-n", "-q", "-c", "1", "-W", "2", wb.ip], timeout=10)

    # 2. the probes -------------------------------------------------------------------------
    def _window(self, send):
        """Counters and trace cursors before/after ``send()`` on both hosts."""
        a, b = self.a, self.b
        cur = {"A": self._last_seq(a), "B": self._last_seq(b)}
        raw_before, raw_after = {"A": {}, "B": {}}, {"A": {}, "B": {}}
        before = {"A": self._stats(a, raw_before["A"]), "B": self._stats(b, raw_before["B"])}
        if self.direct:
            f0_before = {"A": self._flannel0(a), "B": self._flannel0(b)}
            t0 = _now()
        out = send()
        time.sleep(0.15)             # let the loops finish their EAGAIN reads and polls
        after = {"A": self._stats(a, raw_after["A"]), "B": self._stats(b, raw_after["B"])}
        events = {"A": self._trace(a, cur["A"]), "B": self._trace(b, cur["B"])}
        win = {"result": out, "stats_before": before, "stats_after": after,
               "metrics_before": raw_before, "metrics_after": raw_after,
               "counters": {k: tr.delta(before[k], after[k]) for k in before},
               "events": events, "cursor": cur}
        if self.direct:
            # The kernel's own counters of flannel0: what entered or left the TUN device.
            win["t0"], win["t1"] = t0, _now()
            f0_after = {"A": self._flannel0(a), "B": self._flannel0(b)}
            win["flannel0"] = {k: tr.delta(f0_before[k], f0_after[k]) for k in f0_before}
        return win

    def _probe_ping(self):
        wa, wb = self.workloads["A"], self.workloads["B"]

        def send():
            r = wa.run(["ping", "-n", "-c", "1", "-W", "2", "-s", str(PING_SIZE), wb.ip],
                       timeout=10)
            return readings.parse_ping(r.stdout, r.returncode)
        win = self._window(send)
        win["result"].update(size=PING_SIZE, expected_len=PING_SIZE + 8 + 20)
        self.result.setdefault("probes", {})["ping"] = win
        if not win["result"].get("received"):
            raise DemoError(f"the ping from {wa.ip} to {wb.ip} got no reply: "
                            f"{win['result']}")

    def _probe_udp(self):
        wa, wb = self.workloads["A"], self.workloads["B"]

        def send():
            r = wa.run([lab.PY, "-c", lab.UDP_CLIENT, wb.ip, str(lab.ECHO_PORT), UDP_TEXT],
                       timeout=10)
            try:
                return json.loads(r.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise DemoError(f"UDP probe failed: {r.stdout} {r.stderr}") from None
        win = self._window(send)
        win["result"].update(payload=UDP_TEXT, expected_len=len(UDP_TEXT.encode()) + 8 + 20,
                             dport=lab.ECHO_PORT)
        # What B's application saw: the echo service logs each datagram it answers.
        with open(self.echo_out) as f:
            seen = [ln.split() for ln in f if ln.startswith("echo ")]
        if seen:
            _, ip, port, n = seen[-1]
            win["result"]["app_received"] = {"from": ip, "sport": int(port), "len": int(n)}
        self.result["probes"]["udp"] = win
        if not win["result"].get("received"):
            raise DemoError(f"the UDP packet from {wa.ip} to {wb.ip}:{lab.ECHO_PORT} got no "
                            "echo")

    def _stop_tap(self):
        frames = self.tap.stop() if self.tap else []
        self.tap = None
        self.result["wire_frames"] = frames

    # 3. following the packets --------------------------------------------------------------
    def _legs(self, probe: str, proto: str):
        p = self.result["probes"][probe]
        wa, wb = self.workloads["A"], self.workloads["B"]
        ev = p["events"]
        req = tr.follow(ev["A"], ev["B"], wa.ip, wb.ip, proto)
        rep = tr.follow(ev["B"], ev["A"], wb.ip, wa.ip, proto)
        for leg, s, d in ((req, self.a, self.b), (rep, self.b, self.a)):
            if "tun_read" in leg:
                inner = leg["tun_read"]["packet"]
                leg["outer"] = tr.outer_datagram(leg["tun_read"]["len"], s.ip,
                                                 leg.get("route_hit", {}).get("peer", "?"),
                                                 self.port)
                leg["wire"] = tr.wire_frame_for(self.result["wire_frames"], s.ip, d.ip,
                                                inner["id"], inner["src"])
        p["request"], p["reply"] = req, rep
        missing = [k for k in ("tun_read", "route_hit", "udp_send", "udp_recv", "tun_write")
                   if k not in req or k not in rep]
        if missing:
            raise DemoError(f"{probe}: the engines' trace lacks {', '.join(missing)} "
                            f"(events: {ev})")
        return req, rep

    def _follow(self):
        H = self.result["hosts"]
        A, B = H["A"], H["B"]
        wa, wb = self.workloads["A"], self.workloads["B"]
        req, rep = self._legs("ping", "icmp")
        ping = self.result["probes"]["ping"]
        cA, cB = ping["counters"]["A"], ping["counters"]["B"]
        rd, hit, snd = req["tun_read"], req["route_hit"], req["udp_send"]
        rcv, wr = req["udp_recv"], req["tun_write"]
        lease = next((l for l in self.result["leases"]
                      if l["public_ip"] == hit["peer"]
                      and ipaddress.IPv4Address(rd["packet"]["dst"])
                      in ipaddress.IPv4Network(l["subnet"])), None)
        hit["lease"] = lease

        self._app_send(wa, wb, A)
        self.step("kernel_route", "A's kernel routes it into flannel0", host="A", side="kernel",
                  syscalls=[], copies=0,
                  why="Plain kernel forwarding: the longest prefix that matches is the "
                      f"{self.result['network_config'].get('Network')} route the daemon added "
                      "'dev flannel0'. Handing the packet to a TUN device just queues the skb "
                      "for whoever holds the device open: the daemon.",
                  data={"route_get": A["route_get"],
                        "route": tr.route_for("\n".join(A["routes"]), wb.ip),
                        "ttl_after_forward": rd["packet"]["ttl"]})
        self.step("tun_read", "The engine reads the packet from flannel0", host="A",
                  side="kernel -> user", syscalls=["read(flannel0)"], copies=1,
                  why="The first crossing the overlay adds: one read() per packet (a TUN has "
                      "no batched read), the whole packet copied from the kernel into the "
                      "engine's buffer. The engine keeps reading until EAGAIN, so a burst costs "
                      "one extra read, not one per packet.",
                  data={"len": rd["len"], "packet": rd["packet"], "head": rd["head"],
                        "tun_reads": cA.get("tun_reads"), "polls": cA.get("polls"),
                        "tun_rx_packets": cA.get("tun_rx_packets")})
        self.step("lookup", "Lease-table lookup: which host holds the destination's subnet?",
                  host="A", side="user", syscalls=[], copies=0,
                  why="A hash lookup of the destination in the route table built from the "
                      "leases in etcd (subnet -> PublicIP); TTL - 1 and an incremental checksum "
                      "update, in place. No syscall, no copy.",
                  data={"dst": rd["packet"]["dst"], "prefixlen": hit["prefixlen"],
                        "peer": hit["peer"], "port": hit["port"], "lease": lease,
                        "ttl_out": rd["packet"]["ttl"] - 1,
                        "checksum_in": rd["packet"]["checksum"],
                        "checksum_out": rcv["packet"]["checksum"]})
        wire = req.get("wire")
        self.step("udp_send", f"{self.sc['send']}: the packet becomes a UDP payload", host="A",
                  side="user -> kernel",
                  syscalls=[f"{self.sc['send']} ({snd['batch']} packet(s) in this batch)"],
                  copies=1,
                  why="The second crossing: the packet is copied into a new skb and the kernel "
                      f"puts an IPv4 header ({tr.OUTER_IP} B) and a UDP header ({tr.OUTER_UDP} B) "
                      f"in front: {tr.OVERHEAD} bytes of overhead, which is why flannel0's MTU is "
                      "the interface MTU - 28. " + (
                          "One sendmmsg() carries the whole batch." if self.engine == "c" else
                          "Python has no sendmmsg(): one sendto() per packet of the batch."),
                  data={"outer": req["outer"], "batch": snd["batch"], "wire": wire,
                        "udp_sends": cA.get("udp_sends")})
        self.step("udp_recv", "B's engine receives the datagram", host="B",
                  side="kernel -> user",
                  syscalls=[f"{self.sc['recv']} ({rcv['batch']} datagram(s) in this batch)"],
                  copies=1,
                  why="The third crossing: B's kernel delivers the datagram to the daemon's "
                      f"socket and {self.sc['recv']} copies the payload - the inner packet - "
                      "out. The "
                      "source is checked against the leases (--accept-from leases).",
                  data={"source": rcv["source"], "sport": rcv["sport"], "len": rcv["len"],
                        "batch": rcv["batch"], "packet": rcv["packet"],
                        "source_is_lease": any(l["public_ip"] == rcv["source"]
                                               for l in self.result["leases"]),
                        "udp_recvs": cB.get("udp_recvs")})
        self.step("tun_write", "B's engine writes the packet into flannel0", host="B",
                  side="user -> kernel", syscalls=["write(flannel0)"], copies=1,
                  why="The fourth crossing: one write() per packet, the packet copied back into "
                      "a kernel skb. To B's kernel it now looks as if it had arrived on "
                      "flannel0.",
                  data={"len": wr["len"], "packet": wr["packet"], "head": wr["head"],
                        "tun_writes": cB.get("tun_writes")})
        self.step("deliver", "B's kernel routes it to the workload", host="B", side="kernel",
                  syscalls=[], copies=0,
                  why="Ordinary forwarding again, out of flannel0 into the workload's veth. An "
                      "echo request is answered by the workload's kernel itself; a UDP "
                      "datagram would cost its application one recvfrom() and one copy, as on "
                      "any path.",
                  data={"route_get": B["route_get"],
                        "ttl_at_workload": wr["packet"]["ttl"] - 1})
        rrd, rhit, rsnd, rrcv, rwr = (rep["tun_read"], rep["route_hit"], rep["udp_send"],
                                      rep["udp_recv"], rep["tun_write"])
        self.step("reply", "The reply takes the same path back", host="B -> A",
                  side="both", syscalls=["read()", self.sc["send"], self.sc["recv"], "write()"],
                  copies=4,
                  why="Mirror image: B's engine reads the echo reply from its flannel0, looks "
                      "up A's lease, sends; A's engine receives it and writes it into A's "
                      "flannel0.",
                  data={"tun_read": rrd, "route_hit": rhit, "udp_send": rsnd, "udp_recv": rrcv,
                        "tun_write": rwr, "outer": rep["outer"], "wire": rep.get("wire"),
                        "rtt_ms": ping["result"].get("rtt_ms"),
                        "reply_ttl": ping["result"].get("ttl"),
                        "timeline": readings.timeline(req, rep, self.sc)})

        # The UDP packet: the same steps, shown as one table.
        ureq, urep = self._legs("udp", "udp")
        udp = self.result["probes"]["udp"]
        self.step("udp_packet", "A UDP datagram takes the same path", host="A -> B -> A",
                  side="both",
                  why="Any IPv4 packet is carried the same way: the engine does not look past "
                      "the IP header. The outer datagram is always the inner packet + 28.",
                  data={"request": readings.leg_summary(ureq), "reply": readings.leg_summary(urep),
                        "result": udp["result"]})

    # 4. costs -------------------------------------------------------------------------------
    def _costs(self):
        ping = self.result["probes"]["ping"]
        cA, cB = ping["counters"]["A"], ping["counters"]["B"]
        self.step("ping_cost", "What that one ping cost the two engines (measured)",
                  side="both", host="A+B",
                  why="Two packets (request and reply) went through each engine, one at a "
                      "time. Nothing amortises: each packet pays its own wakeup (epoll_wait), "
                      "the call that moves it in, the call that moves it out, and draining calls "
                      f"that find nothing (EAGAIN): {readings.syscalls_per_packet(cA)} syscalls "
                      f"per packet on A, {readings.syscalls_per_packet(cB)} on B.",
                  data={"A": readings.cost_row(cA), "B": readings.cost_row(cB),
                        "engine": self.engine, "syscall_names": self.sc})
        bursts, skipped = {}, {}
        engines = [self.engine]
        if self.compare_engines:
            from ..engine import c_available, c_import_error
            other = "python" if self.engine == "c" else "c"
            if other == "python" or c_available():
                engines.append(other)
            else:
                skipped["c"] = f"the C engine is not built ({c_import_error()})"
        for i, kind in enumerate(engines):
            if i:
                self.on_progress(f"restarting both daemons with the {kind} engine (the leases "
                                 "stay) ...")
                for h in (self.a, self.b):
                    self.ov.restart_daemon(h, engine=kind)
                self._wait_path()
            self.on_progress(f"{kind} engine: {BURST_COUNT} datagrams from A's workload to B's "
                             "...")
            bursts[kind] = self._burst(kind)
        self.result["bursts"] = bursts
        self.step("batching", "Batching: syscalls per packet under load (measured)",
                  side="both", host="A+B",
                  why="When packets queue up, one wakeup drains many: the engine reads the TUN "
                      "until EAGAIN and hands the batch to one sendmmsg(); the receiver takes up "
                      "to 64 datagrams per recvmmsg(). TUN reads and writes stay one per packet "
                      "- a TUN device has no batched read or write - so the floor is about one "
                      "syscall per packet on each side. The Python engine has no sendmmsg/"
                      "recvmmsg: one sendto()/recvfrom_into() per packet, so it never gets "
                      "below about two syscalls per packet.",
                  data={"bursts": bursts, "skipped": skipped,
                        "reference_flanneld": tr.FLANNELD_REFERENCE})

    def _wait_path(self, timeout: float = 15.0):
        wa, wb = self.workloads["A"], self.workloads["B"]
        end = _now() + timeout
        while _now() < end:
            r = wa.run(["ping", "-n", "-q", "-c", "1", "-W", "1", wb.ip], timeout=5)
            if r.returncode == 0:
                return
        raise DemoError("the overlay did not carry packets again after the engine switch")

    def _burst(self, kind: str) -> dict:
        wa, wb = self.workloads["A"], self.workloads["B"]
        sink_out = os.path.join(self.ov.tb.workdir, f"sink-{kind}.jsonl")
        sink = wb.popen([lab.PY, "-c", lab.SINK, str(lab.SINK_PORT), "20"], sink_out)
        if not lab.wait_file_line(sink_out, '"ready"', proc=sink):
            raise DemoError("the burst sink did not start")
        before = {"A": self._stats(self.a), "B": self._stats(self.b)}
        r = wa.run([lab.PY, "-c", lab.BURST, wb.ip, str(lab.SINK_PORT), str(BURST_COUNT),
                    str(BURST_SIZE), str(BURST_CHUNK), str(BURST_GAP_S)], timeout=30)
        try:
            sent = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise DemoError(f"burst sender failed: {r.stdout} {r.stderr}") from None
        # Wait until B's sink stops counting (the last batch is through), then read counters.
        last, still = -1, 0
        end = _now() + 5
        while _now() < end and still < 3:
            lines = lab.json_lines(sink_out)
            n = lines[-1].get("received", 0) if lines else 0
            still = still + 1 if n == last else 0
            last = n
            time.sleep(0.1)
        after = {"A": self._stats(self.a), "B": self._stats(self.b)}
        lab.stop_procs(wb)
        d = {k: tr.delta(before[k], after[k]) for k in before}
        return {"engine": kind, "sent": sent["sent"], "received": max(last, 0),
                "ip_len": BURST_SIZE + 28, "seconds": round(sent["seconds"], 3),
                "send_side": tr.per_packet(d["A"], "send"),
                "receive_side": tr.per_packet(d["B"], "receive"),
                "counters": d, "stats_before": before, "stats_after": after}

    def _summary(self):
        bursts = self.result.get("bursts", {})
        measured = [{"engine": k, "send": v["send_side"].get("syscalls_per_packet"),
                     "receive": v["receive_side"].get("syscalls_per_packet"),
                     "send_batch": v["send_side"].get("avg_batch"),
                     "receive_batch": v["receive_side"].get("avg_batch")}
                    for k, v in bursts.items()]
        ping = self.result["probes"]["ping"]
        cA, cB = ping["counters"]["A"], ping["counters"]["B"]
        single = {"A": cA.get("syscalls"), "B": cB.get("syscalls"), "packets_each": 2}
        # One table: the model rows, then what this run measured, all per packet from A's
        # application to B's, over both hosts, beyond the applications' own send and recv.
        rows = [dict(m, measured=False) for m in tr.COST_MODEL]
        ref = tr.FLANNELD_REFERENCE
        rows.append({"path": "flanneld's own loop (docs/design.md reference)", "short": "flanneld",
                     "crossings": 4, "copies": 4, "syscalls": round(ref["send"] + ref["receive"], 2),
                     "bytes_added": tr.OVERHEAD, "measured": True})
        # Measured rows: copies = bytes the engines moved across the boundary / packet size
        # (tun_rx + udp_tx on the sending host, udp_rx + tun_tx on the receiving one).
        n_a = cA.get("tun_rx_packets", 0) + cA.get("udp_rx_packets", 0)
        n_b = cB.get("tun_rx_packets", 0) + cB.get("udp_rx_packets", 0)
        req = ping.get("request", {})
        plen = req.get("tun_read", {}).get("len")
        if n_a and n_b and plen:
            copies = round(readings.bytes_copied(cA) / (n_a * plen)
                           + readings.bytes_copied(cB) / (n_b * plen), 2)
            wire = req.get("wire")
            rows.append({"path": f"this run: one ping, {self.engine} engine (nothing to batch)",
                         "short": "one ping", "crossings": copies, "copies": copies,
                         "syscalls": round(cA["syscalls"] / n_a + cB["syscalls"] / n_b, 2),
                         "bytes_added": (wire["outer"]["tot_len"] - plen) if wire
                         else tr.OVERHEAD, "measured": True})
        for m in measured:
            b = bursts[m["engine"]]
            if m["send"] is None or m["receive"] is None:
                continue
            sent_bytes = b["send_side"]["packets"] * b["ip_len"]
            recv_bytes = b["receive_side"]["packets"] * b["ip_len"]
            copies = round(b["send_side"]["bytes_copied"] / sent_bytes
                           + b["receive_side"]["bytes_copied"] / recv_bytes, 2)
            rows.append({"path": f"this run: {m['engine']} engine under load (batched)",
                         "short": f"{m['engine']} burst", "crossings": copies, "copies": copies,
                         "syscalls": round(m["send"] + m["receive"], 2),
                         "bytes_added": tr.OVERHEAD, "measured": True})
        self.result["summary"] = {"model": tr.COST_MODEL, "rows": rows, "measured": measured,
                                  "single_ping": single, "reference_flanneld": ref}
        self.step("summary", "Why a TUN overlay costs what it costs", side="both", host="A+B",
                  why="Kernel paths move a packet between devices inside the kernel. A TUN "
                      "overlay takes every packet out to user space and back in, on both hosts: "
                      "4 extra copies, always, and without batching 4 extra syscalls plus the "
                      "wakeups. Batching shares the wakeups and the UDP calls among the packets "
                      "of a batch, which leaves about one syscall per packet per host (a TUN has "
                      "no batched read or write: 2 per packet in all), but it never removes a "
                      "copy. Fewer copies and syscalls per byte need offloads (IFF_VNET_HDR + "
                      "UDP GSO/GRO: fewer, bigger packets), or staying in the kernel (VXLAN).",
                  data=self.result["summary"])

    # the direct path (--direct-routing) ---------------------------------------------------
    def _flannel0(self, host) -> dict:
        return tr.link_counters(self.ov.exec(host, ["ip", "-s", "-j", "link", "show",
                                                     "flannel0"]).stdout)

    def _wait_direct_routes(self, timeout: float = 10.0):
        """Each daemon routes the other's subnet via its PublicIP once it has seen its lease."""
        a, b = self.a, self.b
        want = [(h, f"{self.ov.subnet(p)} via {p.ip} dev {h.iface}") for h, p in ((a, b), (b, a))]
        end = _now() + timeout
        while True:
            missing = []
            for h, route in want:
                lines = readings.squeezed_lines(self.ov.exec(h, ["ip", "route"]).stdout)
                if not any(ln == route or ln.startswith(route + " ") for ln in lines):
                    missing.append((h, route))
            if not missing:
                return
            if _now() > end:
                h, route = missing[0]
                said = [ln.strip() for ln in self.ov.daemon(h).log_text().splitlines()
                        if "Subnet added" in ln][-2:]
                raise DemoError(f"DirectRouting: host {h.name} has no route '{route}' after "
                                f"{timeout:.0f} s; its daemon says: {said or 'no Subnet added'}")
            time.sleep(0.05)

    def _follow_direct(self):
        H = self.result["hosts"]
        A, B = H["A"], H["B"]
        wa, wb = self.workloads["A"], self.workloads["B"]
        frames = self.result["wire_frames"]
        probes = self.result["probes"]
        for name, proto in (("ping", "icmp"), ("udp", "udp")):
            p = probes[name]
            ev = p["events"]
            p["request"] = tr.direct_leg(frames, ev["A"], ev["B"], wa.ip, wb.ip, proto,
                                         p["t0"], p["t1"])
            p["reply"] = tr.direct_leg(frames, ev["B"], ev["A"], wb.ip, wa.ip, proto,
                                       p["t0"], p["t1"])
        ping, udp = probes["ping"], probes["udp"]
        req, rep = ping["request"], ping["reply"]
        if not req["wire"] or not rep["wire"]:
            raise DemoError(f"the tap on A's veth did not see the ping between {wa.ip} and "
                            f"{wb.ip} as a plain packet (not routed directly?): "
                            f"{len(frames)} frame(s) between the workloads")
        net = self.result["network_config"].get("Network")

        self._app_send(wa, wb, A)
        self.step("kernel_route", "A's kernel routes it straight to host B (DirectRouting)",
                  host="A", side="kernel", syscalls=[], copies=0,
                  why=f"Plain kernel forwarding and nothing else: the longest prefix that matches "
                      f"is B's subnet {B['subnet']}, which A's daemon routed 'via' B's PublicIP "
                      f"on the underlay (its lease says DirectRouting too, and B is on A's link); "
                      f"it is more specific than the {net} route into flannel0, so the packet "
                      "never reaches the TUN device.",
                  data={"route_get": A["route_get"],
                        "route": tr.route_for("\n".join(A["routes_with_workload"]), wb.ip),
                        "ttl_after_forward": req["wire"]["ttl"]})
        rows = []
        for leg_name, probe, leg in (("ping A -> B", ping, req), ("ping B -> A", ping, rep),
                                     ("UDP A -> B", udp, udp["request"]),
                                     ("UDP B -> A", udp, udp["reply"])):
            w = leg["wire"]
            exp = probe["result"]["expected_len"]
            rows.append({"leg": leg_name, "expected_len": exp, "wire": w,
                         "bytes_added": (w["tot_len"] - exp) if w else None})
        self.step("wire", "On the wire: the packet itself, no outer header", host="A",
                  side="kernel", syscalls=[], copies=0,
                  why="The tap on A's veth sees the workloads' own packets, addressed workload to "
                      "workload, in an Ethernet frame to the other host: no outer IP and UDP "
                      f"header, nothing sent to port {self.port}, 0 bytes added. Each kernel that "
                      "forwards a packet takes one off its TTL.",
                  data={"iface": self.a.iface, "rows": rows})
        idle = {"flannel0": {}, "engine": {}, "trace_events": {}}
        for name in ("ping", "udp"):
            p = probes[name]
            idle["flannel0"][name] = p["flannel0"]
            idle["engine"][name] = {role: {k: p["counters"][role].get(k, 0) for k in (
                "tun_rx_packets", "udp_tx_packets", "udp_rx_packets", "tun_tx_packets")}
                for role in ("A", "B")}
            idle["trace_events"][name] = len(p["request"]["engine_events"]) \
                + len(p["reply"]["engine_events"])
        idle["peers_by_mode"] = {role: H[role].get("peers_by_mode") for role in ("A", "B")}
        idle["peer_log"] = {role: H[role].get("peer_log") for role in ("A", "B")}
        self.step("untouched", "flannel0 and the engines: nothing moved", host="A+B",
                  side="user", syscalls=[], copies=0,
                  why="Measured on both hosts: flannel0's packet counters (the kernel's) did not "
                      "move, the engines counted no packet and their trace rings hold none of "
                      "these. That is what it trades: the engine's source checks (--accept-from "
                      "leases) never see a directly routed packet - host-gw's model, the link "
                      "between the hosts is trusted and only the kernel's rp_filter checks - and "
                      "both hosts must have it on (each says so in its lease), or a peer stays "
                      "encapsulated both ways.",
                  data=idle)
        self.step("deliver_direct", "B's kernel delivers it; the reply comes back the same way",
                  host="B -> A", side="kernel", syscalls=[], copies=0,
                  why="B's kernel forwards the packet from its underlay veth to the workload's, "
                      "as any router would; the reply takes B's route via A's PublicIP. Two "
                      "kernel hops each way and no engine hop: the reply's TTL is 64 - 2.",
                  data={"route_get": B["route_get"], "route_get_reply": B["route_get_reply"],
                        "reply_wire": rep["wire"], "reply_ttl": ping["result"].get("ttl"),
                        "rtt_ms": ping["result"].get("rtt_ms"), "udp": udp["result"]})

    def _summary_direct(self):
        ping = self.result["probes"]["ping"]
        cA, cB = ping["counters"]["A"], ping["counters"]["B"]
        plen = ping["result"]["expected_len"]
        packets = 2                  # the request and the reply
        moved = readings.bytes_copied(cA) + readings.bytes_copied(cB)
        calls = sum(c.get(k, 0) for c in (cA, cB)
                    for k in ("tun_reads", "tun_writes", "udp_sends", "udp_recvs"))
        copies = round(moved / (packets * plen), 2)
        rows = [dict(m, measured=False) for m in tr.COST_MODEL]
        rows.append({"path": f"this run: one ping, DirectRouting ({self.engine} engine)",
                     "short": "one ping, direct", "crossings": copies, "copies": copies,
                     "syscalls": round(calls / packets, 2),
                     "bytes_added": ping["request"]["wire"]["tot_len"] - plen, "measured": True})
        self.result["summary"] = {"model": tr.COST_MODEL, "rows": rows}
        self.step("summary", "What the direct path costs", side="both", host="A+B",
                  why="Directly routed, a packet stays in the kernel: no crossing, no copy, no "
                      "forwarder syscall, no bytes added (the measured row: the engines' byte "
                      "and call counters during the ping, the wire tap's length). Peers behind a "
                      "router, or without DirectRouting, still take the TUN path and its costs: "
                      "flannel-udp demo without --direct-routing follows that one.",
                  data=self.result["summary"])

    # 5. teardown ----------------------------------------------------------------------------
    def _teardown(self):
        if self.tap is not None:
            try:
                self.tap.stop()
            except Exception as e:
                log.warning("wire tap: %s", e)
            self.tap = None
        for w in list(self.workloads.values()):
            try:
                lab.remove_workload(w)
            except Exception as e:
                log.warning("workload %s: %s", w.name, e)
        if self.ov is not None:
            self.on_progress("tearing down: daemons, etcd, namespaces ...")
            self.ov.close()
            self.ov = None
        self.result["torn_down"] = True
