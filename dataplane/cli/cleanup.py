"""`flannel-udp cleanup`: what a host that leaves the overlay for good runs, once the daemon is
stopped. The daemon leaves its rules, subnet.env and lease behind on purpose (so that a restart
loses nothing: docs/operating.md#firewall); this removes them."""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys

from . import flanneld_flags

HELP = "remove what the daemon leaves on a host that leaves the overlay for good (--dry-run)"
DESCRIPTION = """\
Remove what flannel-udp leaves behind on purpose when it stops, for a host that leaves the
overlay for good:

  * the firewall rules: the jumps to FLANNEL-POSTRTG and FLANNEL-FWD, both chains (and rules
    of older flannels carrying their comments), in iptables and ip6tables, and the nftables
    tables ip flannel-ipv4,
    ip6 flannel-ipv6 (flanneld's, and ours with EnableNFTables) and ip flannel-udp (older
    flannel-udp versions);
  * the kernel path (docs/kernel-path.md): its tc programs off flannel0 and the external
    interface (and a clsact qdisc left holding no filter), its maps' and programs' pins
    under --bpf-pins;
  * a flannel0 that outlived its daemon (a persistent TUN device named flannel<N>: the
    kernel path keeps one on purpose);
  * the routes DirectRouting made to peers on this host's link (proto 153), and their
    nexthop objects (proto 153, ids 0x99000000-0x99ffffff);
  * the blackhole route of --ip-blackhole-route, for the subnet subnet.env names;
  * subnet.env (--subnet-file) and socket files nobody listens on any more;
  * with --release-lease, this host's lease in etcd: the key whose PublicIP is this host's
    (the interface is chosen as `run` chooses it; a reservation, a key without a TTL, is the
    operator's and stays).

It takes `run`'s flags (and FLANNELD_* variables), so the daemon's own command line or
environment file works: it reads the etcd flags, the interface flags, --subnet-file,
--status-socket, --handover-socket and --bpf-pins; the others are accepted and ignored.

--kernel-path removes the kernel path alone (its filters, pins and a persistent flannel0) and
leaves the rest: the package's removal runs it, as nothing could adopt the path any more, with
--env-file=/etc/default/flannel-udp so that a --bpf-pins set only there is found.

It refuses while a daemon runs on this host: its status or handover socket listens, a
`flannel-udp run` process runs in this network namespace, or a flannel0 is held open (by a
daemon, or by systemd's fd store: systemctl stop flannel-udp first). --dry-run prints what it
would do and changes nothing. Exit status 0 when done (or nothing to do), 1 otherwise.

Example:
  systemctl stop flannel-udp && systemctl disable flannel-udp
  flannel-udp cleanup --dry-run -etcd-endpoints=http://10.0.0.1:2379 -iface=eth1
  flannel-udp cleanup --release-lease -etcd-endpoints=http://10.0.0.1:2379 -iface=eth1
"""

TUN_NAME = re.compile(r"flannel\d+$")
IFF_PERSIST = 0x800
UNIX_LISTENING = 0x10000        # __SO_ACCEPTCON in /proc/net/unix's Flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("cleanup")        # first in --help, before run's flags
    g.add_argument("--dry-run", action="store_true",
                   help="print what would be removed, change nothing")
    g.add_argument("--release-lease", action="store_true",
                   help="also delete this host's lease in etcd (its subnet goes back to the "
                        "pool; needs the etcd flags)")
    g.add_argument("--kernel-path", action="store_true",
                   help="remove the kernel path only (its filters, pins and a persistent "
                        "flannel0), nothing else: what the package's removal does")
    g.add_argument("--env-file", metavar="FILE",
                   help="also read the unit's environment file (systemd's EnvironmentFile=, "
                        "/etc/default/flannel-udp): its FLANNELD_* variables and the flags in "
                        "its FLANNEL_UDP_OPTIONS, under this command's own; a missing file is "
                        "none (what the package's removal passes)")
    flanneld_flags.add_arguments(parser)
    parser.usage = ("%(prog)s [--dry-run] [--release-lease] [--kernel-path] [--env-file=FILE] "
                    "[--bpf-pins=DIR] [run's flags ...]")
    parser.set_defaults(_parser=parser)


# ------------------------------------------------------------------ the unit's settings

def read_env_file(path: str) -> dict:
    """``KEY=VALUE`` lines as systemd's EnvironmentFile= reads them (comments, blank lines, a
    value in matching quotes); {} when there is no file."""
    out = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if not sep or not key or key[0] in "#;":
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def with_env_file(args, environ=os.environ):
    """(args, environment) as the unit's daemon has them: ``args.env_file``'s FLANNEL_UDP_OPTIONS
    fill the flags this command was not given, its FLANNELD_* variables those this command's
    environment lacks."""
    unit = read_env_file(args.env_file)
    options = shlex.split(unit.get("FLANNEL_UDP_OPTIONS", ""))
    given = args._parser.parse_args(options) if options else None
    for flag in flanneld_flags.FLAGS:
        if given is not None and getattr(args, flag.dest, None) is None:
            setattr(args, flag.dest, getattr(given, flag.dest, None))
    return args, {**{k: v for k, v in unit.items() if k.startswith("FLANNELD_")}, **environ}


