"""An SVG picture of the path one packet took, with this run's measured values.

Written by ``flannel-udp demo --out DIR`` as DIR/path.svg (plain SVG 1.1, no
scripts, no external fonts: it opens in any browser or image viewer, and can
be converted to PNG with ``rsvg-convert`` or ``inkscape`` if a slide needs one).
The layout mirrors the terminal diagram: host A on the left going down, the
wire at the bottom, host B on the right going up; dashed lines are the
user/kernel boundary, which the packet crosses four times in the middle.
"""
from __future__ import annotations

from xml.sax.saxutils import escape

from ..host.atomicfile import write_atomic
from . import readings

W, H = 940, 640
COL_A, COL_B = 80, 520          # left edges of the two host columns
COL_W = 380
USER, KERNEL, EDGE = "#e8f5e9", "#e3f2fd", "#f9a825"


def _t(x, y, text, size=13, weight="normal", anchor="start", fill="#222"):
    return (f'<text x="{x}" y="{y}" font-family="monospace" font-size="{size}" '
            f'font-weight="{weight}" text-anchor="{anchor}" fill="{fill}">{escape(str(text))}'
            '</text>')


def _rect(x, y, w, h, fill, stroke="#555"):
    return (f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{fill}" '
            f'stroke="{stroke}"/>')


def _arrow(x1, y1, x2, y2, color="#c62828"):
    return (f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{color}" stroke-width="3" '
            'marker-end="url(#arrow)"/>')


