"""What the daemon checks on this host before it writes anything to etcd.

A lease written to etcd lives 24 hours, and a daemon that exits at the TUN device, the UDP port or
the firewall leaves it there, blocking a subnet for a host that never forwarded. So what can be
known locally is checked first, and a start that would fail anyway exits 1 with every problem
found and how to fix it, having written nothing:

* :func:`local` (before etcd is asked anything): CAP_NET_ADMIN (flannel0, its address and route,
  the firewall); /dev/net/tun opens; with ``--ip-masq``, an ``iptables`` or ``nft`` binary (the
  forward rules alone only warn, as flanneld: daemon/startup.py install_rules); CAP_NET_RAW when
  the tool is iptables-legacy (its raw socket); subnet.env's directory can be made and written;
  ``--realtime-priority`` is allowed;
* :func:`udp_port` (once the network config names the port, a read; before the lease): the port
  is free on the interface address, and bindable (CAP_NET_BIND_SERVICE below the unprivileged
  range);
* :func:`firewall_tools` (once the config is read, before the lease): with ``--ip-masq``, the tool
  of each family's rules as the config chooses it: with ``"EnableNFTables": true`` ``nft``, with
  ``"EnableIPv6": true`` also ``ip6tables`` or ``nft`` for the IPv6 rules (a host can have
  iptables without ip6tables), and CAP_NET_RAW for ip6tables-legacy as for iptables-legacy.

The host's forwarding sysctls (``net.ipv4.ip_forward``, with EnableIPv6 also
``net.ipv6.conf.all.forwarding``) are not among them: off, they are a warning said at the same
point of the start and reminded while they stay off (daemon/host_forwarding.py), because the CNI
bridge plugin switches them on only with the first pod, which waits for this daemon's subnet.env.

What a daemon that takes over already holds (flannel0's queues, the bound sockets:
daemon/inherited.py) is not checked: opening them again would fail on the holder's own fds.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import subprocess
import tempfile

from ..host.udpsock import endpoint
from .startup import StartupError

log = logging.getLogger(__name__)

TUN_PATH = "/dev/net/tun"
# <linux/capability.h>
CAP_NET_BIND_SERVICE = 10
CAP_NET_ADMIN = 12
CAP_NET_RAW = 13
UNIT_CAPS = ("CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE, as in "
             "packaging/flannel-udp.service")


class PreflightError(StartupError):
    """One or more things this host lacks; the message lists each with its fix (exit 1)."""


def effective_caps(status_path: str = "/proc/self/status") -> int:
    """The effective capability set of this process, as a bit mask."""
    with open(status_path) as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def has_cap(cap: int, caps: int | None = None) -> bool:
    return bool((effective_caps() if caps is None else caps) >> cap & 1)


def _raise(problems: list[str]) -> None:
    if problems:
        raise PreflightError(
            "cannot run on this host (nothing was written to etcd):\n  - "
            + "\n  - ".join(problems))


def local(opts, inherited: bool = False) -> None:
    """The checks that need neither etcd nor the config; PreflightError naming each problem."""
    caps = effective_caps()
    problems = [p for p in (_net_admin(caps),
                            None if inherited else _tun(),
                            _firewall(opts, caps),
                            _subnet_dir(opts.subnet_file),
                            _realtime(opts.realtime_priority)) if p]
    _raise(problems)


def udp_port(ext, port: int, ip=None) -> None:
    """The port the config names, free and bindable on the interface address (``ip``: on the
    IPv6 underlay's)."""
    _raise([p for p in (_udp(str(ext.iface_addr if ip is None else ip), port),) if p])


def firewall_tools(opts, config) -> None:
    """--ip-masq's tool for each family the config asks rules for (:func:`local` looked for
    iptables or nft before the config was known); PreflightError naming the package."""
    from ..host import firewall
    if not opts.ip_masq:
        return                  # forward rules alone: a warning at install time, as flanneld
    caps = effective_caps()
    problems = []
    for network in (config.network, config.ipv6_network if config.enable_ipv6 else None):
        if network is None:
            continue
        fam = firewall.family_of(network)
        tool, _ = firewall.choose_tool(enable_nftables=config.enable_nftables, fam=fam)
        if tool is None:
            problems.append(f"{firewall.missing_tool(network, config.enable_nftables)} (PATH "
                            f"{os.environ.get('PATH', '')})")
        elif (fam is firewall.V6 and tool == "iptables" and not has_cap(CAP_NET_RAW, caps)
              and _iptables_legacy(fam.iptables)):
            problems.append(_legacy(fam.iptables))
    _raise(problems)


def _net_admin(caps: int) -> str | None:
    if has_cap(CAP_NET_ADMIN, caps):
        return None
    if os.geteuid() != 0:
        return (f"not running as root (uid {os.geteuid()}) and without CAP_NET_ADMIN, which "
                "flannel0, its address and route and the firewall rules need: run it as root")
    return ("running as root without CAP_NET_ADMIN (a capability bounding set took it away: "
            "CapabilityBoundingSet=, capsh --drop, setpriv, a container's --cap-drop), which "
            f"flannel0, its address and route and the firewall rules need: give it back ({UNIT_CAPS}; "
            "docker run --cap-add NET_ADMIN)")


def _tun() -> str | None:
    try:
        fd = os.open(TUN_PATH, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return (f"{TUN_PATH} does not exist: load the tun module (modprobe tun); in a "
                    "container, pass the device (--device /dev/net/tun)")
        return (f"cannot open {TUN_PATH} ({e.strerror}): run as root; under systemd keep "
                f"DeviceAllow={TUN_PATH} rw; in a container, pass the device (--device "
                f"{TUN_PATH})")
    os.close(fd)
    return None


def _firewall(opts, caps: int) -> str | None:
    from ..host.firewall import detect_tool
    if not (opts.ip_masq or opts.iptables_forward_rules):
        return None
    tool = detect_tool()
    if tool is None:
        if not opts.ip_masq:
            return None     # forward rules alone: a warning at install time, as flanneld
        return ("--ip-masq needs iptables or nftables and neither `iptables` nor `nft` is on "
                f"the PATH ({os.environ.get('PATH', '')}): install one (apt-get install "
                "iptables) or run without --ip-masq")
    if tool == "iptables" and not has_cap(CAP_NET_RAW, caps) and _iptables_legacy():
        return _legacy("iptables")
    return None


def _legacy(binary: str) -> str:
    return (f"{binary} here is {binary}-legacy, which needs CAP_NET_RAW for its rules "
            f"(--ip-masq, --iptables-forward-rules): give it ({UNIT_CAPS}), or switch to "
            f"{binary}-nft (update-alternatives --set {binary} /usr/sbin/{binary}-nft)")


def _iptables_legacy(binary: str = "iptables") -> bool:
    try:
        p = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return "legacy" in p.stdout


def _subnet_dir(path: str) -> str | None:
    """subnet.env is written as a new file in its directory, renamed over the old one
    (host/atomicfile.py), the directory made first when missing: try exactly that, and leave
    nothing behind."""
    directory = os.path.dirname(os.path.abspath(path))
    existing = directory
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    fix = "choose another --subnet-file (FLANNELD_SUBNET_FILE)"
    if not os.path.isdir(existing):
        return (f"cannot write the subnet file {path}: {existing} is not a directory; remove it "
                f"or {fix}")
    try:
        if existing == directory:
            fd, tmp = tempfile.mkstemp(prefix=".flannel-udp-check.", dir=directory)
            os.close(fd)
            os.unlink(tmp)
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".flannel-udp-check.", dir=existing))
    except OSError as e:
        where = directory if existing == directory else f"{existing} (to make {directory})"
        why = ("a read-only file system" if e.errno == errno.EROFS else e.strerror)
        return (f"cannot write the subnet file {path}: writing in {where} failed: {why}; make it "
                f"writable (under systemd: ReadWritePaths=) or {fix}")
    return None


