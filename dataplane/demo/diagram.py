"""The terminal's picture of the path, with this run's addresses: ASCII, fixed width, as
(text, style) lines that ``render.py`` prints under the workloads step. No I/O here.

Host A on the left going down, host B on the right going up; the dashed lines are the
user/kernel boundary. ``svg.py`` draws the same path for ``--out``.
"""
from __future__ import annotations

W = 40                  # the width of host A's column
KIND_STYLE = {"title": "bold", "user": "green", "kernel": "blue", "boundary": "yellow",
              "dim": "dim"}


def lines(r: dict) -> list[tuple[str, str]]:
    """The picture for a demo result (the dict ``--json`` prints)."""
    if r.get("direct_routing"):
        return direct_path(r)
    return kernel_path(r) if r.get("datapath") == "kernel" else engine_path(r)


def engine_path(r: dict) -> list[tuple[str, str]]:
    """Through both engines: four crossings of the boundary, the UDP datagram on the wire."""
    A, B = r["hosts"]["A"], r["hosts"]["B"]
    port, sc = r["port"], r["syscall_names"]

    def row(left, right, kind):
        return (f"{left:<{W}}{right}", KIND_STYLE[kind])
    bnd = ("  " + "-" * (2 * W - 2) + "  user | kernel", KIND_STYLE["boundary"])
    return _top(r, row, bnd) + [
        row("     |  flannel0 (TUN) queue", "     ^  flannel0 (TUN)", "kernel"),
        bnd,
        row("     v  read()          copy 1", "     ^  write()         copy 4", "user"),
        row("  [engine: lookup lease, TTL-1]", "  [engine: check source, TTL-1]", "user"),
        row(f"     v  {sc['send']:<16}copy 2", f"     ^  {sc['recv']:<16}copy 3", "user"),
        bnd,
        row(f"     v  UDP {A['underlay_ip']}:{port}", f"     ^  socket {B['underlay_ip']}:"
            f"{port}", "kernel"),
        row(f"     +-- {A['iface']} ==== bridge (the wire) ====", f"== {B['iface']} --+",
            "kernel"),
    ]


def _top(r: dict, row, bnd, *above) -> list:
    """Both paths' first rows: the hosts, their leases, the workloads (then ``above``, more of
    user space), the boundary, and each kernel's route, into flannel0 and out of it."""
    A, B = r["hosts"]["A"], r["hosts"]["B"]
    return [
        row(f"  host A {A['name']}  {A['underlay_ip']}", f"host B {B['name']}  "
            f"{B['underlay_ip']}", "title"),
        row(f"  lease {A['subnet']}", f"lease {B['subnet']}", "title"),
        row(f"  [workload {A['workload']['ip']}] ping/send",
            f"[workload {B['workload']['ip']}] reply", "user"),
        *above,
        bnd,
        row("     |  kernel: forward", "     ^  kernel: forward", "kernel"),
        row(f"     v  {r['network_config'].get('Network')} dev flannel0",
            f"     ^  {B['subnet']} dev {B['workload']['host_iface']}", "kernel"),
    ]


def direct_path(r: dict) -> list[tuple[str, str]]:
    """DirectRouting: kernel to kernel, nothing in user space but the applications."""
    A, B = r["hosts"]["A"], r["hosts"]["B"]
    bnd = (f"  {'-' * (2 * W - 2)}  user | kernel", "yellow")
    rows = [
        (f"  {'host A ' + A['name'] + '  ' + A['underlay_ip']:<{W - 2}}"
         f"host B {B['name']}  {B['underlay_ip']}", "bold"),
        (f"  {'[workload ' + A['workload']['ip'] + '] ping/send':<{W - 2}}"
         f"[workload {B['workload']['ip']}] reply", "green"),
        (f"  {'     (engine: idle, not on this path)':<{W - 2}}"
         "     (engine: idle, not on this path)", "dim"),
        bnd,
        (f"  {'     |  kernel: forward':<{W - 2}}     ^  kernel: forward", "blue"),
        (f"  {'     v  ' + B['subnet'] + ' via ' + B['underlay_ip']:<{W - 2}}"
         f"     ^  {B['subnet']} dev {B['workload']['host_iface']}", "blue"),
        (f"  {'        dev ' + A['iface']:<{W - 2}}", "blue"),
        (f"  {'     +-- ' + A['iface'] + ' ==== bridge (the wire) ====':<{W - 2}}"
         f"== {B['iface']} --+", "blue"),
    ]
    return [(text.rstrip(), style) for text, style in rows]


def kernel_path(r: dict) -> list[tuple[str, str]]:
    """The kernel path: tc programs on flannel0's egress and the veth's ingress; the engines
    above the boundary, idle for this packet (the slow path)."""
    A, B = r["hosts"]["A"], r["hosts"]["B"]
    port, eng = r["port"], r["engine"]

    def row(left, right, kind):
        return (f"{left:<{W}}{right}".rstrip(), KIND_STYLE[kind])
    bnd = ("  " + "-" * (2 * W - 2) + "  user | kernel", KIND_STYLE["boundary"])
    idle = row(f"  ({eng} engine: the slow path, idle)", f"({eng} engine: the slow path, idle)",
               "dim")
    return _top(r, row, bnd, idle) + [
        row("     |  flannel0: tc egress", "     ^  into flannel0 (its ingress)", "kernel"),
        row("  [fu_egress: lookup, TTL-1, +28 B]", "  [fu_ingress: check source, TTL-1, -28 B]",
            "kernel"),
        row(f"     v  redirect out of {A['iface']}", f"     ^  {B['iface']}: tc ingress, "
            f"udp :{port}", "kernel"),
        row(f"     +-- {A['iface']} ==== bridge (the wire) ====", f"== {B['iface']} --+",
            "kernel"),
    ]
