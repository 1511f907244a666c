"""`flannel-udp status`: one screen about the running daemon, from its status socket."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HELP = "show the running daemon's state on one screen (exit 0 ready, 1 not ready, 2 no daemon)"
DESCRIPTION = """\
Ask the running daemon (over its root-only unix socket, --status-socket; it answers with
--healthz-port 0 too) and print on one screen: its lease and when it expires, subnet.env and
whether it names the lease, the engine, queues and offloads, how many peers, etcd (endpoints,
watches connected), packets and drops by reason, and its last warnings.

Exit status, for scripts and probes:
  0  the daemon is ready (the same checks as GET /readyz: lease, engine, etcd watch, subnet.env)
  1  it answers but is not ready: the failing checks are printed
  2  no daemon answers on the socket; where the kernel path runs without one (its programs
     pinned under --bpf-pins and on their hooks), it says so: which programs, since when, and
     their counters

--json prints the daemon's whole document instead (the same exit status).
"""

EXIT_READY, EXIT_NOT_READY, EXIT_NO_DAEMON = 0, 1, 2


def default_socket() -> str:
    """The flag's default as `run` has it, or FLANNELD_STATUS_SOCKET as `run` reads it."""
    from ..daemon.options import default
    return os.environ.get("FLANNELD_STATUS_SOCKET") or default("status_socket")


def default_pins() -> str:
    """`run`'s --bpf-pins default, or FLANNELD_BPF_PINS as `run` reads it."""
    from ..daemon.options import default
    return os.environ.get("FLANNELD_BPF_PINS") or default("bpf_pins")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status-socket", "-status-socket", metavar="PATH", default=None,
                        help="the daemon's status socket, as given to `run` (default: "
                             "$FLANNELD_STATUS_SOCKET, else /run/flannel/flannel-udp.sock)")
    parser.add_argument("--json", action="store_true",
                        help="print the daemon's status document as JSON")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="how long to wait for the answer (default: 5)")
    parser.add_argument("--bpf-pins", "-bpf-pins", metavar="DIR", default=None,
                        help="where the kernel path is pinned, as given to `run`, read when no "
                             "daemon answers (default: $FLANNELD_BPF_PINS, else "
                             "/sys/fs/bpf/flannel-udp)")


def main(args) -> int:
    from ..daemon.status import query
    path = args.status_socket or default_socket()
    try:
        doc = query(path, args.timeout)
    except PermissionError:
        print(f"flannel-udp status: {path} is root's only: run it as root", file=sys.stderr)
        return EXIT_NO_DAEMON
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        print(f"flannel-udp status: no daemon answers on {path} ({why}); is `flannel-udp run` "
              "running, with this --status-socket?", file=sys.stderr)
        paths = kernel_paths(args.bpf_pins or default_pins())
        if paths:
            print(json.dumps({"kernel_paths": paths}, indent=2, sort_keys=True) if args.json
                  else render_kernel_paths(paths))
        return EXIT_NO_DAEMON
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render(doc))
    return EXIT_READY if doc.get("ready") else EXIT_NOT_READY


def kernel_paths(root: str) -> list:
    """What each kernel path pinned under ``root`` is (engine/bpf_pinned.py), [] when none is
    or it cannot be read here."""
    if not os.path.isdir(root):
        return []
    try:
        from ..engine import bpf_pinned, bpf_pins
        return [bpf_pinned.describe(d) for d in bpf_pins.directories(root)]
    except Exception as e:          # no libbpf, no sources for the contract, not root
        return [{"dir": root, "error": str(e)}]


