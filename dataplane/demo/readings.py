"""What the demo reads from the engines and the host tools, as plain data (no I/O).

``facts.py`` and ``probes.py`` collect raw text and counters from the running overlay; the
functions here turn them into the dicts the steps show: a ping's timeline from the two trace rings,
one leg of a packet, a cost row per engine and the closing cost table, the leases in etcd (read with
the control plane's own parser, ``control/lease.py``), the facts of ``ping``, ``ip link``/``ip
addr``, ``ss`` and the daemon's log.
"""
from __future__ import annotations

import base64
import ipaddress
import json
import re

from ..control.lease import lease_from_kv
from . import trace as tr


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
    # the address of an IPv6 ping's reply has colons, and a colon follows it
    m = re.search(r"(\d+) bytes from ([\da-fA-F.:]+): icmp_seq=(\d+) ttl=(\d+) time=([\d.]+)",
                  out)
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


# -- etcd ---------------------------------------------------------------------------------------

def etcd_kvs(etcdctl_json: str) -> dict:
    """{key: value} of ``etcdctl get --prefix ... -w json`` (keys and values come base64)."""
    kvs = json.loads(etcdctl_json).get("kvs", [])
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
            for kv in kvs}


def lease_fact(key: str, value: str) -> dict:
    """One lease as the steps show it: the value as etcd holds it, the subnets and the PublicIP as
    a daemon reads them. Raises LeaseFormatError (a ValueError) for what no daemon would accept."""
    lease = lease_from_kv(key, value)
    fact = {"key": key, "subnet": str(lease.subnet), "public_ip": str(lease.public_ip),
            "value": json.loads(value)}
    if lease.ipv6_subnet is not None:
        fact["ipv6_subnet"] = str(lease.ipv6_subnet)
    return fact


def lease_for(leases: list, peer: str, dst: str) -> dict | None:
    """The lease (of ``lease_fact``) whose PublicIP is ``peer`` and whose subnet (or IPv6 part,
    for an IPv6 ``dst``) holds ``dst``."""
    addr = ipaddress.ip_address(dst)
    key = "ipv6_subnet" if addr.version == 6 else "subnet"
    return next((l for l in leases if l["public_ip"] == peer and l.get(key)
                 and addr in ipaddress.ip_network(l[key])), None)


# -- the daemon's log, the kernel's routes, the echo service ------------------------------------

# daemon/peer_log.py's line for a peer joining, in flanneld's words.
_PEER_ADDED = "Subnet added: "


def peers_added(log_text: str) -> list[str]:
    """What the daemon said of each peer it added (the text after "Subnet added: ")."""
    return [ln.split(_PEER_ADDED, 1)[1].strip() for ln in log_text.splitlines()
            if _PEER_ADDED in ln]


def has_route(route_lines: list, route: str) -> bool:
    """Whether ``ip route`` (as squeezed_lines) holds ``route``, attributes after it allowed,
    and a nexthop object's id after the destination (DirectRouting's routes where the kernel
    has them: ``<subnet> nhid I via <PublicIP> dev ...``)."""
    lines = [_NHID.sub(" ", ln, count=1) for ln in route_lines]
    return any(ln == route or ln.startswith(route + " ") for ln in lines)


_NHID = re.compile(r" nhid \d+ ")


def echo_seen(text: str) -> dict | None:
    """The last datagram the echo service (lab.UDP_ECHO) answered: who sent it, its size."""
    seen = [ln.split() for ln in text.splitlines() if ln.startswith("echo ")]
    if not seen:
        return None
    _, ip, port, n = seen[-1]
    return {"from": ip, "sport": int(port), "len": int(n)}


# -- the closing cost tables --------------------------------------------------------------------

