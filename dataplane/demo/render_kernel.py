"""What the terminal shows under the kernel path's own steps (steps_kernel.py), for
``render.Renderer.SHOWS``: each function takes the renderer, the step and its data, and prints
through the renderer's helpers, so these steps read like the others.
"""
from __future__ import annotations


def _moved(counters: dict) -> str:
    shown = [f"{k} +{v}" for k, v in sorted(counters.items()) if v]
    return ", ".join(shown) or "nothing moved"


def _wire(w: dict | None) -> str:
    if not w:
        return "not captured"
    o, i = w["outer"], w["inner"]
    u = o.get("udp") or {}
    what = (i.get("icmp") or {}).get("name") or i["proto"]
    return (f"{w['direction']}: {o['src']}:{u.get('sport')} > {o['dst']}:{u.get('dport')} "
            f"udp, {o['tot_len']} B  [inner {i['src']} > {i['dst']} {what}, "
            f"{i['tot_len']} B, ttl {i['ttl']}]")


def tc_egress(rnd, step, d):
    rnd.kv("A's programs", _moved(d["counters_A"]) + "   (/metrics, datapath=\"kernel\")",
           style="blue")
    rnd.kv(f"tap on {d['iface']}", _wire(d["wire"]), style="blue")
    if d.get("bytes_added") is not None:
        rnd.kv("bytes added", f"{d['bytes_added']} (outer IPv4 20 + UDP 8) to the "
               f"{d['expected_len']}-byte packet")


def tc_ingress(rnd, step, d):
    rnd.kv("B's programs", _moved(d["counters_B"]) + "   (/metrics, datapath=\"kernel\")",
           style="blue")
    rnd.kv("the reply, on the tap", _wire(d.get("reply_wire")), style="blue")
    reply_and_udp(rnd, d, "B's kernel, B's egress program, A's ingress program, A's kernel",
                  ", by the same programs")


def reply_and_udp(rnd, d, hops: str, udp_by: str = ""):
    """The ping's reply TTL (64 less the ``hops`` that took one off) and the UDP probe's echo:
    the last lines of a step that delivers around the engines (here, and DirectRouting's)."""
    ttl = d.get("reply_ttl")
    if ttl is not None:
        rnd.kv("ping says", f"reply ttl={ttl} = 64 - {64 - ttl} ({hops}), "
               f"time={d.get('rtt_ms')} ms")
    u = d.get("udp") or {}
    rnd.kv("UDP probe", f"{u.get('sent')} bytes to port {u.get('dport')}, echo "
           f"{'received' if u.get('received') else 'LOST'}{udp_by}")


def engines_idle(rnd, step, d):
    t = rnd._table("probe", "host", "engine packets in/out", "engine calls", "bytes copied",
                   "trace events", "the programs' counters that moved")
    for probe in ("ping", "udp"):
        for role in ("A", "B"):
            e = d[probe][role]
            pk = e["packets"]
            t.add_row(probe, role, f"+{pk['tun_rx_packets'] + pk['udp_rx_packets']} / "
                      f"+{pk['udp_tx_packets'] + pk['tun_tx_packets']}", f"+{e['calls']}",
                      str(e["bytes_copied"]), str(e["trace_events"]), _moved(e["programs"]))
    rnd.table(t)


def slow_path(rnd, step, d):
    res = d["result"]
    rnd.kv("probe", f"ping -c 1 -t {res['ttl_sent']}: {res.get('answer') or 'no answer'}")
    rnd.kv("A's programs", _moved(d["programs_A"]), style="blue")
    rnd.kv("A's engine", _moved(d["engine_A"]), style="green")
    rnd.kv("flannel0 on A", f"{d['flannel0']} (the engine answers from it)")


SHOWS = {"tc_egress": tc_egress, "tc_ingress": tc_ingress, "engines_idle": engines_idle,
         "slow_path": slow_path}
