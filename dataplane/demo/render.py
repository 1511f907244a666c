"""Terminal output of the demo: rich where there is a terminal, plain text otherwise.

(Over 450 lines as one piece: ``Renderer.SHOWS`` has one entry per step of the story, which
all print through the same helpers, so that every step reads alike.)

Each step of :mod:`dataplane.demo.story` arrives as a dict; :class:`Renderer`
prints it as a header line (step number, title, which host, which side of the
user/kernel boundary), the measured facts, and a "why" line for the student.
What it prints for each step id is one entry of ``Renderer.SHOWS``.
Colour is only a help: user space green, kernel blue, the boundary yellow;
piped into a file or a pager the same text comes out without escape codes and
with ASCII table borders.
"""
from __future__ import annotations

import sys
import textwrap

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from . import diagram, render_kernel


SIDE_STYLE = {"user": "green", "kernel": "blue", "kernel -> user": "yellow",
              "user -> kernel": "yellow", "control plane": "magenta", "both": "cyan"}


def make_console(file=None) -> Console:
    file = file or sys.stdout
    tty = file.isatty()
    # Not a terminal: no colour, a fixed width, so the text reads the same in a log file.
    if not tty:
        file = _RStrip(file)
    return Console(file=file, highlight=False, soft_wrap=False, emoji=False,
                   width=None if tty else 100, no_color=not tty, force_terminal=None)


class _RStrip:
    """A file that drops the trailing blanks rich pads table and grid lines with
    (only for output that is not a terminal: logs and pipes stay tidy)."""

    def __init__(self, f):
        self.f = f

    def write(self, s: str) -> int:
        lines = s.split("\n")
        self.f.write("\n".join([ln.rstrip() for ln in lines[:-1]] + [lines[-1]]))
        return len(s)

    def flush(self):
        self.f.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self):
        return self.f.fileno()

    @property
    def encoding(self):
        return getattr(self.f, "encoding", "utf-8")


