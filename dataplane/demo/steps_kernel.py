"""The steps only ``flannel-udp demo --engine kernel`` has: the ping carried by the kernel path's
tc programs (docs/kernel-path.md), the engines idle, and what still goes to an engine. No I/O
here; as ``steps.py``, each function takes the demo's result so far and returns one step (the
step ids are declared in ``steps.KERNEL_PATH``).

The figures are the readings: the programs' counters (``kernel_readings``), the engines'
counters and trace rings, the wire tap, each around its probe.
"""
from __future__ import annotations

from . import readings
from .steps import app_send, route_into_flannel0, step

#: The engine counters a packet would move if an engine carried it.
ENGINE_PACKETS = ("tun_rx_packets", "udp_tx_packets", "udp_rx_packets", "tun_tx_packets")
#: The engine's calls that move a packet across the boundary (the rest are its wakeups).
ENGINE_CALLS = ("tun_reads", "tun_writes", "udp_sends", "udp_recvs")


def _ping(r: dict):
    ping = r["probes"]["ping"]
    return ping, ping["kernel"]["A"], ping["kernel"]["B"]


def kernel_route(r: dict) -> dict:
    wire = _ping(r)[0]["request"]["wire"]
    # the programs keep no trace: the TTL is the wire's inner one, plus the program's 1
    return route_into_flannel0(r, wire["inner"]["ttl"] + 1 if wire else None,
                               "The route is the same as without the kernel path; what changes "
                               "is flannel0's way out: before the packet is queued for a "
                               "reader, tc's egress hook runs the daemon's program on it.")


EGRESS_WHY = ("The program fu_egress looks the destination up in its route map (written by the "
              "daemon from the same leases as the engine's table), checks the TTL and the size, "
              "takes 1 off the TTL, pushes the outer IPv4 and UDP headers (28 bytes) in front of "
              "the same buffer and redirects it out of {iface}: no read(), no sendmmsg(), no "
              "copy. Its counter udp_tx_packets moved; the tap on the veth saw the datagram.")


def tc_egress(r: dict) -> dict:
    ping, kA, _ = _ping(r)
    wire, plen = ping["request"]["wire"], ping["result"]["expected_len"]
    return step("tc_egress", "tc egress on flannel0: encapsulated in the kernel", host="A",
                side="kernel", syscalls=[], copies=0,
                why=EGRESS_WHY.format(iface=r["hosts"]["A"]["iface"]),
                data={"counters_A": kA, "wire": wire, "expected_len": plen,
                      "bytes_added": wire["outer"]["tot_len"] - plen if wire else None,
                      "iface": r["hosts"]["A"]["iface"], "port": r["port"]})


def tc_ingress(r: dict) -> dict:
    ping, kA, kB = _ping(r)
    B = r["hosts"]["B"]
    return step("tc_ingress", "B's tc ingress: out of the datagram, into flannel0", host="B",
                side="kernel", syscalls=[], copies=0,
                why=f"On {B['iface']}'s ingress the program fu_ingress takes the datagram to "
                    f"port {r['port']}, applies the engine's source checks (the sender holds a "
                    "lease, the inner source is in its subnet), removes the 28 bytes, takes 1 "
                    "off the TTL and redirects the packet into flannel0's ingress, where the "
                    "kernel takes it as it takes an engine's write(). Its counter "
                    "tun_tx_packets moved; the reply came back the same way, B's egress "
                    "program to A's ingress.",
                data={"counters_B": kB, "counters_A": kA, "reply_wire": ping["reply"]["wire"],
                      "reply_ttl": ping["result"].get("ttl"),
                      "rtt_ms": ping["result"].get("rtt_ms"),
                      "udp": r["probes"]["udp"]["result"]})


def idle(r: dict) -> dict:
    """What the engines counted during each probe: their packets, calls and trace events."""
    out = {}
    for name in ("ping", "udp"):
        p = r["probes"][name]
        out[name] = {role: {"packets": {k: p["counters"][role].get(k, 0) for k in ENGINE_PACKETS},
                            "calls": sum(p["counters"][role].get(k, 0) for k in ENGINE_CALLS),
                            "bytes_copied": readings.bytes_copied(p["counters"][role]),
                            "trace_events": len(p["events"][role]),
                            "programs": p["kernel"][role]}
                     for role in ("A", "B")}
    return out


IDLE_WHY = ("Measured on both hosts around each probe: the engines behind the programs counted "
            "no packet, made no call that moves one and wrote no trace event; only the "
            "programs' counters moved. The packet never left the kernel: the four copies and "
            "crossings of the TUN path are gone, the wire is the same.")


def engines_idle(r: dict) -> dict:
    return step("engines_idle", "The engines: nothing moved (0 crossings, 0 copies)",
                host="A+B", side="user", syscalls=[], copies=0,
                why=IDLE_WHY, data=idle(r))


def slow_path(r: dict) -> dict:
    p = r["probes"]["slow"]
    A = r["hosts"]["A"]
    return step("slow_path", "What stays with the engine: a ping with TTL 2", host="A",
                side="kernel -> user", syscalls=[f"read() of flannel0 by A's {r['engine']} "
                                                 "engine", "write() of the ICMP error"],
                copies=2,
                why="A's kernel takes 1 off the TTL when it forwards, so the packet reaches "
                    "flannel0 with TTL 1: the program does not forward it, it passes it on "
                    "unchanged (passed_tx_ttl), and the engine reads it from flannel0 and answers "
                    "'time exceeded' as it does alone. No route, too big, ICMP errors and the "
                    "rare cases go the same way: the engine is the slow path.",
                data={"result": p["result"], "programs_A": p["kernel"]["A"],
                      "engine_A": {k: v for k, v in sorted(p["counters"]["A"].items()) if v},
                      "flannel0": A["flannel0"]})


#: The followed ping on the kernel path, step by step.
FOLLOW_STEPS = (app_send, kernel_route, tc_egress, tc_ingress, engines_idle)


def summary(r: dict) -> dict:
    wire = r["probes"]["ping"]["request"]["wire"]
    return step("summary", "What the kernel path costs", host="A+B", side="both",
                why="The kernel path keeps flannel's wire (28 bytes, the same datagram a "
                    "flanneld or an engine host reads) and VXLAN's cost: no crossing, no copy, "
                    "no forwarder syscall (the measured row: the engines' byte and call "
                    "counters during the ping). The engines stay as the slow path. flannel-udp "
                    "demo without --engine kernel follows the packet through an engine.",
                data=readings.measured_summary(
                    r, "this run: one ping, the kernel path (tc programs)",
                    "one ping, kernel path", wire["outer"]["tot_len"]))
