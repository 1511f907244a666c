"""The daemon's configuration: every setting of `flannel-udp run`, with its default.

The defaults are written here and nowhere else: cli/flanneld_flags.py parses flanneld's flags and
FLANNELD_* variables into an :class:`Options`, and takes from :func:`default` both the value of a
flag that is not given and the default its help names. Where flanneld has the setting, the
default is flanneld's (docs/flannel-compat.md); the etcd prefix and endpoints are the registry's,
the ICMP limits the engine contract's.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

from ..control.defaults import DEFAULT_ENDPOINTS, DEFAULT_PREFIX
from ..engine.api import COALESCE_DEFAULT_US
from ..engine.contract import ICMP_BURST_DEFAULT, ICMP_RATE_DEFAULT
from ..host.offload import DEFAULT_MODE as OFFLOAD_DEFAULT
from ..host.queues import default_queues


def _bpf_pins_root() -> str:
    # engine/bpf_pins.py's, imported only when the default is asked for (it loads cffi)
    from ..engine.bpf_pins import DEFAULT_ROOT
    return DEFAULT_ROOT


@dataclass
class Options:
    """Resolved, validated settings (attribute names = the flags' names, dashes as underscores)."""
    etcd_endpoints: list = field(default_factory=lambda: list(DEFAULT_ENDPOINTS))
    etcd_prefix: str = DEFAULT_PREFIX
    etcd_keyfile: str = ""
    etcd_certfile: str = ""
    etcd_cafile: str = ""
    etcd_username: str = ""
    etcd_password: str = ""
    iface: list = field(default_factory=list)
    iface_regex: list = field(default_factory=list)
    iface_can_reach: str = ""
    public_ip: str = ""
    public_ipv6: str = ""
    subnet_file: str = "/run/flannel/subnet.env"
    subnet_lease_renew_margin: int = 60
    ip_masq: bool = False
    # flanneld v0.28: MASQUERADE without --random-fully (nftables: without fully-random)
    ip_masq_fully_random_disable: bool = False
    # flanneld v0.28: a `blackhole <own subnet>` route, kept on the resync tick, left at exit
    ip_blackhole_route: bool = False
    iptables_resync: int = 5
    iptables_forward_rules: bool = True
    healthz_ip: str = "0.0.0.0"
    healthz_port: int = 0
    v: int = 0
    vmodule: str = ""
    log_backtrace_at: str = ""
    log_format: str = "text"
    engine: str = "auto"
    accept_from: str = "leases"
    strict_sources: bool = False
    icmp_rate: int = ICMP_RATE_DEFAULT
    icmp_burst: int = ICMP_BURST_DEFAULT
    coalesce_usecs: int = COALESCE_DEFAULT_US
    realtime_priority: int = 0
    metrics: str = ""
    trace: bool = False
    trace_remote: bool = False
    queues: int = field(default_factory=default_queues)
    offload: str = OFFLOAD_DEFAULT
    handover: bool = False
    # in the runtime directory, next to subnet.env
    handover_socket: str = "/run/flannel/handover.sock"
    # `flannel-udp status` asks the daemon here (and `cleanup` checks that nobody answers)
    status_socket: str = "/run/flannel/flannel-udp.sock"
    # probe each peer's IPv6 underlay, its IPv6 part over IPv4 while it carries nothing back
    ipv6_underlay_fallback: bool = True
    # the kernel path's pins (docs/kernel-path.md#restarts): one directory per flannel device
    # under it, on a bpffs; one per network namespace
    bpf_pins: str = field(default_factory=_bpf_pins_root)
    # where each value came from: "flag", "env" or "default"
    sources: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    def metrics_listen(self):
        """(ip, port) of a dedicated /metrics listener, or None."""
        if self.metrics in ("", "healthz", "off"):
            return None
        host, _, port = self.metrics.rpartition(":")
        return host.strip("[]"), int(port)

    def metrics_on_healthz(self) -> bool:
        return self.metrics in ("", "healthz")


_FIELDS = {f.name: f for f in fields(Options)}


def default(name: str):
    """The default of the setting ``name`` (a fresh list for a list)."""
    f = _FIELDS[name]
    return f.default_factory() if f.default is MISSING else f.default
