"""flanneld-compatible command-line flags for `flannel-udp run`.

(Over 450 lines as one piece: the table of flags is the one source of the parser, the help,
the environment variables and the checks of every value, which must agree flag by flag.)

An operator's flanneld command line must work unchanged, so this module
reads argv as Go's ``flag`` package does (flanneld v0.20.2 uses it):

* every flag as ``-name``, ``--name``, ``-name=value``, ``--name=value`` and,
  except booleans, ``-name value`` (klog's ``-v`` included: ``-v 2``, ``--v=2``);
* booleans as ``-ip-masq`` or ``-ip-masq=true|false`` only: ``-ip-masq false``
  is ``-ip-masq`` followed by the argument ``false``;
* reading stops at the first argument that is no flag (or after ``--``); the
  rest is ignored, with a warning (flanneld ignores it silently);
* repeatable ``--iface`` / ``--iface-regex`` (first match wins);
* every flag also from ``FLANNELD_<FLAG_UPPER_UNDERSCORED>`` when it is not
  on the command line (``FLANNELD_ETCD_ENDPOINTS``, ``FLANNELD_IP_MASQ``...);
  a value there that does not parse is logged and ignored, as flanneld does.

Flow: :func:`add_arguments` registers the flags on an argparse parser with
``default=None`` so that "not given" is visible, and makes that parser read
Go's syntax (:class:`_GoFlagParser`); :func:`resolve` then fills each missing
value from the environment, else from the default, validates everything and
returns the daemon's :class:`~dataplane.daemon.options.Options`. Errors name
the flag (or the environment variable) and say what is accepted; a bad flag
exits with 1. The defaults are the daemon's (daemon/options.py): a flag's
help names its default as ``{default}``, filled in from there.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import re
import sys
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..daemon import options
from ..daemon.options import Options
from ..host import firewall, logfmt, queues
from ..host.iface import ipv6_underlay_problem
from ..host.offload import MODES as OFFLOAD_MODES
from ..engine.api import COALESCE_MAX_US

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
    # Go's strconv.ParseInt(s, 0, 64), which flanneld's int flags use: 0x/0o/0b
    # prefixes, underscores, and a leading 0 for octal ("010" is 8).
    t = str(text).strip()
    digits = t.lstrip("+-")
    try:
        if re.fullmatch(r"0[0-7_]+", digits):
            return int(t[:len(t) - len(digits)] + "0o" + digits[1:], 0)
        return int(t, 0)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None


def _parse_klog_level(text: str) -> int:
    # klog's -v is a base-10 int32 ("010" is 10)
    try:
        return int(str(text).strip(), 10)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None


ENDPOINT_SCHEMES = ("http", "https", "unix", "unixs")


def _parse_endpoints(text: str) -> list[str]:
    """Endpoints stay as given (flanneld hands them to the etcd client as they
    are): URLs, HOST:PORT without a scheme (plain http), unix://SOCKET."""
    eps = [e.strip() for e in str(text).split(",") if e.strip()]
    if not eps:
        raise ValueError("no endpoint given (expected e.g. http://127.0.0.1:2379)")
    for e in eps:
        u = urlsplit(e if "://" in e else f"http://{e}")
        if u.scheme in ("unix", "unixs"):
            if not (u.netloc + u.path):
                raise ValueError(f"{e!r} names no socket (e.g. unix:///run/etcd.sock)")
            continue
        if u.scheme not in ENDPOINT_SCHEMES or not u.hostname:
            raise ValueError(f"{e!r} is no etcd endpoint: use http://HOST:PORT, "
                             "https://HOST:PORT, HOST:PORT or unix://SOCKET")
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


