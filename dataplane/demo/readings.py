"""What the demo reads from the engines and the host tools, as plain data (no I/O).

:mod:`dataplane.demo.story` runs the overlay and collects raw text and counters; the functions here
turn them into the dicts the renderer shows: a ping's timeline from the two trace rings, one leg of a
packet, a cost row per engine, the facts of ``ping``, ``ip link``/``ip addr`` and ``ss`` output.
"""
from __future__ import annotations

import re


def timeline(req: dict, rep: dict, sc: dict) -> dict:
    """The ping's trip as the two engines timed it, in time order.

    Both daemons run on one kernel, so their CLOCK_MONOTONIC stamps compare
    directly. Each event is stamped when its syscall has returned; ``reordered``
    says whether time order differs from path order (it does when a send call
    returns only after the kernel has already delivered the datagram on the
    other side: on this testbed veth -> bridge -> veth runs inside the sender's
    syscall, as softirq work on its way out)."""
    marks = [("A", "TUN_READ", "read()", req, "tun_read"),
             ("A", "UDP_SEND", sc["send"], req, "udp_send"),
             ("B", "UDP_RECV", sc["recv"], req, "udp_recv"),
             ("B", "TUN_WRITE", "write()", req, "tun_write"),
             ("B", "TUN_READ", "read()", rep, "tun_read"),
             ("B", "UDP_SEND", sc["send"], rep, "udp_send"),
             ("A", "UDP_RECV", sc["recv"], rep, "udp_recv"),
             ("A", "TUN_WRITE", "write()", rep, "tun_write")]
    events = []
    for order, (host, kind, call, leg, key) in enumerate(marks):
        ts = leg.get(key, {}).get("ts_ns")
        if ts is not None:
            events.append({"host": host, "event": kind, "call": call, "path_order": order,
                           "packet": "request" if leg is req else "reply", "ts_ns": ts})
    events.sort(key=lambda e: e["ts_ns"])
    t0 = prev = events[0]["ts_ns"] if events else 0
    for e in events:
        e["t_us"] = round((e["ts_ns"] - t0) / 1e3, 1)
        e["delta_us"] = round((e["ts_ns"] - prev) / 1e3, 1)
        prev = e["ts_ns"]
    order = [e["path_order"] for e in events]
    return {"events": events, "reordered": order != sorted(order),
            "total_us": events[-1]["t_us"] if events else None}


def bytes_copied(c: dict) -> int:
    return sum(c.get(k, 0) for k in ("tun_rx_bytes", "udp_tx_bytes", "udp_rx_bytes",
                                     "tun_tx_bytes"))


def syscalls_per_packet(c: dict) -> str:
    n = c.get("tun_rx_packets", 0) + c.get("udp_rx_packets", 0)
    return f"{c.get('syscalls', 0) / n:.1f}" if n else "?"


def squeezed_lines(text: str) -> list[str]:
    return [" ".join(ln.split()) for ln in text.splitlines() if ln.strip()]


def leg_summary(leg: dict) -> dict:
    out = {"src": leg["src"], "dst": leg["dst"]}
    for k in ("tun_read", "udp_send", "udp_recv", "tun_write"):
        if k in leg:
            out[k] = {x: leg[k][x] for x in ("len", "batch", "peer", "source")
                      if x in leg[k]}
            if "packet" in leg[k]:
                out[k]["ttl"] = leg[k]["packet"]["ttl"]
    if "route_hit" in leg:
        out["route_hit"] = {"peer": leg["route_hit"]["peer"], "port": leg["route_hit"]["port"],
                            "prefixlen": leg["route_hit"]["prefixlen"]}
    out["outer"] = leg.get("outer")
    if leg.get("wire"):
        out["wire_ip_len"] = leg["wire"]["outer"]["tot_len"]
    return out


def cost_row(c: dict) -> dict:
    keys = ("syscalls", "polls", "tun_reads", "tun_writes", "udp_sends", "udp_recvs",
            "tun_rx_packets", "udp_tx_packets", "udp_rx_packets", "tun_tx_packets",
            "tun_rx_bytes", "udp_tx_bytes", "udp_rx_bytes", "tun_tx_bytes")
    row = {k: c.get(k, 0) for k in keys}
    row["packets"] = c.get("tun_rx_packets", 0) + c.get("udp_rx_packets", 0)
    row["bytes_copied"] = bytes_copied(c)
    return row


def parse_ping(out: str, rc: int) -> dict:
    res = {"rc": rc, "output": out.strip().splitlines()[:2]}
    m = re.search(r"(\d+) bytes from ([\d.]+): icmp_seq=(\d+) ttl=(\d+) time=([\d.]+)", out)
    if m:
        res.update(received=1, reply_bytes=int(m.group(1)), ttl=int(m.group(4)),
                   rtt_ms=float(m.group(5)))
    else:
        res["received"] = 0
    return res


def flannel0_facts(addr_text: str, link_text: str) -> dict:
    out = {}
    m = re.search(r"inet (\S+)", addr_text)
    if m:
        out["addr"] = m.group(1)
    m = re.search(r"mtu (\d+)", link_text)
    if m:
        out["mtu"] = int(m.group(1))
    m = re.search(r"qlen (\d+)", link_text)
    if m:
        out["qlen"] = int(m.group(1))
    return out


def udp_socket_line(ss_text: str, port: int) -> str | None:
    for line in ss_text.splitlines():
        if f":{port} " in line:
            return " ".join(line.split())
    return None