# ------------------------------------------------------------------ is a daemon running?

def is_daemon_command(argv: list[str]) -> bool:
    """Whether a command line is `flannel-udp run`: the console script, ``python -m dataplane``,
    or a child started as this package starts them (dataplane/host/child.py), then ``run``."""
    for i, a in enumerate(argv[:-1]):
        entry = (os.path.basename(a) == "flannel-udp"
                 or (a == "dataplane" and i > 0 and argv[i - 1] == "-m")
                 or "from dataplane.cli import main" in a)
        if entry and argv[i + 1] == "run":
            return True
    return False


def daemon_pids(proc: str = "/proc") -> list[int]:
    """`flannel-udp run` processes in this network namespace (one in another namespace runs for
    another host, or another container)."""
    mine = os.stat(f"{proc}/self/ns/net")
    out = []
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            ns = os.stat(f"{proc}/{entry}/ns/net")
            with open(f"{proc}/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:             # gone meanwhile, or a kernel thread
            continue
        if (ns.st_dev, ns.st_ino) == (mine.st_dev, mine.st_ino) and is_daemon_command(argv):
            out.append(int(entry))
    return sorted(out)


def listening(path: str) -> bool:
    """Whether a unix socket listens on ``path`` in this network namespace, read from
    /proc/net/unix rather than by connecting (the handover socket takes a connection for a new
    daemon and would log a failed handover)."""
    if not path:
        return False
    try:
        with open("/proc/net/unix") as f:
            next(f, None)
            for line in f:
                parts = line.split()
                if len(parts) >= 8 and parts[-1] == path and int(parts[3], 16) & UNIX_LISTENING:
                    return True
    except OSError:
        pass
    return False


def attached(name: str, sys_net: str = "/sys/class/net") -> bool:
    """Whether a process holds a queue of TUN device ``name``: the kernel turns its carrier on
    while one does (a device that is down has no carrier to read: taken as held by nobody)."""
    try:
        with open(os.path.join(sys_net, name, "carrier")) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def tun_devices(sys_net: str = "/sys/class/net") -> dict:
    """{name: persistent} of the TUN devices named flannel<N>."""
    out = {}
    try:
        names = os.listdir(sys_net)
    except OSError:
        return out
    for name in names:
        if not TUN_NAME.match(name):
            continue
        try:
            with open(os.path.join(sys_net, name, "tun_flags")) as f:
                flags = int(f.read().strip(), 16)
        except (OSError, ValueError):   # not a TUN device: not ours
            continue
        out[name] = bool(flags & IFF_PERSIST)
    return out


def running(opts) -> list[str]:
    """Why a daemon is taken to run on this host ([] when none is)."""
    why = []
    if listening(opts.status_socket):
        why.append(f"its status socket {opts.status_socket} listens")
    if listening(opts.handover_socket):
        why.append(f"its handover socket {opts.handover_socket} listens")
    pids = daemon_pids()
    if pids:
        why.append(f"`flannel-udp run` runs here (pid {', '.join(map(str, pids))})")
    held = [n for n, persistent in tun_devices().items() if not persistent or attached(n)]
    if held:
        why.append(f"{', '.join(held)} is held open (by a daemon, or systemd's fd store)")
    return why


# ------------------------------------------------------------------ what to remove

def _lease_steps(opts) -> list:
    """([(what, action)] for this host's lease(s) in etcd, the registry they use)."""
    from ..daemon.startup import make_registry, select_interface
    ext = select_interface(opts)
    registry = make_registry(opts)
    try:
        leases, _ = registry.list_leases()
    except Exception:
        registry.close()
        raise
    steps = []
    for lease in leases:
        if lease.public_ip != ext.ext_addr:
            continue
        key = registry.lease_key(lease.subnets)
        if lease.reservation:
            print(f"kept: {key} (PublicIP {lease.public_ip}) is a reservation (no TTL), the "
                  f"operator's; delete it with: etcdctl del {key}")
            continue

        def release(lease=lease):
            registry.delete_lease(lease.subnets)
            try:                    # the key is gone already; its TTL would end it anyway
                registry.revoke(lease.lease_id)
            except Exception:
                pass
        steps.append((f"etcd: delete the lease {key} (PublicIP {lease.public_ip})", release))
    if not steps:
        print(f"etcd: no lease with PublicIP {ext.ext_addr} under {opts.etcd_prefix}/subnets/")
    return steps, registry


def _unlink(path):
    def act():
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return act


def _del_link(name):
    def act():
        subprocess.run(["ip", "link", "del", name], check=True, capture_output=True, text=True,
                       timeout=30)
    return act


def _blackhole_steps(subnet_file: str) -> list:
    """[(what, action)] for the blackhole routes (--ip-blackhole-route's, or flanneld's) of the
    subnet ``subnet_file`` names: read now, before the file itself is removed."""
    from ..control.subnetfile import read_previous_subnet
    from ..host import blackhole
    subnet = read_previous_subnet(subnet_file)
    if subnet is None or not blackhole.present(subnet):
        return []
    return [(f"{blackhole.removal_command(subnet)}    # --ip-blackhole-route",
             lambda: blackhole.remove(subnet))]


def _kernel_path_steps(root: str) -> list:
    """[(what, action)] for each kernel path pinned under ``root``: its filters and pins."""
    from ..engine import bpf_pins
    dirs = bpf_pins.directories(root)
    if not dirs:
        return []
    from ..engine import bpf_pinned
    steps = []
    for d in dirs:
        try:
            seen = bpf_pinned.describe(d)
            on = [f"{p} on {v['attached']}" for p, v in seen["programs"].items() if v["attached"]]
            what = f"{', '.join(on) or 'no program attached'}; {len(seen['pins'])} pin(s)"
            kept = bpf_pins.OffloadRecord(d).read()
            if kept:
                what += f"; {', '.join(kept[1])} on again on {kept[0]}"
        except OSError as e:
            what = f"not readable: {e}"
        steps.append((f"remove the kernel path pinned at {d} ({what})",
                      lambda d=d: bpf_pinned.remove(d)))
    return steps


def _host_steps(opts) -> list:
    """[(what, action)] for the routes and files the daemon leaves."""
    from ..host import direct_routes, nexthops
    steps = []
    for subnet, via in sorted(direct_routes.installed().items(),     # IPv4's, then IPv6's
                              key=lambda item: (item[0].version, item[0])):
        steps.append((f"ip route del {subnet} via {via} proto {direct_routes.PROTO}    "
                      "# DirectRouting", lambda subnet=subnet: direct_routes.delete(subnet)))
    for nhid in nexthops.ours(direct_routes.PROTO):   # each takes its routes along
        steps.append((f"ip nexthop del id {nhid}    # DirectRouting's nexthop object",
                      lambda nhid=nhid: _delete_nexthop(nhid)))
    steps += _blackhole_steps(opts.subnet_file)
    if os.path.exists(opts.subnet_file):
        steps.append((f"rm {opts.subnet_file}", _unlink(opts.subnet_file)))
    for path in (opts.status_socket, opts.handover_socket):
        if path and os.path.exists(path) and not listening(path):
            steps.append((f"rm {path}    # nobody listens on it", _unlink(path)))
    return steps


def _delete_nexthop(nhid: int) -> None:
    from ..host import direct_routes
    for _, code in direct_routes.delete_nexthops([nhid]):
        raise OSError(code, os.strerror(code))


def main(args) -> int:
    from ..daemon.startup import StartupError
    from ..host import firewall
    try:
        environ = os.environ
        if args.env_file:
            args, environ = with_env_file(args)
        opts = flanneld_flags.resolve(args, environ)
    except (flanneld_flags.FlagError, OSError) as e:
        print(f"flannel-udp cleanup: error: {e}", file=sys.stderr)
        return 1
    refusal = running(opts)
    if refusal and not args.dry_run:
        print("flannel-udp cleanup: a daemon runs on this host: " + "; ".join(refusal)
              + ". Stop it first (systemctl stop flannel-udp).", file=sys.stderr)
        return 1
    steps = []
    for line in ([] if args.kernel_path else firewall.remove_all(dry_run=True)):
        steps.append((line, None))
    if any(a is None for _, a in steps):
        steps.append(("", lambda: firewall.remove_all()))   # one transaction for all of them
    steps += _kernel_path_steps(opts.bpf_pins)
    for name, persistent in sorted(tun_devices().items()):
        if persistent or not args.kernel_path:
            steps.append((f"ip link del {name}", _del_link(name)))
    if not args.kernel_path:
        steps += _host_steps(opts)
    registry = None
    try:
        if args.release_lease:
            try:
                more, registry = _lease_steps(opts)
            except StartupError as e:
                print(f"flannel-udp cleanup: {e}", file=sys.stderr)
                return 1
            except Exception as e:
                print(f"flannel-udp cleanup: cannot read the leases in etcd: {e}; check the "
                      "etcd flags", file=sys.stderr)
                return 1
            steps += more
        shown = [what for what, _ in steps if what]
        if args.dry_run:
            for what in shown:
                print(f"would: {what}")
            if not shown:
                print("nothing to clean up")
            if refusal:
                print("and it would refuse now: " + "; ".join(refusal))
                return 1
            return 0
        firewall_lines = []
        for what, act in steps:
            if act is None:             # a firewall line: done by the one transaction after them
                firewall_lines.append(what)
                continue
            try:
                act()
            except Exception as e:
                detail = getattr(e, "stderr", "") or str(e)
                print(f"flannel-udp cleanup: failed: {what or 'removing the firewall rules'}: "
                      f"{detail.strip()}", file=sys.stderr)
                return 1
            for line in (firewall_lines if not what else [what]):
                print(f"done: {line}", flush=True)
        if not shown:
            print("nothing to clean up")
        if not args.release_lease and not args.kernel_path:
            print("this host's lease stays in etcd until it expires (24 h); --release-lease "
                  "frees it now")
        return 0
    finally:
        if registry is not None:
            registry.close()