def render_kernel_paths(paths: list, now: float | None = None) -> str:
    """The kernel paths that run with no daemon, as an operator reads them (no I/O)."""
    from ..daemon.timefmt import when
    now = time.time() if now is None else now
    out = []
    for p in paths:
        if p.get("error"):
            out.append(f"kernel path under {p['dir']}: cannot read it ({p['error']})")
            continue
        progs = p.get("programs") or {}
        running = any(v.get("attached") for v in progs.values())
        out.append(f"kernel path pinned at {p['dir']}: " + (
            "RUNNING WITHOUT A DAEMON (packets cross it; routes and peers stay as the last "
            "daemon left them until one adopts it; `flannel-udp cleanup` removes it)"
            if running else "pinned, on no hook (`flannel-udp cleanup` removes the pins)"))
        for name, v in sorted(progs.items()):
            out.append(f"  {name:<10}  {'on ' + v['attached'] if v.get('attached') else 'on no hook'}"
                       f", loaded {when(v['loaded_at'])} ({_ago(now - v['loaded_at'])} ago), "
                       f"id {v['id']}, tag {v['tag']}")
        if p.get("own_ip"):
            out.append(f"  {'address':<10}  {p['own_ip']}:{p.get('port')}")
        c = p.get("counters") or {}
        moved = [f"{k} {c[k]}" for k in ("udp_tx_packets", "tun_tx_packets") if k in c]
        dropped = [f"{k} {v}" for k, v in sorted(c.items()) if v and "drop" in k]
        passed = [f"{k} {v}" for k, v in sorted(c.items()) if v and "_pass_" in k]
        out.append(f"  {'packets':<10}  {', '.join(moved) or '-'}")
        out.append(f"  {'drops':<10}  {', '.join(dropped) or 'none'}")
        out.append(f"  {'to engine':<10}  {', '.join(passed) or 'none'}"
                   + (" (no engine reads them now)" if passed and running else ""))
    return "\n".join(out)


