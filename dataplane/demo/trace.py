"""From what the running system says to the facts the steps show. No I/O here.

Inputs are what the demo collected from the overlay:

* the engines' trace events, as the daemon serves them at ``GET /debug/trace``
  (``head`` in hex; the events are recorded by the engine's own loop, so what
  we show is what the daemon did, not a re-enactment);
* the daemons' ``/metrics`` (the engine counters, incl. the syscall counters);
* ``ip route get`` output, the leases in etcd, and frames from a wire tap.

Output: plain dicts (JSON-able): one packet's leg through two engines, the
engine counters, the outer datagram, the cost per packet; ``steps.py`` puts
them into the steps. Headers are decoded with :mod:`dataplane.engine.ipv4` (the project's
one IPv4 decoder); only the 8 bytes of UDP/ICMP after it are unpacked here.
"""
from __future__ import annotations

import ipaddress
import re
import struct

from ..daemon.metrics import ENGINE_COUNTERS, FAMILY_LABELLED, SYSCALL_REST
from ..engine import ipv4
from ..engine.contract import V6_SHARES
from .inner6 import decode as decode_packet6, flow_key

#: flannel's udp backend adds exactly an outer IPv4 header and a UDP header.
OUTER_IP = 20
OUTER_UDP = 8
OVERHEAD = OUTER_IP + OUTER_UDP          # 28: why FLANNEL_MTU = interface MTU - 28
VXLAN_OVERHEAD = 50                      # outer IP 20 + UDP 8 + VXLAN 8 + inner Ethernet 14
ETHERNET = 14


# -- metrics ----------------------------------------------------------------------------------