def _parse_public_ipv6(text: str) -> str:
    try:
        addr = ipaddress.IPv6Address(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not an IPv6 address") from None
    why = ipv6_underlay_problem(addr)
    if why is not None:
        raise ValueError(f"{addr} is {why}")
    return str(addr)


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


_METRICS_USAGE = "use IP:PORT (e.g. 127.0.0.1:9285 or [::1]:9285), 'healthz' or 'off'"


def _parse_metrics(text: str) -> str:
    t = str(text).strip()
    if t in ("", "healthz", "off"):
        return t
    host, sep, port = t.rpartition(":")
    if not sep:
        raise ValueError(f"{text!r}: {_METRICS_USAGE}")
    try:
        if host.startswith("[") and host.endswith("]"):
            host = f"[{ipaddress.IPv6Address(host[1:-1])}]"
        else:
            host = str(ipaddress.IPv4Address(host or "0.0.0.0"))
        p = int(port)
    except ValueError:
        raise ValueError(f"{text!r}: {_METRICS_USAGE}") from None
    if not 1 <= p <= 65535:
        raise ValueError(f"port {p} out of range 1..65535")
    return f"{host}:{p}"


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
    help: str                 # "{default}" in it stands for the default
    kind: str = "value"       # value | bool | list
    metavar: str | None = None
    group: str = "flanneld"   # flanneld | ours | kube | ignored
    check: object = None      # value -> None, raises ValueError (range checks)
    # kube: the one value accepted, flanneld's default (the daemon has no such setting)
    accepted: object = None

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def default(self):
        return self.accepted if self.group == "kube" else options.default(self.dest)

    @property
    def help_text(self) -> str:
        return self.help.replace("{default}", _default_text(self.default))

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper().replace("-", "_")


def _default_text(value) -> str:
    """A default as the help shows it: as it would be written on the command line."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def _queue_count(v):
    queues.check(v)


def _range(lo, hi, unit=""):
    def check(v):
        if not lo <= v <= hi:
            raise ValueError(f"{v}{unit} out of range {lo}..{hi}")
    return check


FLAGS: tuple[Flag, ...] = (
    # --- etcd (flanneld)
    Flag("etcd-endpoints", _parse_endpoints,
         "a comma-delimited list of etcd endpoints (default: {default})", metavar="URLS"),
    Flag("etcd-prefix", _parse_str, "etcd prefix (default: {default})", metavar="PREFIX"),
    Flag("etcd-keyfile", _parse_str, "SSL key file used to secure etcd communication",
         metavar="FILE"),
    Flag("etcd-certfile", _parse_str, "SSL certification file used to secure etcd communication",
         metavar="FILE"),
    Flag("etcd-cafile", _parse_str, "SSL Certificate Authority file used to secure etcd communication",
         metavar="FILE"),
    Flag("etcd-username", _parse_str, "username for BasicAuth to etcd", metavar="NAME"),
    Flag("etcd-password", _parse_str, "password for BasicAuth to etcd", metavar="PASSWORD"),
    # --- interface (flanneld)
    Flag("iface", _parse_str, "interface to use (IP or name) for inter-host communication; "
         "repeatable, the first that exists wins", kind="list", metavar="NAME_OR_IP"),
    Flag("iface-regex", _parse_regex, "regex of the interface to use (matched against IPs "
         "first, then names); repeatable, first match wins", kind="list", metavar="REGEX"),
    Flag("iface-can-reach", _parse_ipv4, "use the interface the kernel would route to this IP "
         "(like `ip route get IP`)", metavar="IP"),
    Flag("public-ip", _parse_ipv4, "IP accessible by other nodes for inter-host communication "
         "(the PublicIP of this host's lease; default: the interface address)", metavar="IP"),
    Flag("public-ipv6", _parse_public_ipv6, "IPv6 address accessible by other nodes (the "
         "PublicIPv6 of this host's lease, with EnableIPv6 only): pods' IPv6 goes to peers that "
         "have one over IPv6 UDP; default: the interface's first global IPv6 address, if any",
         metavar="IP"),
    # --- subnet (flanneld)
    Flag("subnet-file", _parse_str,
         "filename where env variables (subnet, MTU, ...) will be written to "
         "(default: {default})", metavar="PATH"),
    Flag("subnet-lease-renew-margin", _parse_int,
         "subnet lease renewal margin, in minutes, ranging from 1 to 1439 (default: {default})",
         metavar="MINUTES", check=_range(1, 1439, " minutes")),
    # --- iptables (flanneld)
    Flag("ip-masq", _parse_bool, "setup IP masquerade rule for traffic destined outside of "
         "overlay network (iptables chain FLANNEL-POSTRTG, or nftables when iptables is missing; "
         "with EnableIPv6 also for IPv6Network, in ip6tables); "
         "the rules stay after exit, remove them with: " + "; ".join(firewall.MASQ_REMOVAL)
         + " (nftables: " + firewall.REMOVAL_COMMANDS["nft"][0] + ")",
         kind="bool"),
    Flag("ip-masq-fully-random-disable", _parse_bool, "disable the --random-fully flag of "
         "the MASQUERADE rules (nftables: fully-random) that --ip-masq installs "
         "(default: {default})", kind="bool"),
    Flag("ip-blackhole-route", _parse_bool, "add a blackhole route for this host's lease "
         "subnet, so that traffic to an address of it that no workload holds is dropped here "
         "instead of leaving the host; checked every --iptables-resync seconds, moved with the "
         "lease, left in place at exit (default: {default})", kind="bool"),
    Flag("iptables-resync", _parse_int, "resync period for iptables rules, in seconds "
         "(default: {default})", metavar="SECONDS", check=_range(1, 86400, " s")),
    Flag("iptables-forward-rules", _parse_bool, "add default accept rules to the FORWARD "
         "chain in iptables (chain FLANNEL-FWD, jumped to first; with EnableIPv6 also in "
         "ip6tables; default: {default}); the rules "
         "stay after exit, remove them with: " + "; ".join(firewall.FWD_REMOVAL), kind="bool"),
    # --- health (flanneld)
    Flag("healthz-ip", _parse_ip, "the IP address for healthz server to listen "
         "(default: {default})", metavar="IP"),
    Flag("healthz-port", _parse_int, "the port for healthz server to listen (0 to disable; "
         "default: {default})", metavar="PORT", check=_range(0, 65535)),
    # --- logging (klog flags flanneld copies)
    Flag("v", _parse_klog_level, "log level: 0 = operator events, 1 = also per-packet error "
         "summaries and details, 2+ = debug", metavar="LEVEL", check=_range(-2 ** 31, 2 ** 31 - 1)),
    Flag("vmodule", _parse_str, "accepted for compatibility (klog); ignored", metavar="SPEC",
         group="ignored"),
    Flag("log_backtrace_at", _parse_str, "accepted for compatibility (klog); ignored",
         metavar="FILE:LINE", group="ignored"),
    Flag("log-format", _choice(*logfmt.FORMATS), "how log lines are written on stderr: text "
         "(time with zone, level, logger, message) or json (one object per line: time, level, "
         "logger, message and the event's fields, e.g. subnet, public_ip, reason); under "
         "systemd each line starts with its syslog priority (<3> error ... <7> debug) and text "
         "has no time of its own, so that journalctl -p filters on it (default: {default})",
         metavar="text|json", group="ours"),
    # --- ours
    Flag("engine", _choice("kernel", "c", "python", "auto"), "forwarding path: kernel (the "
         "tc programs of the kernel path, the C engine, else Python, as their slow path; fails "
         "at start where they cannot load and attach), c (the batched C engine alone), python "
         "(pure Python alone), auto (kernel where the programs load and attach, else C if "
         "built, else Python; the log says which and why; default: {default}, or "
         "$DATAPLANE_ENGINE)", metavar="kernel|c|python|auto", group="ours"),
    Flag("accept-from", _choice("leases", "any"), "which UDP sources to accept: leases "
         "(only the PublicIP of a known lease) or any (as flanneld; use it when peers "
         "reach this host through address translation; default: {default})",
         metavar="leases|any", group="ours"),
    Flag("strict-sources", _parse_bool, "drop a datagram whose inner source is not in "
         "the subnet of the lease whose PublicIP sent it (kernel WireGuard's rule; counted as "
         "drop_inner_foreign). It breaks hosts that send from addresses outside their lease, "
         "e.g. a host that forwards other networks' traffic into the overlay without "
         "masquerading. A datagram whose inner source is this host's own is dropped either "
         "way (default: {default})", kind="bool", group="ours"),
    Flag("icmp-rate", _parse_int, "ICMP errors (net unreachable, time exceeded) the engine "
         "sends per second at most, as routers limit them; the host's total, split over the "
         "queues; 0 = unlimited (default: {default})",
         metavar="N", check=_range(0, 2 ** 32 - 1), group="ours"),
    Flag("icmp-burst", _parse_int, "ICMP errors allowed in a burst above --icmp-rate "
         "(default: {default})", metavar="N", check=_range(1, 2 ** 32 - 1), group="ours"),
    Flag("coalesce-usecs", _parse_int, "bounded-delay batching, as a NIC's interrupt "
         "coalescing: after the engine forwarded packets it waits this many microseconds for "
         "more before it looks again, so that a wake-up finds a batch rather than one packet "
         "(fewer wake-ups and syscalls per small packet; a packet may wait up to this much "
         f"longer); 0 = off (default: {{default}}, at most {COALESCE_MAX_US})", metavar="US",
         check=_range(0, COALESCE_MAX_US), group="ours"),
    Flag("realtime-priority", _parse_int, "run the engine loop threads SCHED_FIFO at this "
         "priority (1..99), so that a forwarder woken by a packet runs at once instead of after "
         "a busy application's time slice (much lower latency under load on shared cores); needs "
         "CAP_SYS_NICE, which the shipped unit denies (docs/flags.md#realtime-priority: lift RestrictRealtime in a "
         "drop-in); 0 = off (default: {default})", metavar="N", check=_range(0, 99), group="ours"),
    Flag("metrics", _parse_metrics, "where to serve Prometheus /metrics: IP:PORT for a "
         "listener of its own, 'healthz' (or empty, the default) for the healthz server when "
         "--healthz-port is set, 'off' to disable", metavar="IP:PORT", group="ours"),
    Flag("queues", _parse_int, "forwarding queues: each one a flannel0 queue "
         "(IFF_MULTI_QUEUE), a UDP socket on the same address and port (SO_REUSEPORT) and an "
         "engine thread; 1 = flanneld's single queue (default: the number of CPUs, at most 8; "
         "--trace runs 1)", metavar="N", check=_queue_count, group="ours"),
    Flag("offload", _choice(*OFFLOAD_MODES), "kernel offloads for the C "
         "engine: auto (what this kernel accepts of TUN TSO/USO, UDP GSO and GRO; the wire "
         "format does not change) or off (default: {default})",
         metavar="auto|off", group="ours"),
    Flag("handover", _parse_bool, "take flannel0, the UDP sockets and the lease over "
         "from the flannel-udp running on this host (through --handover-socket): it stops "
         "forwarding, this one starts, it exits; no packet is lost. Nobody listening there: a "
         "normal start (under systemd, `systemctl restart` does the same through its fd store)",
         kind="bool", group="ours"),
    Flag("handover-socket", _parse_str, "the unix socket (root only) on which "
         "the daemon offers a handover to a new one, and on which --handover asks for it; "
         "empty: no handover (default: {default})",
         metavar="PATH", group="ours"),
    Flag("status-socket", _parse_str, "the unix socket (root only) on which the daemon "
         "answers `flannel-udp status` (works with --healthz-port 0), and which `flannel-udp "
         "cleanup` checks; empty: none (default: {default})", metavar="PATH", group="ours"),
    Flag("bpf-pins", _parse_str, "where the kernel path keeps its programs and maps pinned "
         "(on a bpffs, mounted at /sys/fs/bpf where none is), one directory per flannel device: "
         "they outlive the daemon, which adopts them at its next start; `flannel-udp status` and "
         "`cleanup` read the same flag (default: {default})", metavar="DIR", group="ours"),
    Flag("ipv6-underlay-fallback", _parse_bool, "with EnableIPv6 and a PublicIPv6: probe "
         "each peer whose pods' IPv6 goes over the IPv6 underlay (an ICMPv6 echo between the "
         "flannel0s, every 5 s or more), and send its pods' IPv6 over the IPv4 underlay while "
         "the probes go unanswered, within 30 s, until they are answered again; false: never "
         "(default: {default})", kind="bool", group="ours"),
    Flag("trace-remote", _parse_bool, "serve GET /debug/trace to clients that are not on "
         "loopback too (it shows the headers of forwarded packets, with ?payload=1 their "
         "content; default: loopback clients only)", kind="bool", group="ours"),
    Flag("trace", _parse_bool, "enable the engine's packet trace ring and serve it as JSON "
         "at GET /debug/trace?after=N (on the healthz and metrics servers)", kind="bool",
         group="ours"),
    # --- flanneld's Kubernetes mode: flanneld's defaults accepted (unit files and
    # Helm charts spell them out), anything else refused in resolve()
    Flag("kube-subnet-mgr", _parse_bool, "Kubernetes subnet manager: only {default}",
         kind="bool", group="kube", accepted=False),
    Flag("kube-api-url", _parse_str, "only empty", group="kube", metavar="URL", accepted=""),
    Flag("kubeconfig-file", _parse_str, "only empty", group="kube", metavar="PATH", accepted=""),
    Flag("kube-annotation-prefix", _parse_str, "only {default}", group="kube", metavar="PREFIX",
         accepted="flannel.alpha.coreos.com"),
    Flag("net-config-path", _parse_str, "only {default}", group="kube", metavar="PATH",
         accepted="/etc/kube-flannel/net-conf.json"),
    Flag("set-node-network-unavailable", _parse_bool, "only {default}", kind="bool",
         group="kube", accepted=True),
)
FLAG_BY_NAME = {f.name: f for f in FLAGS}


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
        return ["-" + flag.name, "--" + flag.name]   # -v and Go's --v
    return ["--" + flag.name, "-" + flag.name]       # --iface and Go's -iface


def go_flag_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Read ``argv`` as Go's flag package does; return (the flags spelled
    ``--name=value`` for argparse, the ignored rest). Names that are not in
    FLAGS (``--version``, ``--help``, typos) go to argparse unchanged."""
    out = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return out, argv[i + 1:]
        if len(arg) < 2 or not arg.startswith("-"):
            return out, argv[i:]
        body = arg[2:] if arg.startswith("--") else arg[1:]
        if not body or body[0] in "-=":
            raise FlagError(f"bad flag syntax: {arg}")
        name, has_value, value = body.partition("=")
        flag = FLAG_BY_NAME.get(name)
        i += 1
        if flag is None:
            out.append("--help" if name in ("h", "help") else arg)
            continue
        if flag.kind != "bool" and not has_value:
            # Go takes the next argument as the value, whatever it looks like
            if i == len(argv):
                raise FlagError(f"flag needs an argument: {arg}")
            value, i = argv[i], i + 1
        elif not has_value:
            value = "true"
        out.append(f"--{name}={value}")
    return out, []


class _GoFlagParser(argparse.ArgumentParser):
    """`run`'s parser: Go's flag syntax (go_flag_args); a bad flag exits 1
    (argparse's 2; flanneld's usage handler exits 0, which a service manager
    would take for a clean stop: docs/flannel-compat.md#known-command-lines)."""

    def parse_known_args(self, args=None, namespace=None):
        try:
            flag_args, ignored = go_flag_args(sys.argv[1:] if args is None else list(args))
        except FlagError as e:
            self.error(str(e))
        ns, extras = super().parse_known_args(flag_args, namespace)
        if extras:
            self.error(f"flag provided but not defined: {extras[0]}")
        ns.ignored_args = ignored
        return ns, extras

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register every flag on ``parser`` (defaults stay None: see resolve())."""
    # argparse builds every subcommand's parser with one class; run's reads Go's syntax
    parser.__class__ = _GoFlagParser
    parser.formatter_class = _HelpFormatter
    parser.usage = "%(prog)s [--flag[=value] | -flag[=value] ...]"
    parser.allow_abbrev = False  # flanneld does not accept abbreviations either
    groups = {
        "flanneld": parser.add_argument_group("flanneld flags (same names, meanings and defaults)"),
        "ours": parser.add_argument_group("flannel-udp flags"),
        "ignored": parser.add_argument_group("accepted for compatibility, ignored"),
        "kube": parser.add_argument_group(
            "flanneld's Kubernetes mode, which flannel-udp does not have: accepted with "
            "flanneld's default values only"),
    }
    for f in FLAGS:
        g = groups[f.group]
        opts = _option_strings(f)
        help_text = f.help_text + f" [env {f.env}]"
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


KUBE_REFUSAL = ("flannel-udp has no Kubernetes subnet manager: run it with etcd "
                "(--etcd-endpoints, the network config in <etcd-prefix>/config), or use "
                "flanneld for Kubernetes mode")


def _go_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


def resolve(args: argparse.Namespace, environ=None) -> Options:
    """Fill flags not on the command line from FLANNELD_* env vars, then from
    the defaults; validate; raise FlagError naming the flag."""
    env = os.environ if environ is None else environ
    opts = Options()
    ignored = getattr(args, "ignored_args", None)
    if ignored:
        opts.warnings.append(
            f"ignored {' '.join(ignored)!r}: flags end at the first argument that is no flag, "
            "as in flanneld (write a boolean as -flag=false, not -flag false)")
    for f in FLAGS:
        value = getattr(args, f.dest, None)
        source = "flag"
        where = f"--{f.name}" if len(f.name) > 1 else f"-{f.name}"
        raw = env.get(f.env) if value is None else None
        if raw:
            try:
                value = f.parse(raw)
                source = "env"
                where = f"{f.env} (environment, for {where})"
            except ValueError as e:
                # flanneld logs an unparsable FLANNELD_* value and goes on without it
                opts.warnings.append(f"ignored {f.env}={raw!r} (for {where}): {e}; "
                                     f"using {_go_text(f.default)}")
            else:
                if f.kind == "list":
                    value = [value]
        if value is None:
            source = "default"
            value = list(f.default) if isinstance(f.default, list) else f.default
        if f.check is not None and source != "default":
            try:
                f.check(value)
            except ValueError as e:
                raise FlagError(f"invalid value for {where}: {e}") from None
        if f.group == "kube":
            if value != f.default:
                raise FlagError(f"{where}={_go_text(value)} asks for flanneld's Kubernetes "
                                f"mode; {KUBE_REFUSAL}. Its default {_go_text(f.default)} is "
                                "accepted.")
            continue
        if f.group == "ignored" and source != "default" and value:
            opts.warnings.append(f"{where} is accepted for compatibility and ignored")
        setattr(opts, f.dest, value)
        opts.sources[f.dest] = source
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