def _realtime(priority: int) -> str | None:
    from ..host import sched
    if not priority:
        return None
    try:
        sched.probe(priority)
    except OSError as e:
        return (f"--realtime-priority {priority}: {e.strerror or e}; it needs CAP_SYS_NICE "
                "(docs/flags.md#realtime-priority), or run without it")
    return None


def _udp(ip: str, port: int) -> str | None:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    where = endpoint(ip, port)
    try:
        if family == socket.AF_INET6:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        probe.bind((ip, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return (f"UDP {where} (the network config's Backend Port) is in use: is "
                    "flanneld or another flannel-udp still running on this host? Stop it, or "
                    "find the holder with: ss -ulpn sport = :%d" % port)
        if e.errno == errno.EACCES:
            return (f"UDP {where}: binding a port below "
                    f"{_unprivileged_port_start()} needs CAP_NET_BIND_SERVICE: give it "
                    f"({UNIT_CAPS}) or choose a Backend Port above it")
        errname = errno.errorcode.get(e.errno, str(e.errno))
        if e.errno == errno.EADDRNOTAVAIL:
            return (f"bind(UDP {where}) failed: {errname} ({e.strerror}): {ip} is no address "
                    "of this host (any more), or an IPv6 one still tentative (duplicate "
                    "address detection); check --iface"
                    f"{' and --public-ipv6' if family == socket.AF_INET6 else ''}")
        return f"bind(UDP {where}) failed: {errname} ({e.strerror})"
    finally:
        probe.close()
    return None


def _unprivileged_port_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1024