def render(result: dict) -> str:
    """The SVG text for a demo result (the dict ``--json`` prints)."""
    H_ = result["hosts"]
    A, B = H_["A"], H_["B"]
    ping = result["probes"]["ping"]
    req = ping["request"]
    sc = result.get("syscall_names", {"send": "sendmmsg()", "recv": "recvmmsg()"})
    rd, snd, rcv, wr = req["tun_read"], req["udp_send"], req["udp_recv"], req["tun_write"]
    outer = req["outer"]
    wire = req.get("wire") or {}
    port = result["port"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}">',
           '<defs><marker id="arrow" markerWidth="10" markerHeight="10" refX="8" refY="5" '
           'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#c62828"/></marker></defs>',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           _t(W / 2, 28, f"flannel-udp: one ping from A's workload to B's, engine "
              f"{result['engine']} (measured)", 16, "bold", "middle")]
    # Bands: user space (workload, engine) and kernel (routing + TUN, sockets + wire).
    bands = [(50, 70, USER, "user"), (125, 110, KERNEL, "kernel"), (240, 105, USER, "user"),
             (350, 150, KERNEL, "kernel")]
    for y, h, fill, label in bands:
        out.append(f'<rect x="20" y="{y}" width="{W - 40}" height="{h}" fill="{fill}"/>')
        out.append(_t(28, y + 16, label, 11, fill="#666"))
    for y in (122, 237, 347):
        out.append(f'<line x1="20" y1="{y}" x2="{W - 20}" y2="{y}" stroke="{EDGE}" '
                   'stroke-width="2" stroke-dasharray="8,5"/>')
    out.append(_t(W - 24, 236, "user/kernel boundary", 11, anchor="end", fill="#a66b00"))

    def col(x, role, h):
        w = h["workload"]
        items = [
            _rect(x, 60, COL_W, 50, "white"),
            _t(x + 10, 80, f"host {role} ({h['name']}) workload {w['ip']}", 13, "bold"),
            _t(x + 10, 100, f"lease {h['subnet']} -> PublicIP {h['underlay_ip']}", 12),
            _rect(x, 135, COL_W, 90, "white"),
            _t(x + 10, 155, "kernel: forward, route", 12),
            _rect(x, 250, COL_W, 85, "white"),
            _t(x + 10, 270, f"flannel-udp engine ({result['engine']}), pid {h['daemon_pid']}",
               12, "bold"),
            _rect(x, 360, COL_W, 60, "white"),
            _t(x + 10, 380, f"UDP socket {h['underlay_ip']}:{port}", 12),
        ]
        return items
    out += col(COL_A, "A", A)
    out += col(COL_B, "B", B)

    ax, bx = COL_A + 30, COL_B + 30
    # Host A, downwards.
    out += [_arrow(ax, 110, ax, 133),
            _t(ax + 15, 175, f"{A['route_get'].get('text', '')}", 11),
            _t(ax + 15, 195, f"TTL {rd['packet']['ttl']}, queued on flannel0 (TUN)", 11),
            _arrow(ax, 225, ax, 248),
            _t(ax + 15, 243, f"read() {rd['len']} B   copy 1", 12, "bold", fill="#c62828"),
            _t(ax + 15, 292, f"lookup {rd['packet']['dst']} -> /{req['route_hit']['prefixlen']}"
               f" -> {req['route_hit']['peer']}:{req['route_hit']['port']}", 11),
            _t(ax + 15, 310, f"TTL {rd['packet']['ttl']} -> {rd['packet']['ttl'] - 1}", 11),
            _arrow(ax, 335, ax, 358),
            _t(ax + 15, 353, f"{sc['send']} batch {snd['batch']}   copy 2", 12, "bold",
               fill="#c62828"),
            _t(ax + 15, 400, f"+ UDP 8 + IP 20 = {outer['ip_len']} B", 11)]
    # Host B, upwards.
    out += [_arrow(bx, 358, bx, 337),
            _t(bx + 15, 353, f"{sc['recv']} {rcv['len']} B   copy 3", 12, "bold",
               fill="#c62828"),
            _t(bx + 15, 292, f"source {rcv['source']} holds a lease: accepted", 11),
            _t(bx + 15, 310, f"TTL {rcv['packet']['ttl']} -> {wr['packet']['ttl']}", 11),
            _arrow(bx, 248, bx, 227),
            _t(bx + 15, 243, f"write() {wr['len']} B   copy 4", 12, "bold", fill="#c62828"),
            _t(bx + 15, 175, f"{B['route_get'].get('text', '')}", 11),
            _t(bx + 15, 195, f"to the workload with TTL {wr['packet']['ttl'] - 1}", 11),
            _arrow(bx, 133, bx, 112)]
    # The wire.
    wl = wire.get("outer", {}).get("tot_len", outer["ip_len"])
    out += [f'<path d="M{ax},420 L{ax},460 L{bx},460 L{bx},422" fill="none" stroke="#c62828" '
            'stroke-width="3" marker-end="url(#arrow)"/>',
            _t(W / 2, 452, f"{A['underlay_ip']}:{port} -> {B['underlay_ip']}:{port}  "
               f"UDP, {wl} B on the wire = {outer['payload']} inner + 28", 12, "bold", "middle"),
            _t(W / 2, 485, f"veth {A['iface']} -- bridge -- veth {B['iface']}"
               + ("  (seen by the tap)" if wire else ""), 11, anchor="middle")]
    # Measured costs.
    y = 530
    cA = ping["counters"]["A"]
    copied = readings.bytes_copied(cA)
    out.append(_t(40, y, f"one ping (request + reply) cost A's engine {cA.get('syscalls')} "
                         f"syscalls and {copied} bytes of copies; RTT "
                         f"{ping['result'].get('rtt_ms')} ms", 12))
    for kind, b in result.get("bursts", {}).items():
        y += 20
        out.append(_t(40, y, f"burst, {kind} engine: {b['send_side'].get('syscalls_per_packet')}"
                             f" syscalls/packet sending, {b['receive_side'].get('syscalls_per_packet')}"
                             f" receiving (avg batch {b['send_side'].get('avg_batch')} / "
                             f"{b['receive_side'].get('avg_batch')})", 12))
    y += 22
    out.append(_t(40, y, "per packet, beyond the applications' own: direct routing and VXLAN "
                         "0 copies, 0 syscalls;", 11, fill="#555"))
    y += 16
    out.append(_t(40, y, "TUN + UDP 4 copies and 4 syscalls + wakeups; batching cuts the "
                         "syscalls, never the copies", 11, fill="#555"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write(result: dict, path: str) -> str:
    write_atomic(path, render(result))
    return path