def _ago(seconds: float) -> str:
    seconds = abs(int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def render(doc: dict, now: float | None = None) -> str:
    """The status document as the screen an operator reads (no I/O)."""
    from ..daemon.timefmt import when
    if now is None:                 # the daemon's clock, as it read the expiry
        now = doc.get("time") or time.time()
    out = []
    checks = doc.get("checks") or {}
    failing = {k: v for k, v in checks.items() if v is not None}
    if doc.get("ready"):
        out.append(f"flannel-udp {doc.get('version', '?')} (pid {doc.get('pid', '?')}): ready")
    else:
        out.append(f"flannel-udp {doc.get('version', '?')} (pid {doc.get('pid', '?')}): NOT READY")
        for name, why in failing.items():
            out.append(f"  [-] {name}: {why}")
        if not checks:
            out.append("  [-] nothing to report yet (starting)")
    rows = []
    lease = doc.get("lease")
    if lease:
        exp = lease.get("expiration")
        if lease.get("reservation"):
            expiry = "a reservation, never expires"
        elif exp:
            left = exp - now
            expiry = (f"expires {when(exp)} (in {_ago(left)})" if left > 0
                      else f"EXPIRED {when(exp)} ({_ago(left)} ago)")
        else:
            expiry = "expiry not known"
        rows.append(("lease", f"{lease['subnet']} (PublicIP {lease['public_ip']}), {expiry}"))
        if lease.get("ipv6_subnet"):
            v6 = doc.get("ipv6") or {}
            tun = doc.get("tun") or "the tun device"
            pub6 = lease.get("public_ipv6")
            rows.append(("ipv6 subnet", f"{lease['ipv6_subnet']} (" + (
                f"PublicIPv6 {pub6}: the IPv6 underlay to peers that have one)" if pub6 else
                "no PublicIPv6: over the IPv4 underlay)") + f"; {tun} has "
                f"{v6.get('tun_address') or '-'}, route {v6.get('route') or '-'} dev {tun}"))
    else:
        rows.append(("lease", "none yet"))
    if doc.get("network"):
        rows.append(("network", doc["network"]))
    ext = doc.get("interface")
    if ext:
        rows.append(("interface", f"{ext['name']} {ext['address']}"))
    sf = doc.get("subnet_file") or {}
    if sf:
        state = "current" if sf.get("current") else f"STALE: {sf.get('problem')}"
        fails = sf.get("write_failures") or 0
        rows.append(("subnet.env", f"{sf.get('path')}, {state}"
                     + (f" ({fails} failed write(s) since start)" if fails else "")))
    eng = doc.get("engine")
    if eng:
        rows.append(("engine", f"{eng.get('engine')} ({eng.get('why') or eng.get('reason')}), "
                     f"accepting from {eng.get('accept_from')}"))
    else:
        rows.append(("engine", "not started yet"))
    kp = doc.get("kernel_path")
    if kp:
        moved = {k: v for k, v in (kp.get("counters") or {}).items() if v}
        rows.append(("path", f"{kp.get('path')} ({kp.get('why')})"
                     + (f"; {kp['offload']}" if kp.get("offload") else "")
                     + (f"; pinned at {kp['pins']}, outlives the daemon" if kp.get("pins")
                        else "")
                     + (f"; programs' counters: {moved}" if moved else "")))
    rows.append(("tun", f"{doc.get('tun') or '-'}, {doc.get('queues', 0)} queue(s)"))
    offloads = doc.get("offloads") or {}
    if offloads:
        on = [k for k, v in offloads.items() if v]
        rows.append(("offloads", ", ".join(on) if on else "none"))
    peers6 = doc.get("peers_ipv6")
    rows.append(("peers", str(doc.get("peers", 0))
                 + (f" ({peers6} with an IPv6 part routed)" if peers6 is not None else "")))
    fb = doc.get("ipv6_underlay_fallback")
    if fb:
        rows.append(("ipv6 underlay", f"{fb.get('probed', 0)} peer(s) probed every "
                     f"{fb.get('interval_s', 0):.0f} s, {len(fb.get('on_ipv4') or [])} on IPv4 "
                     f"(no answer over IPv6), {fb.get('fallbacks', 0)} fallback(s) since start"))
        rows += [("", f"{p['subnet']}: IPv6 over IPv4 to {p['public_ip']} since "
                      f"{when(p['since'])} (PublicIPv6 {p['public_ipv6']} answers no probe)")
                 for p in fb.get("on_ipv4") or []]
    etcd = doc.get("etcd") or {}
    watches = etcd.get("watches") or {}
    wtext = ", ".join(f"{n} {'connected' if w.get('connected') else 'NOT CONNECTED'}"
                      + (f" ({w['reconnects']} reconnect(s))" if w.get("reconnects") else "")
                      for n, w in sorted(watches.items())) or "no watch yet"
    rows.append(("etcd", f"{','.join(etcd.get('endpoints') or [])} {etcd.get('prefix', '')}: "
                 f"{wtext}"))
    if doc.get("config_mismatch"):
        rows.append(("config", "etcd's network config differs from the one running "
                     "(restart to apply it)"))
    fwd = doc.get("host_forwarding") or {}
    if fwd:
        rows.append(("forwarding", ", ".join(
            f"{fam.replace('ip', 'IP')} {'on' if on else 'OFF'}" for fam, on in sorted(fwd.items()))
            + ("" if all(fwd.values()) else
               " (the pods' packets of a family that is off stop here; the warning has the fix)")))
    packets = doc.get("packets") or {}
    if packets:
        ipv6 = doc.get("packets_ipv6") or {}      # each path's IPv6 share, when there is one
        rows.append(("packets", ", ".join(f"{k} {v}" + (f" (IPv6 {ipv6[k]})" if ipv6.get(k) else
                                                         "") for k, v in sorted(packets.items()))))
    drops = {k: v for k, v in (doc.get("drops") or {}).items() if v}
    rows.append(("drops", ", ".join(f"{k} {v}" for k, v in sorted(drops.items(),
                                                                  key=lambda kv: -kv[1]))
                 or "none"))
    width = max(len(k) for k, _ in rows)
    out += [f"  {k:<{width}}  {v}" for k, v in rows]
    warnings = doc.get("warnings") or []
    out.append(f"last warnings ({len(warnings)}):" if warnings else "last warnings: none")
    for w in warnings:
        out.append(f"  {when(w['time'])} {w['level']} {w['logger']}: {w['message']}")
    return "\n".join(out)