_METRIC = re.compile(r'^(flannel_udp_[a-z_]+)(?:\{(.*)\})?$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
# (family, label value other than queue) -> engine counter: daemon/metrics.py's table inverted.
_COUNTER_OF = {fam_value: stat for stat, fam_value in ENGINE_COUNTERS.items()}


def stats_from_metrics(metrics: dict) -> dict:
    """The engine counters (STAT_NAMES keys) back out of the daemon's /metrics, summed over the
    queues.

    ``metrics`` is {"name{labels}": value} (Overlay.metrics). The mapping is the inverse of
    dataplane/daemon/metrics.py's ENGINE_COUNTERS; ``syscalls`` is the sum of every kind, as the
    engine counts it; a counter's families add up to it, and its ``family="ipv6"`` sample is its
    IPv6 share (V6_SHARES).
    """
    out: dict = {}
    for key, value in metrics.items():
        m = _METRIC.match(key)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        # parse_metrics' sums over the queues or the families: counted already
        if "queue" not in labels or "family" not in labels and m.group(1) in FAMILY_LABELLED:
            continue
        # The kernel path's programs count on no queue (kernel_readings.py reads them); a sample
        # labelled by datapath is also served summed over it, counted here once, without it.
        if labels.get("queue") == "none" or "datapath" in labels:
            continue
        family = labels.pop("family", None)
        others = [v for k, v in labels.items() if k != "queue"]
        stat = _COUNTER_OF.get((m.group(1), others[0] if others else None))
        if stat is None:
            continue
        v = int(value)
        out[stat] = out.get(stat, 0) + v
        if family == "ipv6" and stat in V6_SHARES:
            out[V6_SHARES[stat]] = out.get(V6_SHARES[stat], 0) + v
        if m.group(1) == ENGINE_COUNTERS[SYSCALL_REST][0] and stat != SYSCALL_REST:
            out[SYSCALL_REST] = out.get(SYSCALL_REST, 0) + v
    return out


def delta(before: dict, after: dict) -> dict:
    """after - before for every counter in ``after``."""
    return {k: v - before.get(k, 0) for k, v in after.items()}


def by_label(metrics: dict, family: str, label: str) -> dict:
    """{value of ``label``: sample} for the samples of ``family`` that carry that label only
    (``flannel_udp_peers_by_mode`` -> {"direct": 1.0, ...})."""
    out = {}
    for key, value in metrics.items():
        m = _METRIC.match(key)
        if not m or m.group(1) != family:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        if set(labels) == {label}:
            out[labels[label]] = value
    return out


# -- ip route get -----------------------------------------------------------------------------

def parse_route_get(text: str) -> dict:
    """``10.5.14.2 from 10.5.40.2 dev flannel0 src 10.5.40.0 uid 0`` -> dict of the fields."""
    line = " ".join(text.split("\n")[0].split())
    words = line.split()
    out = {"text": line.strip()}
    if words:
        out["dst"] = words[0]
    for i, w in enumerate(words[:-1]):
        if w in ("from", "via", "dev", "src", "iif", "table", "uid", "mtu"):
            out.setdefault(w, words[i + 1])
    return out


def route_for(routes_text: str, dst: str) -> str | None:
    """The line of ``ip route`` that ``ip route get`` must have used: the longest
    prefix containing ``dst`` (for the demo's small tables that is the kernel's answer)."""
    best, best_len = None, -1
    addr = ipaddress.IPv4Address(dst)
    for line in routes_text.splitlines():
        first = line.split()[0] if line.split() else ""
        try:
            net = ipaddress.IPv4Network("0.0.0.0/0" if first == "default" else first,
                                        strict=False)
        except ValueError:
            continue
        if addr in net and net.prefixlen > best_len:
            best, best_len = line.strip(), net.prefixlen
    return best


# -- packets ----------------------------------------------------------------------------------

def decode_packet(head: bytes, length: int | None = None) -> dict:
    """The IPv4 header (and the UDP ports / ICMP type, id, seq) of a packet's first bytes."""
    h = ipv4.parse(head)
    out = {"version": h.version, "ihl": h.ihl, "header_len": h.header_len, "tos": h.tos,
           "tot_len": h.tot_len, "id": h.ident, "df": h.dont_fragment, "ttl": h.ttl,
           "proto": ipv4.PROTO_NAMES.get(h.proto, str(h.proto)), "checksum": h.checksum,
           "checksum_ok": ipv4.header_checksum_ok(head), "src": str(h.src), "dst": str(h.dst),
           "summary": ipv4.describe(head)}
    l4 = bytes(head[h.header_len:h.header_len + 8])
    if h.proto == ipv4.PROTO_UDP and len(l4) >= 8:
        sport, dport, ulen, _ = struct.unpack("!HHHH", l4)
        out["udp"] = {"sport": sport, "dport": dport, "len": ulen}
    elif h.proto == ipv4.PROTO_ICMP and len(l4) >= 8:
        typ, code, _, ident, seq = struct.unpack("!BBHHH", l4)
        out["icmp"] = {"type": typ, "code": code, "id": ident, "seq": seq,
                       "name": {0: "echo reply", 8: "echo request", 3: "unreachable",
                                11: "time exceeded"}.get(typ, f"type {typ}")}
    if length is not None:
        out["len"] = length
    return out


def decode_inner(head: bytes, length: int | None = None) -> dict:
    """An inner packet of either family (its version nibble says which): decode_packet, or
    inner6.decode for IPv6. ValueError when too short."""
    if head and head[0] >> 4 == 6:
        return decode_packet6(head, length)
    return decode_packet(head, length)


def event_packet(ev: dict) -> dict | None:
    """Decode an event's head (hex from /debug/trace, or bytes), IPv4 or IPv6; None if it has
    none."""
    head = ev.get("head") or b""
    if isinstance(head, str):
        head = bytes.fromhex(head)
    if len(head) < ipv4.HEADER_MIN:
        return None
    try:
        return decode_inner(head, ev.get("len"))
    except ValueError:
        return None


def matches(pkt: dict | None, src: str, dst: str, proto: str) -> bool:
    return bool(pkt) and pkt["src"] == src and pkt["dst"] == dst and pkt["proto"] == proto


def decode_frame(hex_frame: str) -> dict:
    """A frame from the wire tap: Ethernet + outer IPv4 + UDP, then the inner packet."""
    frame = bytes.fromhex(hex_frame)
    ip = frame[ETHERNET:]
    outer = decode_packet(ip)
    inner = ip[outer["header_len"] + OUTER_UDP:]
    try:
        return {"outer": outer, "inner": decode_inner(inner) if len(inner) >= 20 else None}
    except ValueError:          # an IPv6 packet cut short by the tap
        return {"outer": outer, "inner": None}


# -- following one packet ---------------------------------------------------------------------

def _first(events, pred, after_seq: int = 0):
    for ev in events:
        if ev["seq"] > after_seq and pred(ev):
            return ev
    return None


def follow(send_events: list, recv_events: list, src: str, dst: str, proto: str) -> dict:
    """One packet's trip through two engines, found in their trace rings.

    On the sender: the TUN_READ whose header is src > dst (proto), the ROUTE_HIT
    that follows it (the loop looks up each packet right after reading it), and
    the next UDP_SEND to that peer (one sendmmsg per batch, later). On the
    receiver: the UDP_RECV carrying the same header, then its TUN_WRITE.
    The IP id ties the two sides together (no hop changes it); for an inner IPv6 packet,
    which has none, the ICMPv6 echo's id and sequence or the ports (inner6.flow_key).
    """
    leg = {"src": src, "dst": dst, "proto": proto}
    rd = _first(send_events, lambda e: e["kind"] == "tun_read"
                and matches(event_packet(e), src, dst, proto))
    if rd is None:
        return leg
    pkt = event_packet(rd)
    leg["tun_read"] = {"seq": rd["seq"], "ts_ns": rd["ts_ns"], "len": rd["len"], "packet": pkt,
                       "head": _hex(rd.get("head"))}
    hit = _first(send_events, lambda e: e["kind"] in ("route_hit", "route_miss", "drop"),
                 rd["seq"])
    if hit is None:
        return leg
    if hit["kind"] != "route_hit":
        leg["dropped"] = {"kind": hit["kind"], "addr": hit["addr"], "reason": hit.get("batch")}
        return leg
    leg["route_hit"] = {"seq": hit["seq"], "prefixlen": hit["len"], "peer": hit["addr"],
                        "port": hit["port"]}
    snd = _first(send_events, lambda e: e["kind"] == "udp_send" and e["addr"] == hit["addr"]
                 and e["len"] == rd["len"], hit["seq"])
    if snd is not None:
        leg["udp_send"] = {"seq": snd["seq"], "ts_ns": snd["ts_ns"], "peer": snd["addr"],
                           "port": snd["port"], "len": snd["len"], "batch": snd["batch"]}
    ident = flow_key(pkt)
    rcv = _first(recv_events, lambda e: e["kind"] == "udp_recv"
                 and matches(event_packet(e), src, dst, proto)
                 and flow_key(event_packet(e)) == ident)
    if rcv is None:
        return leg
    leg["udp_recv"] = {"seq": rcv["seq"], "ts_ns": rcv["ts_ns"], "source": rcv["addr"],
                       "sport": rcv["port"], "len": rcv["len"], "batch": rcv["batch"],
                       "packet": event_packet(rcv), "head": _hex(rcv.get("head"))}
    wr = _first(recv_events, lambda e: e["kind"] in ("tun_write", "drop") and (
        e["kind"] == "drop" or (matches(event_packet(e), src, dst, proto)
                                and flow_key(event_packet(e)) == ident)), rcv["seq"])
    if wr is not None and wr["kind"] == "tun_write":
        leg["tun_write"] = {"seq": wr["seq"], "ts_ns": wr["ts_ns"], "len": wr["len"],
                            "packet": event_packet(wr), "head": _hex(wr.get("head"))}
    elif wr is not None:
        leg["dropped"] = {"kind": "drop", "reason": wr.get("batch"), "len": wr["len"]}
    return leg


def _hex(head) -> str:
    if head is None:
        return ""
    return head if isinstance(head, str) else bytes(head).hex()


#: What a leg must hold for the story to tell it: each engine event of the path, in path order.
LEG_EVENTS = ("tun_read", "route_hit", "udp_send", "udp_recv", "tun_write")


def follow_both(events: dict, frames: list, workloads: tuple, underlay: tuple, port: int,
                proto: str) -> tuple[dict, dict]:
    """A probe's request (A -> B) and reply (B -> A), each followed through both engines' trace
    rings (``events`` by role "A"/"B"), with the outer datagram built around it and the frame the
    wire tap saw. ``workloads``, ``underlay``: the (A, B) addresses."""
    req = follow(events["A"], events["B"], workloads[0], workloads[1], proto)
    rep = follow(events["B"], events["A"], workloads[1], workloads[0], proto)
    for leg, src, dst in ((req, underlay[0], underlay[1]), (rep, underlay[1], underlay[0])):
        if "tun_read" in leg:
            inner = leg["tun_read"]["packet"]
            leg["outer"] = outer_datagram(leg["tun_read"]["len"], src,
                                          leg.get("route_hit", {}).get("peer", "?"), port)
            leg["wire"] = wire_frame_for(frames, src, dst, flow_key(inner), inner["src"])
    return req, rep


def missing_events(*legs: dict) -> list[str]:
    """The events of LEG_EVENTS that one of ``legs`` lacks, in path order."""
    return [k for k in LEG_EVENTS if any(k not in leg for leg in legs)]


def outer_datagram(inner_len: int, src_ip: str, dst_ip: str, port: int) -> dict:
    """What the kernel builds around the payload the engine hands to sendmmsg()."""
    return {"src": src_ip, "sport": port, "dst": dst_ip, "dport": port,
            "payload": inner_len, "udp_len": inner_len + OUTER_UDP,
            "ip_len": inner_len + OVERHEAD, "frame_len": inner_len + OVERHEAD + ETHERNET,
            "overhead": OVERHEAD}


def wire_frame_for(frames: list, src_ip: str, dst_ip: str, inner_id: int, inner_src: str):
    """The tapped frame whose outer header is src_ip > dst_ip and inner packet has that id
    (inner6.flow_key: an IPv4 id, or what stands for it in IPv6)."""
    for f in frames:
        try:
            d = decode_frame(f["hex"])
        except (ValueError, KeyError):
            continue
        inner = d["inner"]
        if (d["outer"]["src"] == src_ip and d["outer"]["dst"] == dst_ip and inner
                and flow_key(inner) == inner_id and inner["src"] == inner_src):
            d["frame_len"] = f["frame_len"]
            d["direction"] = "out" if f.get("pkttype") == 4 else "in"
            return d
    return None


# -- the direct path (DirectRouting) -----------------------------------------------------------

def plain_frames(frames: list, src: str, dst: str, proto: str, t0: float, t1: float) -> list:
    """Tapped frames (tap ``between`` the workloads) that carry a packet src > dst of ``proto``
    as it is - no outer header - taken between monotonic times t0 and t1, decoded."""
    out = []
    for f in frames:
        if not t0 <= f.get("t", t0) <= t1:
            continue
        try:
            pkt = decode_packet(bytes.fromhex(f["hex"])[ETHERNET:])
        except (ValueError, KeyError):
            continue
        if matches(pkt, src, dst, proto):
            out.append(dict(pkt, frame_len=f["frame_len"],
                            direction="out" if f.get("pkttype") == 4 else "in"))
    return out


def direct_leg(frames: list, send_events: list, recv_events: list, src: str, dst: str,
               proto: str, t0: float, t1: float) -> dict:
    """One packet of a probe on the direct path: as the wire tap saw it, and the engines'
    trace events of the window that carry it (none when the kernel routed it host to host)."""
    wire = plain_frames(frames, src, dst, proto, t0, t1)
    leg = {"src": src, "dst": dst, "proto": proto, "wire": wire[0] if wire else None,
           "wire_frames": len(wire)}
    leg["engine_events"] = [
        {"seq": e["seq"], "kind": e["kind"]} for e in list(send_events) + list(recv_events)
        if matches(event_packet(e), src, dst, proto)]
    return leg


def direct_legs(frames: list, probe: dict, workloads: tuple, proto: str) -> tuple[dict, dict]:
    """A probe's request and reply on the direct path (``probe``: its measurement window, with
    the engines' events by role and its times t0, t1; ``workloads``: the (A, B) addresses)."""
    ev, t0, t1 = probe["events"], probe["t0"], probe["t1"]
    wa, wb = workloads
    return (direct_leg(frames, ev["A"], ev["B"], wa, wb, proto, t0, t1),
            direct_leg(frames, ev["B"], ev["A"], wb, wa, proto, t0, t1))


def link_counters(ip_json: str) -> dict:
    """rx/tx packets and bytes of a link, from ``ip -s -j link show <dev>``."""
    import json
    try:
        st = json.loads(ip_json)[0]["stats64"]
    except (ValueError, IndexError, KeyError, TypeError):
        return {}
    return {f"{d}_{k}": st[d][k] for d in ("rx", "tx") for k in ("packets", "bytes")}


# -- costs ------------------------------------------------------------------------------------

def per_packet(d: dict, side: str) -> dict:
    """Syscalls per packet from counter deltas of a burst, on one side of the path.

    Send side (host A: TUN -> UDP): per packet read from the TUN. Receive side
    (host B: UDP -> TUN): per datagram received. The other direction's counters
    on the same host are ~0 during a one-way burst, so the totals are fair.
    """
    if side == "send":
        n = d.get("tun_rx_packets", 0)
        batches = d.get("tx_batches", 0)
        mm = d.get("udp_sends", 0)
    else:
        n = d.get("udp_rx_packets", 0)
        batches = d.get("rx_batches", 0)
        mm = d.get("udp_recvs", 0)
    if n <= 0:
        return {"packets": 0}

    def r(x):
        return round(x / n, 3)
    return {"packets": n, "syscalls": d.get("syscalls", 0),
            "syscalls_per_packet": r(d.get("syscalls", 0)),
            "tun_reads_per_packet": r(d.get("tun_reads", 0)),
            "tun_writes_per_packet": r(d.get("tun_writes", 0)),
            "udp_sends_per_packet": r(d.get("udp_sends", 0)),
            "udp_recvs_per_packet": r(d.get("udp_recvs", 0)),
            "polls_per_packet": r(d.get("polls", 0)),
            "mmsg_calls_per_packet": r(mm),
            "avg_batch": round(n / batches, 2) if batches else None,
            "bytes_copied": (d.get("tun_rx_bytes", 0) + d.get("udp_tx_bytes", 0)) if side == "send"
            else (d.get("udp_rx_bytes", 0) + d.get("tun_tx_bytes", 0))}


#: What one packet from an application on A to one on B costs, beyond the two
#: applications' own send()/recv() (1 syscall + 1 copy each, the same on every path).
#: "crossings": times the packet itself crosses the user/kernel boundary;
#: "copies": times its bytes are copied between kernel and user memory (one per crossing);
#: "syscalls": user->kernel->user round trips made for this packet by someone else
#: than the applications (the forwarder), without batching.
COST_MODEL = [
    {"path": "direct routing (host-gw)", "short": "direct routing", "crossings": 0, "copies": 0,
     "syscalls": 0, "bytes_added": 0,
     "why": "the kernel routes the packet from veth to veth; nothing in user space"},
    {"path": "kernel VXLAN (flannel vxlan)", "short": "kernel VXLAN", "crossings": 0, "copies": 0,
     "syscalls": 0, "bytes_added": VXLAN_OVERHEAD,
     "why": "encapsulation is a header pushed in front of the same buffer (skb), in the kernel"},
    {"path": "TUN + UDP in user space, unbatched", "short": "TUN + UDP", "crossings": 4, "copies": 4,
     "syscalls": 4, "bytes_added": OVERHEAD,
     "why": "A: read() from flannel0 (copy out) + sendmmsg() (copy in); "
            "B: recvmmsg() (copy out) + write() into flannel0 (copy in); plus the wakeups. "
            "Batching shares the UDP calls and wakeups among packets, never the copies"},
]

#: flanneld's own loop (poll, one read/write per packet), measured on this kind of machine
#: (docs/design.md#reference-points): syscalls per packet send / receive side.
FLANNELD_REFERENCE = {"send": 3.10, "receive": 3.00}
