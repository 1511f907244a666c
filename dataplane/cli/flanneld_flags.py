"""flanneld-compatible command-line flags for `flannel-udp run`.

An operator's flanneld command line must work unchanged, so this module
accepts what Go's ``flag`` package accepts:

* ``--name value``, ``--name=value``, ``-name value``, ``-name=value``;
* booleans as ``-ip-masq``, ``-ip-masq=true``, ``--ip-masq=false``;
* repeatable ``--iface`` / ``--iface-regex`` (first match wins);
* every flag also from ``FLANNELD_<FLAG_UPPER_UNDERSCORED>`` when it is not
  on the command line (``FLANNELD_ETCD_ENDPOINTS``, ``FLANNELD_IP_MASQ``...).

Flow: :func:`add_arguments` registers the flags on an argparse parser with
``default=None`` so that "not given" is visible; :func:`resolve` then fills
each missing value from the environment, else from the flanneld default,
validates everything and returns an :class:`Options`. Errors name the flag
(or the environment variable) and say what is accepted.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import re
import sys
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..host import queues
from ..host.offload import DEFAULT_MODE as OFFLOAD_DEFAULT, MODES as OFFLOAD_MODES

ENV_PREFIX = "FLANNELD_"


class FlagError(ValueError):
    """A flag value that flannel-udp cannot use; the message names the flag."""


# --------------------------------------------------------------------------
# value parsers: each raises ValueError with a short reason

def _parse_bool(text: str) -> bool:
    # Go's strconv.ParseBool
    t = str(text).strip()
    if t in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if t in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise ValueError(f"{text!r} is not a boolean (use true or false)")


def _parse_int(text: str) -> int:
    try:
        return int(str(text).strip(), 0)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None


def _parse_endpoints(text: str) -> list[str]:
    eps = [e.strip() for e in str(text).split(",") if e.strip()]
    if not eps:
        raise ValueError("no endpoint given (expected e.g. http://127.0.0.1:2379)")
    for e in eps:
        u = urlsplit(e)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"{e!r} is not an http:// or https:// URL (e.g. http://10.0.0.1:2379)")
        try:
            u.port
        except ValueError:
            raise ValueError(f"{e!r} has a bad port") from None
    return eps


def _parse_ipv4(text: str) -> str:
    try:
        return str(ipaddress.IPv4Address(str(text).strip()))
    except ValueError:
        raise ValueError(f"{text!r} is not an IPv4 address") from None


def _parse_ip(text: str) -> str:
    try:
        return str(ipaddress.ip_address(str(text).strip()))
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address") from None


def _parse_regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise ValueError(f"{text!r} is not a valid regular expression: {e}") from None
    return text


def _parse_str(text: str) -> str:
    return str(text)


def _parse_metrics(text: str) -> str:
    t = str(text).strip()
    if t in ("", "healthz", "off"):
        return t
    host, sep, port = t.rpartition(":")
    if not sep:
        raise ValueError(f"{text!r}: use IP:PORT (e.g. 127.0.0.1:9285), 'healthz' or 'off'")
    try:
        ipaddress.IPv4Address(host or "0.0.0.0")
        p = int(port)
    except ValueError:
        raise ValueError(f"{text!r}: use IP:PORT (e.g. 127.0.0.1:9285), 'healthz' or 'off'") from None
    if not 1 <= p <= 65535:
        raise ValueError(f"port {p} out of range 1..65535")
    return f"{host or '0.0.0.0'}:{p}"


def _choice(*allowed):
    def parse(text: str) -> str:
        t = str(text).strip().lower()
        if t not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return t
    return parse


# --------------------------------------------------------------------------
# the flag table

@dataclass(frozen=True)
class Flag:
    name: str                 # flanneld's name, without dashes
    parse: object             # str -> value, raises ValueError
    default: object
    help: str
    kind: str = "value"       # value | bool | list
    metavar: str | None = None
    group: str = "flanneld"   # flanneld | ours | unsupported | ignored
    check: object = None      # value -> None, raises ValueError (range checks)

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper().replace("-", "_")


def _queue_count(v):
    queues.check(v)


def _range(lo, hi, unit=""):
    def check(v):
        if not lo <= v <= hi:
            raise ValueError(f"{v}{unit} out of range {lo}..{hi}")
    return check


DEFAULT_ENDPOINTS = "http://127.0.0.1:4001,http://127.0.0.1:2379"

FLAGS: tuple[Flag, ...] = (
    # --- etcd (flanneld)
    Flag("etcd-endpoints", _parse_endpoints, _parse_endpoints(DEFAULT_ENDPOINTS),
         "a comma-delimited list of etcd endpoints (default: %s)" % DEFAULT_ENDPOINTS,
         metavar="URLS"),
    Flag("etcd-prefix", _parse_str, "/coreos.com/network",
         "etcd prefix (default: /coreos.com/network)", metavar="PREFIX"),
    Flag("etcd-keyfile", _parse_str, "", "SSL key file used to secure etcd communication",
         metavar="FILE"),
    Flag("etcd-certfile", _parse_str, "", "SSL certification file used to secure etcd communication",
         metavar="FILE"),
    Flag("etcd-cafile", _parse_str, "", "SSL Certificate Authority file used to secure etcd communication",
         metavar="FILE"),
    Flag("etcd-username", _parse_str, "", "username for BasicAuth to etcd", metavar="NAME"),
    Flag("etcd-password", _parse_str, "", "password for BasicAuth to etcd", metavar="PASSWORD"),
    # --- interface (flanneld)
    Flag("iface", _parse_str, [], "interface to use (IP or name) for inter-host communication; "
         "repeatable, the first that exists wins", kind="list", metavar="NAME_OR_IP"),
    Flag("iface-regex", _parse_regex, [], "regex of the interface to use (matched against IPs "
         "first, then names); repeatable, first match wins", kind="list", metavar="REGEX"),
    Flag("iface-can-reach", _parse_ipv4, "", "use the interface the kernel would route to this IP "
         "(like `ip route get IP`)", metavar="IP"),
    Flag("public-ip", _parse_ipv4, "", "IP accessible by other nodes for inter-host communication "
         "(the PublicIP of this host's lease; default: the interface address)", metavar="IP"),
    Flag("public-ipv6", _parse_str, "", "accepted for compatibility; the udp backend is IPv4 only "
         "and ignores it", metavar="IP"),
    # --- subnet (flanneld)
    Flag("subnet-file", _parse_str, "/run/flannel/subnet.env",
         "filename where env variables (subnet, MTU, ...) will be written to "
         "(default: /run/flannel/subnet.env)", metavar="PATH"),
    Flag("subnet-lease-renew-margin", _parse_int, 60,
         "subnet lease renewal margin, in minutes, ranging from 1 to 1439 (default: 60)",
         metavar="MINUTES", check=_range(1, 1439, " minutes")),
    # --- iptables (flanneld)
    Flag("ip-masq", _parse_bool, False, "setup IP masquerade rule for traffic destined outside of "
         "overlay network (iptables chain FLANNEL-POSTRTG, or nftables when iptables is missing)",
         kind="bool"),
    Flag("iptables-resync", _parse_int, 5, "resync period for iptables rules, in seconds (default: 5)",
         metavar="SECONDS", check=_range(1, 86400, " s")),
    Flag("iptables-forward-rules", _parse_bool, True, "add default accept rules to the FORWARD "
         "chain in iptables (chain FLANNEL-FWD; default: true)", kind="bool"),
    # --- health (flanneld)
    Flag("healthz-ip", _parse_ip, "0.0.0.0", "the IP address for healthz server to listen "
         "(default: 0.0.0.0)", metavar="IP"),
    Flag("healthz-port", _parse_int, 0, "the port for healthz server to listen (0 to disable; "
         "default: 0)", metavar="PORT", check=_range(0, 65535)),
    # --- logging (klog flags flanneld copies)
    Flag("v", _parse_int, 0, "log level: 0 = operator events, 1 = also per-packet error "
         "summaries and details, 2+ = debug", metavar="LEVEL", check=_range(0, 10)),
    Flag("vmodule", _parse_str, "", "accepted for compatibility (klog); ignored", metavar="SPEC",
         group="ignored"),
    Flag("log_backtrace_at", _parse_str, "", "accepted for compatibility (klog); ignored",
         metavar="FILE:LINE", group="ignored"),
    # --- ours
    Flag("engine", _choice("c", "python", "auto"), "auto", "forwarding engine: c (the batched C "
         "fast path), python (pure Python), auto (C if built, else Python; default: auto, or "
         "$DATAPLANE_ENGINE)", metavar="c|python|auto", group="ours"),
    Flag("accept-from", _choice("leases", "any"), "leases", "which UDP sources to accept: leases "
         "(only the PublicIP of a known lease; default) or any (as flanneld; use it when peers "
         "reach this host through address translation)", metavar="leases|any", group="ours"),
    Flag("icmp-rate", _parse_int, 100, "ICMP errors (net unreachable, time exceeded) the engine "
         "sends per second at most, as routers limit them; the host's total, split over the "
         "queues; 0 = unlimited (default: 100)",
         metavar="N", check=_range(0, 2 ** 32 - 1), group="ours"),
    Flag("icmp-burst", _parse_int, 50, "ICMP errors allowed in a burst above --icmp-rate "
         "(default: 50)", metavar="N", check=_range(1, 2 ** 32 - 1), group="ours"),
    Flag("metrics", _parse_metrics, "", "where to serve Prometheus /metrics: IP:PORT for a "
         "listener of its own, 'healthz' (or empty, the default) for the healthz server when "
         "--healthz-port is set, 'off' to disable", metavar="IP:PORT", group="ours"),
    Flag("queues", _parse_int, 0, "forwarding queues: each one a flannel0 queue "
         "(IFF_MULTI_QUEUE), a UDP socket on the same address and port (SO_REUSEPORT) and an "
         "engine thread; 1 = flanneld's single queue (default: the number of CPUs, at most 8; "
         "--trace runs 1)", metavar="N", check=_queue_count, group="ours"),
    Flag("offload", _choice(*OFFLOAD_MODES), OFFLOAD_DEFAULT, "kernel offloads for the C "
         "engine: auto (what this kernel accepts of TUN TSO/USO, UDP GSO and GRO; the wire "
         "format does not change) or off (default: %s)" % OFFLOAD_DEFAULT,
         metavar="auto|off", group="ours"),
    Flag("trace", _parse_bool, False, "enable the engine's packet trace ring and serve it as JSON "
         "at GET /debug/trace?after=N (on the healthz and metrics servers)", kind="bool",
         group="ours"),
    # --- flanneld's Kubernetes mode: not supported
    Flag("kube-subnet-mgr", _parse_bool, False, "not supported by flannel-udp", kind="bool",
         group="unsupported"),
    Flag("kube-api-url", _parse_str, "", "not supported by flannel-udp", group="unsupported"),
    Flag("kubeconfig-file", _parse_str, "", "not supported by flannel-udp", group="unsupported"),
    Flag("kube-annotation-prefix", _parse_str, "", "not supported by flannel-udp",
         group="unsupported"),
    Flag("net-config-path", _parse_str, "", "not supported by flannel-udp", group="unsupported"),
    Flag("set-node-network-unavailable", _parse_bool, False, "not supported by flannel-udp",
         kind="bool", group="unsupported"),
)
FLAG_BY_DEST = {f.dest: f for f in FLAGS}


@dataclass
class Options:
    """Resolved, validated flag values (attribute names = flag dests)."""
    etcd_endpoints: list = field(default_factory=list)
    etcd_prefix: str = "/coreos.com/network"
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
    iptables_resync: int = 5
    iptables_forward_rules: bool = True
    healthz_ip: str = "0.0.0.0"
    healthz_port: int = 0
    v: int = 0
    vmodule: str = ""
    log_backtrace_at: str = ""
    engine: str = "auto"
    accept_from: str = "leases"
    icmp_rate: int = 100
    icmp_burst: int = 50
    metrics: str = ""
    trace: bool = False
    queues: int = 1
    offload: str = OFFLOAD_DEFAULT
    # where each value came from: "flag", "env" or "default"
    sources: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    def metrics_listen(self):
        """(ip, port) of a dedicated /metrics listener, or None."""
        if self.metrics in ("", "healthz", "off"):
            return None
        host, _, port = self.metrics.rpartition(":")
        return host, int(port)

    def metrics_on_healthz(self) -> bool:
        return self.metrics in ("", "healthz")


# --------------------------------------------------------------------------
# argparse glue

def _typed(flag: Flag):
    """An argparse ``type=`` that reports errors naming the flag."""
    def conv(text):
        try:
            return flag.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    conv.__name__ = flag.name  # argparse prints "invalid <name> value" otherwise
    return conv


class _BoolAction(argparse.Action):
    """``-flag`` means true; ``-flag=false`` / ``-flag=true`` as Go's flag package."""

    def __init__(self, option_strings, dest, flag: Flag, **kw):
        self.flag = flag
        super().__init__(option_strings, dest, nargs="?", const="true", **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            setattr(namespace, self.dest, _parse_bool(values))
        except ValueError as e:
            raise argparse.ArgumentError(self, str(e)) from None


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows ``--name`` only: the Go-style ``-name`` aliases are accepted but
    would double every line of the help."""

    def _format_action_invocation(self, action):
        if not action.option_strings:
            return super()._format_action_invocation(action)
        shown = [s for s in action.option_strings if s.startswith("--") or len(s) == 2]
        shown = shown or action.option_strings
        if action.nargs == "?":
            return f"{shown[0]}[=true|false]"
        if action.nargs == 0:
            return ", ".join(shown)
        args_string = self._format_args(action, self._get_default_metavar_for_optional(action))
        return ", ".join(f"{s} {args_string}" for s in shown)


def _option_strings(flag: Flag) -> list[str]:
    if len(flag.name) == 1:
        return ["-" + flag.name]                     # -v
    return ["--" + flag.name, "-" + flag.name]       # --iface and Go's -iface


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register every flag on ``parser`` (defaults stay None: see resolve())."""
    parser.formatter_class = _HelpFormatter
    parser.usage = "%(prog)s [--flag[=value] | -flag[=value] ...]"
    parser.allow_abbrev = False  # flanneld does not accept abbreviations either
    groups = {
        "flanneld": parser.add_argument_group("flanneld flags (same names, meanings and defaults)"),
        "ours": parser.add_argument_group("flannel-udp flags"),
        "ignored": parser.add_argument_group("accepted for compatibility, ignored"),
        "unsupported": parser.add_argument_group(
            "flanneld flags not supported by flannel-udp (Kubernetes mode; an error if set)"),
    }
    for f in FLAGS:
        g = groups[f.group]
        opts = _option_strings(f)
        help_text = f.help + f" [env {f.env}]"
        if f.kind == "bool":
            g.add_argument(*opts, dest=f.dest, action=_BoolAction, flag=f, default=None,
                           help=help_text)
        elif f.kind == "list":
            g.add_argument(*opts, dest=f.dest, action="append", type=_typed(f), default=None,
                           metavar=f.metavar or "VALUE", help=help_text)
        else:
            g.add_argument(*opts, dest=f.dest, type=_typed(f), default=None,
                           metavar=f.metavar or "VALUE", help=help_text)
    # flanneld prints its bare version string to stderr; `-version` must work as in flanneld.
    parser.add_argument("--version", "-version", dest="_version", action="store_true",
                        default=False, help="print the version to stderr and exit (as flanneld)")


def resolve(args: argparse.Namespace, environ=None) -> Options:
    """Fill flags not on the command line from FLANNELD_* env vars, then from
    flanneld's defaults; validate; raise FlagError naming the flag."""
    env = os.environ if environ is None else environ
    opts = Options()
    for f in FLAGS:
        value = getattr(args, f.dest, None)
        source = "flag"
        where = f"--{f.name}" if len(f.name) > 1 else f"-{f.name}"
        if value is None:
            raw = env.get(f.env)
            if raw is not None and raw != "":
                source = "env"
                where = f"{f.env} (environment, for --{f.name})"
                try:
                    value = f.parse(raw)
                except ValueError as e:
                    raise FlagError(f"invalid value for {where}: {e}") from None
                if f.kind == "list":
                    value = [value]
            else:
                source = "default"
                value = list(f.default) if isinstance(f.default, list) else f.default
        if f.check is not None and source != "default":
            try:
                f.check(value)
            except ValueError as e:
                raise FlagError(f"invalid value for {where}: {e}") from None
        if f.group == "unsupported":
            if value not in ("", False, None):
                raise FlagError(
                    f"{where} is not supported by flannel-udp: it has no Kubernetes subnet "
                    "manager. Run it with etcd (--etcd-endpoints) and the network config in "
                    "<etcd-prefix>/config, or use flanneld for Kubernetes mode.")
            continue
        if f.group == "ignored" and source != "default" and value:
            opts.warnings.append(f"{where} is accepted for compatibility and ignored")
        setattr(opts, f.dest, value)
        opts.sources[f.dest] = source
    if opts.sources.get("queues") == "default":
        opts.queues = queues.default_queues()
    if opts.public_ipv6:
        opts.warnings.append("--public-ipv6 is ignored: the udp backend carries IPv4 only")
    if bool(opts.etcd_keyfile) != bool(opts.etcd_certfile):
        opts.warnings.append("TLS to etcd needs both --etcd-keyfile and --etcd-certfile; "
                             "one alone is ignored (as flanneld)")
    if opts.trace and not opts.healthz_port and opts.metrics_listen() is None:
        opts.warnings.append("--trace is on but no HTTP server serves /debug/trace: set "
                             "--healthz-port or --metrics IP:PORT")
    return opts


def print_version(stream=None) -> None:
    """Only the version string, as flanneld prints it: scripts compare it whole."""
    from .. import __version__
    print(__version__, file=stream or sys.stderr)


def env_help() -> str:
    return "\n".join(f"  {f.env:40s} --{f.name}" for f in FLAGS if f.group != "unsupported")
