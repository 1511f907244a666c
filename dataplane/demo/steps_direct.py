"""The steps only ``flannel-udp demo --direct-routing`` has: the packet routed host to host by the
kernels, flannel0 and the engines idle. No I/O here; as ``steps.py``, each function takes the
demo's result so far and returns one step (the step ids are declared in ``steps.DIRECT_PATH``).
"""
from __future__ import annotations

from . import readings
from . import trace as tr
from .steps import app_send, step

#: The engine counters that would move if a packet went through an engine.
_ENGINE_PACKETS = ("tun_rx_packets", "udp_tx_packets", "udp_rx_packets", "tun_tx_packets")


def kernel_route(r: dict) -> dict:
    A, B = r["hosts"]["A"], r["hosts"]["B"]
    return step("kernel_route", "A's kernel routes it straight to host B (DirectRouting)",
                host="A", side="kernel", syscalls=[], copies=0,
                why="Plain kernel forwarding and nothing else: the longest prefix that matches "
                    f"is B's subnet {B['subnet']}, which A's daemon routed 'via' B's PublicIP "
                    "on the underlay (its lease says DirectRouting too, and B is on A's link); "
                    f"it is more specific than the {r['network_config'].get('Network')} route "
                    "into flannel0, so the packet never reaches the TUN device.",
                data={"route_get": A["route_get"],
                      "route": tr.route_for("\n".join(A["routes_with_workload"]),
                                            B["workload"]["ip"]),
                      "ttl_after_forward": r["probes"]["ping"]["request"]["wire"]["ttl"]})


def wire(r: dict) -> dict:
    ping, udp = r["probes"]["ping"], r["probes"]["udp"]
    rows = []
    for name, probe, leg in (("ping A -> B", ping, "request"), ("ping B -> A", ping, "reply"),
                             ("UDP A -> B", udp, "request"), ("UDP B -> A", udp, "reply")):
        w, exp = probe[leg]["wire"], probe["result"]["expected_len"]
        rows.append({"leg": name, "expected_len": exp, "wire": w,
                     "bytes_added": (w["tot_len"] - exp) if w else None})
    return step("wire", "On the wire: the packet itself, no outer header", host="A",
                side="kernel", syscalls=[], copies=0,
                why="The tap on A's veth sees the workloads' own packets, addressed workload to "
                    "workload, in an Ethernet frame to the other host: no outer IP and UDP "
                    f"header, nothing sent to port {r['port']}, 0 bytes added. Each kernel that "
                    "forwards a packet takes one off its TTL.",
                data={"iface": r["hosts"]["A"]["iface"], "rows": rows})


def _idle(r: dict) -> dict:
    """What stood still during each probe: flannel0's counters, the engines', their rings."""
    H, probes = r["hosts"], r["probes"]
    idle = {"flannel0": {}, "engine": {}, "trace_events": {}}
    for name in ("ping", "udp"):
        p = probes[name]
        idle["flannel0"][name] = p["flannel0"]
        idle["engine"][name] = {role: {k: p["counters"][role].get(k, 0) for k in _ENGINE_PACKETS}
                                for role in ("A", "B")}
        idle["trace_events"][name] = len(p["request"]["engine_events"]) \
            + len(p["reply"]["engine_events"])
    idle["peers_by_mode"] = {role: H[role].get("peers_by_mode") for role in ("A", "B")}
    idle["peer_log"] = {role: H[role].get("peer_log") for role in ("A", "B")}
    return idle


def untouched(r: dict) -> dict:
    return step("untouched", "flannel0 and the engines: nothing moved", host="A+B",
                side="user", syscalls=[], copies=0,
                why="Measured on both hosts: flannel0's packet counters (the kernel's) did not "
                    "move, the engines counted no packet and their trace rings hold none of "
                    "these. That is what it trades: the engine's source checks (--accept-from "
                    "leases) never see a directly routed packet - host-gw's model, the link "
                    "between the hosts is trusted and only the kernel's rp_filter checks - and "
                    "both hosts must have it on (each says so in its lease), or a peer stays "
                    "encapsulated both ways.",
                data=_idle(r))


def deliver_direct(r: dict) -> dict:
    B = r["hosts"]["B"]
    ping, udp = r["probes"]["ping"], r["probes"]["udp"]
    return step("deliver_direct", "B's kernel delivers it; the reply comes back the same way",
                host="B -> A", side="kernel", syscalls=[], copies=0,
                why="B's kernel forwards the packet from its underlay veth to the workload's, "
                    "as any router would; the reply takes B's route via A's PublicIP. Two "
                    "kernel hops each way and no engine hop: the reply's TTL is 64 - 2.",
                data={"route_get": B["route_get"], "route_get_reply": B["route_get_reply"],
                      "reply_wire": ping["reply"]["wire"], "reply_ttl": ping["result"].get("ttl"),
                      "rtt_ms": ping["result"].get("rtt_ms"), "udp": udp["result"]})


#: The followed packets on the direct path, step by step.
FOLLOW_STEPS = (app_send, kernel_route, wire, untouched, deliver_direct)


def summary(r: dict) -> dict:
    return step("summary", "What the direct path costs",
                host="A+B", side="both",
                why="Directly routed, a packet stays in the kernel: no crossing, no copy, no "
                    "forwarder syscall, no bytes added (the measured row: the engines' byte "
                    "and call counters during the ping, the wire tap's length). Peers behind a "
                    "router, or without DirectRouting, still take the TUN path and its costs: "
                    "flannel-udp demo without --direct-routing follows that one.",
                data=readings.direct_summary(r))