class Renderer:
    def __init__(self, console: Console | None = None, *, pause: bool = False):
        self.c = console or make_console()
        self.ascii = not self.c.is_terminal
        self.pause = pause
        self.total = None
        self.demo = None          # the Demo, for the values steps refer back to

    # -- helpers ---------------------------------------------------------------------------
    def _box(self):
        return box.ASCII if self.ascii else box.SIMPLE_HEAD

    def _arrow(self, s: str) -> str:
        return s.replace("->", "→") if not self.ascii else s

    def _table(self, *cols, title=None) -> Table:
        t = Table(box=self._box(), title=title, title_justify="left", show_edge=not self.ascii,
                  pad_edge=False, header_style="bold")
        for c in cols:
            t.add_column(c)
        return t

    def line(self, text="", style=None):
        self.c.print(text, style=style, markup=False, highlight=False)

    def kv(self, key: str, value, style=None):
        # A two-column grid: a long value wraps under itself, not under the key.
        g = Table.grid(padding=(0, 1))
        g.add_column(width=22, style="dim", no_wrap=True)
        g.add_column(overflow="fold")
        g.add_row(key, Text(str(value), style=style or ""))
        self.c.print(Padding(g, (0, 0, 0, 2), expand=False))

    def table(self, t: Table):
        self.c.print(Padding(t, (0, 0, 0, 2), expand=False))

    def why(self, text: str):
        width = min(self.c.width, 100) - 8
        for i, ln in enumerate(textwrap.wrap(text, width)):
            t = Text("  why   " if i == 0 else "        ", style="bold dim")
            t.append(ln, style="italic")
            self.c.print(t)

    def progress(self, text: str):
        self.c.print(Text(f"  ... {text}", style="dim"))

    # -- steps -----------------------------------------------------------------------------
    def header(self, step: dict):
        side = step.get("side", "")
        self.c.print()
        t = Text()
        t.append(f"{step['n']:>2}. ", style="bold")
        t.append(step["title"], style="bold")
        meta = f"   [host {step.get('host', '')} | {self._arrow(side)}]"
        t.append(meta, style=SIDE_STYLE.get(side, ""))
        self.c.print(t)
        if "syscalls" in step or "copies" in step:
            sc = ", ".join(step.get("syscalls") or []) or "none"
            self.kv("syscalls", sc, style="yellow" if step.get("syscalls") else "dim")
            self.kv("copies", f"{step.get('copies', 0)} (kernel <-> user copies of the packet)"
                    if step.get("copies") else "0", style="yellow" if step.get("copies") else
                    "dim")

    def on_step(self, step: dict):
        show = self.SHOWS.get(step["id"])
        if show is None:
            # A step nobody shows would pass for a step with nothing to show.
            raise KeyError(f"step {step['id']!r} has no entry in Renderer.SHOWS")
        self.header(step)
        show(self, step, step.get("data") or {})
        if step.get("why"):
            self.why(step["why"])
        if self.pause and step["id"] != "summary":
            self._wait()

    def _wait(self):
        try:
            self.c.print(Text("  [Enter: next step]", style="dim"), end="")
            input()
        except EOFError:
            self.c.print()

    def _s_overlay(self, step, d):
        cfg = d["config"]
        self.kv("network config", f"{tr_json(cfg)}   (etcd {self.demo.result['etcd']})")
        t = self._table("etcd key", "PublicIP", "holder", title="leases in etcd")
        hosts = d["hosts"]
        for l in d["leases"]:
            holder = next((f"{r} ({h['name']})" for r, h in hosts.items()
                           if h["underlay_ip"] == l["public_ip"]), "?")
            t.add_row(l["key"], str(l["public_ip"]), holder)
        self.table(t)
        if any("DirectRouting" in (l.get("value") or {}) for l in d["leases"]):
            for l in d["leases"]:
                self.kv("lease value", f"{l['subnet']} = {tr_json(l.get('value'))}")
        for role in ("A", "B"):
            h = hosts[role]
            f0 = h["flannel0_link"]
            self.line(f"  host {role} = {h['name']}: underlay {h['underlay_ip']} ({h['iface']}),"
                      f" daemon pid {h['daemon_pid']}, flannel0 {f0.get('addr')} mtu "
                      f"{f0.get('mtu')}", style="bold")
            self.kv("socket", h.get("socket") or "?")
            env = h["subnet_env"]
            self.kv("subnet.env", "  ".join(f"{k}={v}" for k, v in env.items()))
            for r in h["routes"]:
                self.kv("ip route", r)
            for ln in h.get("peer_log") or []:
                self.kv("daemon log", f"Subnet added: {ln}")
            if h.get("peers_by_mode"):
                self.kv("/metrics", "  ".join(f'peers_by_mode{{mode="{m}"}} {v:g}'
                                              for m, v in sorted(h["peers_by_mode"].items())))
        self.kv("startup", f"{d['startup_s']} s (etcd, 2 daemons, leases, READY=1)")

    def _s_workloads(self, step, d):
        for role in ("A", "B"):
            w = d[role]
            self.kv(f"workload on {role}", f"{w['ip']}/24 via {w['gateway']} "
                    f"(host side {w['host_iface']}, mtu {w['mtu']} = FLANNEL_MTU)")
        self.diagram()

    def _s_app_send(self, step, d):
        self.kv("probe", f"ping -c 1 -s {d['size']} {d['to']}   (from {d['from']}: "
                f"{d['size']} + 8 ICMP + 20 IP = {d['ip_len']} bytes)")
        self.kv("route in workload", d["route_in_workload"].get("text"))

    def _s_kernel_route(self, step, d):
        self.kv("ip route get", d["route_get"].get("text"), style="blue")
        self.kv("matching route", d.get("route"))
        ttl = d["ttl_after_forward"]
        self.kv("TTL", f"{ttl} (the kernel forwarded it: {ttl + 1} - 1)")

    def _s_tun_read(self, step, d):
        p = d["packet"]
        self.kv("read() returned", f"{d['len']} bytes = {p['summary']}", style="green")
        self.header_table(d["head"], p)
        n = d.get("tun_rx_packets") or 0
        extra = d["tun_reads"] - n
        self.kv("engine counters", f"read() x{d['tun_reads']} on flannel0 during this ping: "
                f"{n} packet(s)" + (f" + {extra} that found the queue empty (EAGAIN)"
                                    if extra > 0 else "")
                + f"; epoll_wait() x{d['polls']} (both directions)")

    def _s_lookup(self, step, d):
        lease = d.get("lease") or {}
        self.kv("destination", f"{d['dst']} -> longest prefix /{d['prefixlen']} = "
                f"{lease.get('subnet', '?')}")
        self.kv("lease", f"{lease.get('key', '?')} = {tr_json(lease.get('value'))}")
        self.kv("chosen peer", f"{d['peer']}:{d['port']}  (the lease's PublicIP, Backend.Port)",
                style="green")
        self.kv("TTL", f"{d['ttl_out'] + 1} -> {d['ttl_out']}; checksum 0x{d['checksum_in']:04x} "
                f"-> 0x{d['checksum_out']:04x}, patched, not recomputed (RFC 1624)")

    def _s_udp_send(self, step, d):
        o = d["outer"]
        self.kv("outer datagram", f"{o['src']}:{o['sport']} -> {o['dst']}:{o['dport']}",
                style="green")
        self.kv("sizes", f"payload {o['payload']} (the inner packet) + UDP 8 = {o['udp_len']}; "
                f"+ IP 20 = {o['ip_len']} bytes; {o['frame_len']} on the Ethernet")
        self.kv("overhead", f"{o['ip_len']} - {o['payload']} = {o['overhead']} bytes")
        w = d.get("wire")
        if w:
            ou = w["outer"]
            self.kv("on the wire (tap)", f"{ou['summary']}, DF={'yes' if ou['df'] else 'no'}; "
                    f"inner: {w['inner']['summary'] if w.get('inner') else '?'}", style="blue")
        else:
            self.kv("on the wire (tap)", "not captured", style="dim")
        self.kv("engine counters", f"UDP send calls x{d['udp_sends']} during this ping")

    def _s_udp_recv(self, step, d):
        self.kv("received", f"{d['len']} bytes from {d['source']}:{d['sport']}",
                style="green")
        self.kv("inner packet", d["packet"]["summary"])
        self.kv("source check", f"{d['source']} is a lease's PublicIP: "
                f"{'yes, accepted' if d['source_is_lease'] else 'NO'}")

    def _s_tun_write(self, step, d):
        p = d["packet"]
        self.kv("write() of", f"{d['len']} bytes = {p['summary']}", style="green")
        self.kv("TTL", f"{p['ttl'] + 1} -> {p['ttl']} (the second engine hop), "
                f"checksum 0x{p['checksum']:04x} {'ok' if p['checksum_ok'] else 'BAD'}")

    def _s_deliver(self, step, d):
        self.kv("ip route get", d["route_get"].get("text"), style="blue")
        self.kv("TTL at the workload", f"{d['ttl_at_workload']} = {d['ttl_at_workload'] + 4} "
                "minus two kernel hops and two engine hops")

    def _s_reply(self, step, d):
        rd, hit, snd, rcv, wr = (d["tun_read"], d["route_hit"], d["udp_send"], d["udp_recv"],
                                 d["tun_write"])
        t = self._table("", "host", "what the engine did (trace)", "bytes", "ttl")
        t.add_row("TUN_READ", "B", rd["packet"]["summary"], str(rd["len"]),
                  str(rd["packet"]["ttl"]))
        t.add_row("ROUTE_HIT", "B", f"/{hit['prefixlen']} -> {hit['peer']}:{hit['port']}", "", "")
        t.add_row("UDP_SEND", "B", f"to {snd['peer']}:{snd['port']}, batch {snd['batch']}; "
                  f"outer {d['outer']['ip_len']} B", str(snd["len"]), "")
        t.add_row("UDP_RECV", "A", f"from {rcv['source']}:{rcv['sport']}, batch {rcv['batch']}",
                  str(rcv["len"]), str(rcv["packet"]["ttl"]))
        t.add_row("TUN_WRITE", "A", wr["packet"]["summary"], str(wr["len"]),
                  str(wr["packet"]["ttl"]))
        self.table(t)
        if d.get("wire"):
            self.kv("on the wire (tap)", d["wire"]["outer"]["summary"], style="blue")
        self.kv("ping says", f"reply ttl={d.get('reply_ttl')}, time={d.get('rtt_ms')} ms")
        tl = d.get("timeline") or {}
        if tl.get("events"):
            t = self._table("t (us)", "+ (us)", "host", "engine event", "packet")
            for e in tl["events"]:
                t.add_row(f"{e['t_us']:.1f}", f"{e['delta_us']:.1f}", e["host"],
                          f"{e['event']}: {e['call']} returned", e["packet"])
            self.table(t)
            self.kv("timeline", f"{tl['total_us']:.0f} us from A's read of the request to A's "
                    "write of the reply returning, by the engines' own clocks (one kernel, one "
                    "clock)")
            self.kv("reading it", "each event is stamped when its call returns, and a call "
                    "that hands a packet to the kernel returns only after the kernel has carried "
                    "it on - through veth, bridge, the other host's stack, sometimes up to the "
                    "workload - in softirq work on the caller's CPU. A gap is mostly kernel work "
                    "inside the call that ends it."
                    + (" Here a send even returned after the other host had received the "
                       "datagram." if tl.get("reordered") else ""), style="yellow")

    def _s_wire(self, step, d):
        t = self._table("packet", f"as the tap on {d['iface']} saw it", "IP bytes", "ttl",
                        "frame", "added")
        for r in d["rows"]:
            w = r["wire"]
            if not w:
                t.add_row(r["leg"], "not captured", "-", "-", "-", "-")
                continue
            what = w.get("icmp", {}).get("name") or (
                f"udp {w['udp']['sport']} > {w['udp']['dport']}" if "udp" in w else w["proto"])
            t.add_row(r["leg"], f"{w['direction']}: {w['src']} > {w['dst']} {what}",
                      str(w["tot_len"]), str(w["ttl"]), f"{w['frame_len']} B",
                      f"{r['bytes_added']} B")
        self.table(t)

    def _s_untouched(self, step, d):
        t = self._table("probe", "host", "flannel0 rx/tx packets (kernel)",
                        "engine packets in/out", "trace events")
        for probe in ("ping", "udp"):
            for role in ("A", "B"):
                f0 = d["flannel0"][probe][role]
                e = d["engine"][probe][role]
                t.add_row(probe, role, f"+{f0.get('rx_packets', '?')} / +{f0.get('tx_packets', '?')}",
                          f"+{e['tun_rx_packets'] + e['udp_rx_packets']} / "
                          f"+{e['udp_tx_packets'] + e['tun_tx_packets']}",
                          str(d["trace_events"][probe]) if role == "A" else "")
        self.table(t)
        for role in ("A", "B"):
            m = (d.get("peers_by_mode") or {}).get(role)
            if m:
                self.kv(f"/metrics on {role}", "  ".join(f'peers_by_mode{{mode="{k}"}} {v:g}'
                                                       for k, v in sorted(m.items())))

    def _s_deliver_direct(self, step, d):
        self.kv("ip route get on B", d["route_get"].get("text"), style="blue")
        self.kv("the reply, on B", d["route_get_reply"].get("text"), style="blue")
        w = d.get("reply_wire")
        if w:
            self.kv("reply on the wire", w["summary"], style="blue")
        render_kernel.reply_and_udp(self, d, "kernel hops only")

    def _s_udp_packet(self, step, d):
        res = d["result"]
        self.kv("probe", f"{res['sent']} bytes of UDP to port {res['dport']} "
                f"({res['payload']!r}) -> IP packet {res['expected_len']} B; echo "
                f"{'received' if res.get('received') else 'LOST'} in "
                f"{res.get('rtt_ms', 0):.2f} ms")
        app = res.get("app_received")
        if app:
            self.kv("B's application", f"recvfrom() got {app['len']} bytes from {app['from']}:"
                    f"{app['sport']} - the workload's own address: no NAT, the overlay is flat")
        t = self._table("leg", "TUN_READ", "ROUTE_HIT peer", "UDP_SEND", "outer (+28)",
                        "TUN_WRITE", "on the wire")
        for name, leg in (("A -> B", d["request"]), ("B -> A", d["reply"])):
            t.add_row(name, f"{leg['tun_read']['len']} B ttl {leg['tun_read']['ttl']}",
                      leg["route_hit"]["peer"],
                      f"batch {leg['udp_send']['batch']}",
                      f"{leg['outer']['ip_len']} B",
                      f"{leg['tun_write']['len']} B ttl {leg['tun_write']['ttl']}",
                      f"{leg.get('wire_ip_len', '-')} B" if leg.get("wire_ip_len") else "-")
        self.table(t)

    def _s_ping6(self, step, d):
        res, lease = d["result"], d.get("lease") or {}
        self.kv("probe", f"ping -6 -c 1 -s {res['size']}: {res['size']} + 8 ICMPv6 + 40 IPv6 = "
                f"{res['expected_len']} bytes; reply "
                f"{'received' if res.get('received') else 'LOST'} in {res.get('rtt_ms', 0):.2f} ms")
        self.header6_table(d["head"], d["header"])
        self.kv("lease", f"{lease.get('key', '?')}: IPv6 part {lease.get('ipv6_subnet', '?')}, "
                f"PublicIP {lease.get('public_ip', '?')}")
        t = self._table("leg", "TUN_READ", "ROUTE_HIT", "UDP_SEND", "outer (+28)", "TUN_WRITE",
                        "on the wire")
        for name, leg in (("A -> B", d["request"]), ("B -> A", d["reply"])):
            hit = leg["route_hit"]
            t.add_row(name, f"{leg['tun_read']['len']} B hlim {leg['tun_read']['ttl']}",
                      f"/{hit['prefixlen']} -> {hit['peer']}",
                      f"batch {leg['udp_send']['batch']}", f"{leg['outer']['ip_len']} B",
                      f"{leg['tun_write']['len']} B hlim {leg['tun_write']['ttl']}",
                      f"{leg['wire_ip_len']} B" if leg.get("wire_ip_len") else "-")
        self.table(t)

    def _s_ping_cost(self, step, d):
        sc = d.get("syscall_names", {"send": "sendmmsg()", "recv": "recvmmsg()"})
        t = self._table("host", "packets", "epoll", "read", "write", sc["send"].rstrip("()"),
                        sc["recv"].rstrip("()"), "total", "/packet", "bytes copied")
        for role in ("A", "B"):
            r = d[role]
            n = r["packets"] or 1
            t.add_row(role, str(r["packets"]), str(r["polls"]), str(r["tun_reads"]),
                      str(r["tun_writes"]), str(r["udp_sends"]), str(r["udp_recvs"]),
                      str(r["syscalls"]), f"{r['syscalls'] / n:.1f}", str(r["bytes_copied"]))
        self.table(t)
        self.kv("engine", f"{d.get('engine')}; bytes copied = tun_rx + udp_tx + udp_rx + tun_tx "
                "bytes: each packet crosses twice per host")

    def _s_batching(self, step, d):
        t = self._table("engine", "side", "packets", "syscalls", "TUN r/w", "UDP calls",
                        "epoll", "avg batch", "delivered")
        for kind, b in d["bursts"].items():
            for side, key in (("send A", "send_side"), ("recv B", "receive_side")):
                s = b[key]
                if not s.get("packets"):
                    continue
                tunrw = s["tun_reads_per_packet"] if key == "send_side" \
                    else s["tun_writes_per_packet"]
                t.add_row(kind, side, str(s["packets"]), f"{s['syscalls_per_packet']:.2f}",
                          f"{tunrw:.2f}", f"{s['mmsg_calls_per_packet']:.2f}",
                          f"{s['polls_per_packet']:.2f}", str(s.get("avg_batch")),
                          f"{b['received']}/{b['sent']}")
        self.table(t)
        self.kv("columns", "per packet: all syscalls, TUN reads (A) or writes (B), "
                "sendmmsg/recvmmsg or sendto/recvfrom calls, epoll_wait; EAGAIN calls included")
        ref = d["reference_flanneld"]
        self.kv("flanneld's loop", f"{ref['send']:.2f} / {ref['receive']:.2f} syscalls per "
                "packet (send / receive; poll + one read/write per packet; docs/design.md)")
        for kind, why in (d.get("skipped") or {}).items():
            self.kv(f"{kind} engine", f"not measured: {why}", style="dim")
        first = next(iter(d["bursts"].values()), None)
        if first:
            self.kv("load", f"{first['sent']} datagrams of {first['ip_len']} B from A's "
                    "workload, in bursts of 100")

    def _s_summary(self, step, d):
        self.line("  per packet from A's application to B's, both hosts together, beyond the "
                  "applications' own", style="dim")
        self.line("  send() and recv() (1 syscall + 1 copy each, the same on every path):",
                  style="dim")
        t = self._table("path", "crossings", "copies", "syscalls", "bytes added")
        for m in d["rows"]:
            sc = m["syscalls"]
            t.add_row(m["path"], _num(m["crossings"]), _num(m["copies"]),
                      (f"{sc:.2f}" if isinstance(sc, float) else f"{sc} + wakeups" if sc
                       else "0"),
                      str(m["bytes_added"]), style="yellow" if m.get("measured") else None)
        self.table(t)
        self.kv("crossings", "times the packet itself goes from kernel to user space or back")
        self.kv("copies", "times its bytes are copied on the way (one per crossing)")
        self.kv("syscalls", "user -> kernel -> user round trips of the forwarder for it; "
                "measured rows: from the engine counters (send side + receive side)")
        for m in d["model"]:
            self.kv(m["short"], m["why"])

    #: step id -> what is printed under its header. Every id the story declares
    #: (steps.STEP_IDS) has one, and every entry an id (tests/unit/test_demo_steps.py).
    SHOWS = {"overlay": _s_overlay, "workloads": _s_workloads, "app_send": _s_app_send,
             "kernel_route": _s_kernel_route, "tun_read": _s_tun_read, "lookup": _s_lookup,
             "udp_send": _s_udp_send, "udp_recv": _s_udp_recv, "tun_write": _s_tun_write,
             "deliver": _s_deliver, "reply": _s_reply, "wire": _s_wire,
             "untouched": _s_untouched, "deliver_direct": _s_deliver_direct,
             "udp_packet": _s_udp_packet, "ping6": _s_ping6, "ping_cost": _s_ping_cost,
             "batching": _s_batching,
             "summary": _s_summary, **render_kernel.SHOWS}

    # -- pieces -----------------------------------------------------------------------------
    def header_table(self, head_hex: str, p: dict):
        """The 20 bytes of the IPv4 header the engine read, field by field."""
        raw = bytes.fromhex(head_hex)[:p["header_len"]]
        rows = [("0", raw[0:1], "version / ihl", f"{p['version']} / {p['ihl']} "
                 f"({p['header_len']} bytes)"),
                ("1", raw[1:2], "tos", str(p["tos"])),
                ("2", raw[2:4], "total length", f"{p['tot_len']} (= what read() returned)"),
                ("4", raw[4:6], "identification", str(p["id"])),
                ("6", raw[6:8], "flags / frag", "DF" if p["df"] else "-"),
                ("8", raw[8:9], "TTL", str(p["ttl"])),
                ("9", raw[9:10], "protocol", p["proto"]),
                ("10", raw[10:12], "header checksum", f"0x{p['checksum']:04x} "
                 f"{'ok' if p['checksum_ok'] else 'BAD'}"),
                ("12", raw[12:16], "source", p["src"]),
                ("16", raw[16:20], "destination", p["dst"])]
        t = self._table("offset", "bytes", "field", "value")
        for off, b, name, val in rows:
            t.add_row(off, b.hex(" "), name, val)
        if "icmp" in p:
            ic = p["icmp"]
            t.add_row(str(p["header_len"]), "", "ICMP", f"{ic['name']} id {ic['id']} "
                      f"seq {ic['seq']}")
        elif "udp" in p:
            u = p["udp"]
            t.add_row(str(p["header_len"]), "", "UDP", f"{u['sport']} -> {u['dport']} "
                      f"len {u['len']}")
        self.table(t)

    def header6_table(self, head_hex: str, p: dict):
        """The 40 bytes of the IPv6 header the engine read, field by field."""
        raw = bytes.fromhex(head_hex)[:p["header_len"]]
        rows = [("0", raw[0:4], "version / class / flow", f"{p['version']} / {p['traffic_class']} "
                 f"/ {p['flow_label']}"),
                ("4", raw[4:6], "payload length", f"{p['payload_len']} (+ 40 = what read() "
                 "returned)"),
                ("6", raw[6:7], "next header", p["proto"]),
                ("7", raw[7:8], "hop limit", str(p["ttl"])),
                ("8", raw[8:24], "source", p["src"]),
                ("24", raw[24:40], "destination", p["dst"])]
        t = self._table("offset", "bytes", "field", "value")
        for off, b, name, val in rows:
            t.add_row(off, b.hex(" "), name, val)
        if "icmp" in p:
            ic = p["icmp"]
            t.add_row(str(p["header_len"]), "", "ICMPv6", f"{ic['name']} id {ic['id']} "
                      f"seq {ic['seq']}")
        self.table(t)

    def diagram(self):
        """The two hosts and the path, with this run's addresses (diagram.py)."""
        self.c.print()
        for text, style in diagram.lines(self.demo.result):
            self.c.print(Text(text, style=style))
        self.c.print()


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def tr_json(v) -> str:
    import json
    return json.dumps(v, separators=(",", ":")) if v is not None else "?"


__all__ = ["Renderer", "make_console"]