def cost_summary(r: dict) -> dict:
    """The model's rows, flanneld's loop, then what this run measured (the one ping, each engine's
    burst): per packet from A's application to B's, over both hosts, beyond the applications' own
    send and recv. ``r``: the demo's result so far (probes, bursts, engine)."""
    ping = r["probes"]["ping"]
    cA, cB = ping["counters"]["A"], ping["counters"]["B"]
    bursts = r.get("bursts", {})
    measured = [{"engine": k, "send": v["send_side"].get("syscalls_per_packet"),
                 "receive": v["receive_side"].get("syscalls_per_packet"),
                 "send_batch": v["send_side"].get("avg_batch"),
                 "receive_batch": v["receive_side"].get("avg_batch")}
                for k, v in bursts.items()]
    ref = tr.FLANNELD_REFERENCE
    rows = [dict(m, measured=False) for m in tr.COST_MODEL]
    rows.append({"path": "flanneld's own loop (docs/design.md reference)", "short": "flanneld",
                 "crossings": 4, "copies": 4, "syscalls": round(ref["send"] + ref["receive"], 2),
                 "bytes_added": tr.OVERHEAD, "measured": True})
    one = _one_ping_row(ping, r["engine"])
    if one:
        rows.append(one)
    rows += [_burst_row(m, bursts[m["engine"]]) for m in measured
             if m["send"] is not None and m["receive"] is not None]
    return {"model": tr.COST_MODEL, "rows": rows, "measured": measured,
            "single_ping": {"A": cA.get("syscalls"), "B": cB.get("syscalls"), "packets_each": 2},
            "reference_flanneld": ref}


def _one_ping_row(ping: dict, engine: str) -> dict | None:
    # Copies = bytes the engines moved across the boundary / packet size (tun_rx + udp_tx on the
    # sending host, udp_rx + tun_tx on the receiving one).
    cA, cB = ping["counters"]["A"], ping["counters"]["B"]
    n_a = cA.get("tun_rx_packets", 0) + cA.get("udp_rx_packets", 0)
    n_b = cB.get("tun_rx_packets", 0) + cB.get("udp_rx_packets", 0)
    req = ping.get("request", {})
    plen = req.get("tun_read", {}).get("len")
    if not (n_a and n_b and plen):
        return None
    copies = round(bytes_copied(cA) / (n_a * plen) + bytes_copied(cB) / (n_b * plen), 2)
    wire = req.get("wire")
    return {"path": f"this run: one ping, {engine} engine (nothing to batch)",
            "short": "one ping", "crossings": copies, "copies": copies,
            "syscalls": round(cA["syscalls"] / n_a + cB["syscalls"] / n_b, 2),
            "bytes_added": (wire["outer"]["tot_len"] - plen) if wire else tr.OVERHEAD,
            "measured": True}


def _burst_row(m: dict, b: dict) -> dict:
    sent_bytes = b["send_side"]["packets"] * b["ip_len"]
    recv_bytes = b["receive_side"]["packets"] * b["ip_len"]
    copies = round(b["send_side"]["bytes_copied"] / sent_bytes
                   + b["receive_side"]["bytes_copied"] / recv_bytes, 2)
    return {"path": f"this run: {m['engine']} engine under load (batched)",
            "short": f"{m['engine']} burst", "crossings": copies, "copies": copies,
            "syscalls": round(m["send"] + m["receive"], 2),
            "bytes_added": tr.OVERHEAD, "measured": True}


def direct_summary(r: dict) -> dict:
    """The model's rows and the one ping on the direct path: the engines' byte and call counters
    during it, the wire tap's length."""
    return measured_summary(r, f"this run: one ping, DirectRouting ({r['engine']} engine)",
                            "one ping, direct", r["probes"]["ping"]["request"]["wire"]["tot_len"])


def measured_summary(r: dict, path: str, short: str, wire_len: int) -> dict:
    """The model's rows and a measured row for the one ping: the engines' byte and call counters
    during it, the wire's length (``wire_len``: the request's IP bytes as the tap saw them)."""
    ping = r["probes"]["ping"]
    cA, cB = ping["counters"]["A"], ping["counters"]["B"]
    plen = ping["result"]["expected_len"]
    packets = 2                  # the request and the reply
    calls = sum(c.get(k, 0) for c in (cA, cB)
                for k in ("tun_reads", "tun_writes", "udp_sends", "udp_recvs"))
    copies = round((bytes_copied(cA) + bytes_copied(cB)) / (packets * plen), 2)
    rows = [dict(m, measured=False) for m in tr.COST_MODEL]
    rows.append({"path": path, "short": short, "crossings": copies, "copies": copies,
                 "syscalls": round(calls / packets, 2), "bytes_added": wire_len - plen,
                 "measured": True})
    return {"model": tr.COST_MODEL, "rows": rows}
