"""What the demo's overlay holds once it is up: etcd's contents, each host's facts, the kernel's
routing answers. Each function asks the running system and returns plain data.

Nothing here starts or stops anything (``bringup.py``), parses tool output (``readings.py``,
``trace.py``) or words a step (``steps.py``). The network config and the leases are read with the
control plane's own parsers (``control/config.py``, ``control/lease.py``), so the demo shows what a
daemon would read: one parser of lease keys, IPv6 halves included.
"""
from __future__ import annotations

import json

from ..control.config import parse_config
from ..control.lease import LeaseFormatError
from ..daemon.metrics import PREFIX
from . import readings
from . import trace as tr
from .errors import DemoError


def etcd_contents(ov) -> tuple[dict, int, list[dict]]:
    """The network config as stored, its UDP port as a daemon reads it, and the leases."""
    kvs = readings.etcd_kvs(ov.etcdctl("get", "--prefix", f"{ov.prefix}/", "-w", "json").stdout)
    text = kvs.get(f"{ov.prefix}/config", "{}")
    try:
        leases = [readings.lease_fact(k, v) for k, v in kvs.items()
                  if k.startswith(f"{ov.prefix}/subnets/")]
    except LeaseFormatError as e:
        raise DemoError(f"etcd holds a lease no daemon would read: {e}") from None
    return json.loads(text), parse_config(text).backend_port, leases


def routes(ov, host) -> list[str]:
    return readings.squeezed_lines(ov.exec(host, ["ip", "route"]).stdout)


def host_facts(ov, host, engine: str, port: int, leases: list) -> dict:
    """One host as the overlay step shows it: addresses, its daemon, flannel0, socket, routes."""
    d = ov.daemon(host)
    subnet = str(ov.subnet(host))
    return {
        "name": host.name, "netns": host.netns, "underlay_ip": host.ip, "iface": host.iface,
        "subnet": subnet, "flannel0": ov.flannel_ip(host),
        "subnet_env": ov.subnet_env(host), "subnet_file": d.subnet_file, "daemon_pid": d.pid,
        "daemon_argv": " ".join(["flannel-udp", *ov.daemon_command(host, engine)]),
        "routes": routes(ov, host),
        "flannel0_link": readings.flannel0_facts(
            ov.exec(host, ["ip", "-o", "addr", "show", "flannel0"]).stdout,
            ov.exec(host, ["ip", "-o", "link", "show", "flannel0"]).stdout),
        "socket": readings.udp_socket_line(ov.exec(host, ["ss", "-uanp"]).stdout, port),
        "lease": next((l for l in leases if l["subnet"] == subnet), None),
    }


def peer_facts(ov, host) -> dict:
    """The daemon's own words per peer, and its /metrics count of peers per mode (DirectRouting)."""
    return {"peer_log": readings.peers_added(ov.daemon(host).log_text()),
            "peers_by_mode": tr.by_label(ov.metrics(host), f"{PREFIX}_peers_by_mode", "mode")}


def hosts(ov, engine: str, port: int, leases: list, direct: bool) -> dict:
    """host_facts of A and B (and peer_facts on the direct path), by role."""
    out = {}
    for role, h in zip("AB", ov.hosts):
        out[role] = host_facts(ov, h, engine, port, leases)
        if direct:
            out[role].update(peer_facts(ov, h))
    return out


def workload(w) -> dict:
    return {"ip": w.ip, "gateway": w.gateway, "netns": w.netns, "host_iface": w.host_iface,
            "mtu": w.mtu}


def _route_get(ov, host, *args) -> dict:
    return tr.parse_route_get(ov.exec(host, ["ip", "route", "get", *args]).stdout)


def kernel_answers(ov, hosts: dict, wa, wb, direct: bool) -> None:
    """The kernels' own routing answers for the probes, before any packet moves, into ``hosts``."""
    a, b = ov.hosts
    A, B = hosts["A"], hosts["B"]
    A["route_get_workload"] = tr.parse_route_get(wa.run(["ip", "route", "get", wb.ip]).stdout)
    A["route_get"] = _route_get(ov, a, wb.ip, "from", wa.ip, "iif", wa.host_iface)
    # Direct: the packet reaches the other host on its underlay veth, not out of flannel0.
    b_in, a_in = (b.iface, a.iface) if direct else ("flannel0", "flannel0")
    B["route_get"] = _route_get(ov, b, wb.ip, "from", wa.ip, "iif", b_in)
    B["route_get_reply"] = _route_get(ov, b, wa.ip, "from", wb.ip, "iif", wb.host_iface)
    A["route_get_reply"] = _route_get(ov, a, wa.ip, "from", wb.ip, "iif", a_in)
    for role, h in (("A", a), ("B", b)):
        hosts[role]["routes_with_workload"] = routes(ov, h)
