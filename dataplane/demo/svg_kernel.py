"""The SVG picture of the kernel path (``flannel-udp demo --engine kernel --out DIR``), with this
run's measured values: the packet stays below the user/kernel boundary from A's workload to
B's, through tc egress on A's flannel0 and tc ingress on B's veth; the engines sit above it,
idle for this packet. The same drawing helpers and colours as ``svg.py``'s engine path.
"""
from __future__ import annotations

from ..host.atomicfile import write_atomic
from .kernel_readings import moved
from .svg import COL_A, COL_B, COL_W, EDGE, KERNEL, USER, W, _arrow, _rect, _t

H = 560


def render(result: dict) -> str:
    """The SVG text for a demo result of --engine kernel (the dict ``--json`` prints)."""
    A, B = result["hosts"]["A"], result["hosts"]["B"]
    ping, port, eng = result["probes"]["ping"], result["port"], result["engine"]
    w = ping["request"]["wire"]
    inner, outer = w["inner"], w["outer"]
    idle = next(s for s in result["steps"] if s["id"] == "engines_idle")["data"]["ping"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}">',
           # sized in the drawing's units: scaled by the 3 px stroke, the heads hid the text
           '<defs><marker id="arrow" markerUnits="userSpaceOnUse" markerWidth="12" '
           'markerHeight="12" refX="10" refY="6" orient="auto">'
           '<path d="M0,0 L12,6 L0,12 z" fill="#c62828"/></marker></defs>',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           _t(W / 2, 28, "flannel-udp: one ping from A's workload to B's, the kernel path "
              "(measured)", 16, "bold", "middle"),
           f'<rect x="20" y="45" width="{W - 40}" height="105" fill="{USER}"/>',
           _t(28, 61, "user", 11, fill="#666"),
           f'<rect x="20" y="160" width="{W - 40}" height="300" fill="{KERNEL}"/>',
           _t(28, 176, "kernel", 11, fill="#666"),
           f'<line x1="20" y1="155" x2="{W - 20}" y2="155" stroke="{EDGE}" stroke-width="2" '
           'stroke-dasharray="8,5"/>',
           _t(W - 24, 172, "user/kernel boundary", 11, anchor="end", fill="#a66b00")]
    for x, role, h in ((COL_A, "A", A), (COL_B, "B", B)):
        e = idle[role]
        out += [_rect(x, 55, COL_W, 40, "white"),
                _t(x + 10, 80, f"host {role} ({h['name']}) workload {h['workload']['ip']}", 13,
                   "bold"),
                # beside the packet's arrow, not across it: the packet never enters the engine
                _rect(x + 60, 102, COL_W - 60, 44, "#f5f5f5", stroke="#aaa"),
                _t(x + 70, 120, f"{eng} engine, pid {h['daemon_pid']}: the slow path", 12,
                   fill="#777"),
                _t(x + 70, 138, f"this ping: +{sum(e['packets'].values())} packets, "
                   f"+{e['calls']} calls, {e['bytes_copied']} B copied", 11, fill="#777"),
                _rect(x, 185, COL_W, 50, "white"),
                _t(x + 10, 205, h["route_get"].get("text", ""), 11),
                _rect(x, 250, COL_W, 95, "white"),
                _rect(x, 360, COL_W, 40, "white"),
                _t(x + 10, 385, f"veth {h['iface']} {h['underlay_ip']}", 12)]
    ax, bx = COL_A + 30, COL_B + 30
    kA, kB = moved(ping["kernel"]["A"]), moved(ping["kernel"]["B"])
    out += [_arrow(ax, 95, ax, 183),
            _t(ax + 15, 225, f"{result['network_config'].get('Network')} dev flannel0, "
               f"TTL {inner['ttl'] + 1}", 11),
            _arrow(ax, 235, ax, 248),
            _t(ax + 15, 270, "flannel0 tc egress: fu_egress", 12, "bold", fill="#c62828"),
            _t(ax + 15, 290, f"lookup {inner['dst']} -> {outer['dst']}:{port}, "
               f"TTL -> {inner['ttl']}", 11),
            _t(ax + 15, 308, f"+ UDP 8 + IP 20 = {outer['tot_len']} B, no copy", 11),
            _t(ax + 15, 326, f"udp_tx_packets +{kA.get('udp_tx_packets', 0)}", 11, "bold"),
            _arrow(ax, 345, ax, 358),
            _arrow(bx, 358, bx, 347),
            _t(bx + 15, 270, f"veth tc ingress: fu_ingress (udp :{port})", 12, "bold",
               fill="#c62828"),
            _t(bx + 15, 290, f"source {outer['src']} holds a lease, - 28 B", 11),
            _t(bx + 15, 308, f"TTL {inner['ttl']} -> {inner['ttl'] - 1}, into flannel0", 11),
            _t(bx + 15, 326, f"tun_tx_packets +{kB.get('tun_tx_packets', 0)}", 11, "bold"),
            _arrow(bx, 250, bx, 237),
            _t(bx + 15, 225, f"to the workload with TTL {inner['ttl'] - 2}", 11),
            _arrow(bx, 185, bx, 97),
            f'<path d="M{ax},400 L{ax},430 L{bx},430 L{bx},402" fill="none" stroke="#c62828" '
            'stroke-width="3" marker-end="url(#arrow)"/>',
            _t(W / 2, 448, f"{outer['src']}:{port} -> {outer['dst']}:{port}  UDP, "
               f"{outer['tot_len']} B on the wire = {inner['tot_len']} inner + 28 (seen by the "
               "tap)", 12, "bold", "middle"),
            _t(40, 490, f"one ping (request + reply): 0 crossings, 0 copies, 0 engine calls; "
               f"RTT {ping['result'].get('rtt_ms')} ms", 12),
            _t(40, 510, f"A's programs: {', '.join(f'{k} +{v}' for k, v in kA.items())}", 11),
            _t(40, 528, f"B's programs: {', '.join(f'{k} +{v}' for k, v in kB.items())}", 11),
            _t(40, 548, "no route, TTL 1, too big, ICMP errors: handed on to the engine, which "
               "answers them (the slow path)", 11, fill="#555"),
            "</svg>"]
    return "\n".join(out) + "\n"


def write(result: dict, path: str) -> str:
    write_atomic(path, render(result))
    return path
