"""A whole flannel-udp overlay on simulated hosts: etcd, the network config, one daemon per host.

(Over 450 lines as one piece: the daemons, their files and the etcd keys they share are one
object whose teardown must remove all of it also when a test fails.)

::

      h0 (netns)              h1 (netns)              h2 ...
      flannel0 10.5.a.0/32    flannel0 10.5.b.0/32
      flannel-udp run         flannel-udp run          one daemon per host, tracked by PID
      veth 192.168.77.1       veth 192.168.77.2
           |                        |
      -----+--------- bridge --------+----- switch netns: 192.168.77.254, etcd :<port>

Built on :class:`dataplane.testbed.hosts.Testbed` (namespaces, bridge, process
tracking) and :class:`dataplane.testbed.etcd.EtcdServer` (run inside the switch
namespace, listening on the underlay only). Each daemon is
``ip netns exec <ns> python -m dataplane run --etcd-endpoints http://192.168.77.254:<port>
--iface <veth> --subnet-file <workdir>/<host>/subnet.env --engine <kind> --healthz-port 10254``;
its readiness is its systemd ``READY=1`` on a per-daemon ``NOTIFY_SOCKET`` (a path
socket, so it crosses namespaces). Logs go to ``<workdir>/<host>/daemon.log``.

Used by the integration tests, the teaching demo and ``perf/``::

    with Overlay(hosts=3, engine="c") as ov:
        a, b = ov.hosts[0], ov.hosts[1]
        ov.ping(a, ov.flannel_ip(b), count=3)
        ov.add_host(engine="python")
        ov.stop_etcd(); ...; ov.start_etcd()

Everything (daemons, etcd, namespaces, files) is removed by :meth:`close`, also
on a failed test (context manager / fixture teardown), and at interpreter exit.
"""
from __future__ import annotations

import base64
import datetime
import ipaddress
import itertools
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from ..control.registry import DEFAULT_PREFIX
from ..host.child import cli_argv
from .cpu_weight import CpuGroup
from .etcd import EtcdServer
from .hosts import Host, Testbed
from .processes import read_log
from .wait import wait_for
from .lease_writer import LeaseWriter

log = logging.getLogger(__name__)

DEFAULT_NETWORK = "10.5.0.0/16"
HEALTHZ_PORT = 10254
READY_TIMEOUT = 30.0


class OverlayError(RuntimeError):
    """A daemon did not come up (the message carries its log tail)."""


@dataclass
class DaemonProc:
    """One `flannel-udp run` process on one host."""
    host: Host
    engine: str
    args: tuple
    proc: subprocess.Popen
    dir: str
    notify: socket.socket = field(repr=False)
    started: float = 0.0
    ready_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def subnet_file(self) -> str:
        return os.path.join(self.dir, "subnet.env")

    @property
    def log_path(self) -> str:
        return os.path.join(self.dir, "daemon.log")

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        return read_log(self.log_path)


class Overlay:
    """etcd + network config + daemons on a :class:`Testbed`. A context manager."""

    def __init__(self, hosts: int = 0, *, engine: str = "auto", network: str = DEFAULT_NETWORK,
                 config: dict | None = None, prefix: str = DEFAULT_PREFIX, mtu: int = 1500,
                 daemon_args=(), healthz_port: int = HEALTHZ_PORT, wait: bool = True,
                 put_config: bool = True, ipv6: bool = False, cpu_weight: int | None = None):
        self.engine = engine
        # cpu_weight: each daemon in a cgroup of its own at this CPUWeight, as the shipped unit
        # runs it (cpu_weight.py); None: in its session's autogroup, as any program
        self.cpu_weight = cpu_weight
        self._cpu_groups: list[CpuGroup] = []
        self.prefix = prefix
        self.daemon_args = tuple(daemon_args)
        self.healthz_port = healthz_port
        self.config = config or {"Network": network, "Backend": {"Type": "udp"}}
        self.network = ipaddress.IPv4Network(self.config["Network"], strict=False)
        self.daemons: dict[str, DaemonProc] = {}
        self._writer: LeaseWriter | None = None
        # ipv6: the namespaces keep IPv6 on (pods with IPv6 addresses, hosts forwarding them)
        self.tb = Testbed(hosts=0, mtu=mtu, disable_ipv6=not ipv6)
        try:
            self.etcd = EtcdServer(host=self.tb.switch_ip, netns=self.tb.switch,
                                   name=f"fu-etcd-{self.tb.tag}")
            self.etcd.start()
            if put_config:
                self.put_config(self.config)
            for _ in range(hosts):
                self.add_host(wait=False)
            if wait:
                for d in list(self.daemons.values()):
                    self.wait_ready(d.host)
        except BaseException:
            self.close()
            raise

    # -- etcd ---------------------------------------------------------------
    @property
    def etcd_url(self) -> str:
        return self.etcd.client_url

    def etcdctl(self, *args, check: bool = True, input=None) -> subprocess.CompletedProcess:
        return self.etcd.etcdctl(*args, check=check, input=input)

    def put(self, key: str, value: "str | bytes") -> None:
        """Put any value (any size, any bytes) under ``key`` (relative keys go under the prefix)."""
        if not key.startswith("/"):
            key = f"{self.prefix}/{key}"
        value = value if isinstance(value, bytes) else value.encode()
        if value:
            self.etcdctl("put", key, input=value)
        else:                           # etcdctl refuses an empty stdin
            self.etcdctl("put", key, "")

    def put_config(self, config) -> None:
        text = config if isinstance(config, (str, bytes)) else json.dumps(config)
        self.put("config", text)

    def leases(self) -> dict:
        """{IPv4 subnet: PublicIP} as stored in etcd (a dual-stack key by its IPv4 part)."""
        r = self.etcdctl("get", "--prefix", f"{self.prefix}/subnets/", "-w", "json")
        out = {}
        for kv in json.loads(r.stdout).get("kvs", []):
            # tests put broken keys and values on purpose: anything unreadable is skipped
            key = base64.b64decode(kv["key"]).decode(errors="replace")
            # a dual-stack key names the IPv6 part after the IPv4 one: `...-24&fc00:66:0:1::-64`
            m = re.search(r"/(\d+\.\d+\.\d+\.\d+)-(\d+)(&[0-9a-f:]+-\d+)?$", key)
            try:
                doc = json.loads(base64.b64decode(kv.get("value", "")))
                out[ipaddress.IPv4Network(f"{m.group(1)}/{m.group(2)}")] = doc.get("PublicIP")
            except (AttributeError, ValueError, RecursionError):
                continue
        return out

    def lease_writer(self) -> LeaseWriter:
        """Writes and deletes many leases at once, one revision each (bursts; see its module)."""
        if self._writer is None:
            self._writer = LeaseWriter(self.tb, self.etcd_url, self.prefix)
        return self._writer

    def delete_lease(self, subnet) -> None:
        """Delete the lease of an IPv4 subnet, of either key shape (a dual-stack key names
        the IPv6 part after an "&")."""
        net = ipaddress.IPv4Network(subnet)
        key = f"{self.prefix}/subnets/{net.network_address}-{net.prefixlen}"
        self.etcdctl("del", key)
        self.etcdctl("del", "--prefix", key + "&")

    def stop_etcd(self) -> None:
        self.etcd.stop()

    def start_etcd(self) -> None:
        self.etcd.start(wait=True)

    # -- hosts and daemons ----------------------------------------------------
    @property
    def hosts(self) -> list[Host]:
        return list(self.tb.hosts)

    def host(self, key) -> Host:
        return self.tb.host(key)

    def add_host(self, *, engine: str | None = None, args=(), start: bool = True,
                 wait: bool = True, name: str | None = None, underlay6: bool = False,
                 behind_router: bool = False) -> Host:
        """A new simulated host, with its daemon started (and waited for) by default;
        ``underlay6``: with an IPv6 underlay address too (Testbed.add_underlay6);
        ``behind_router``: on the testbed's link behind its router (Testbed.add_host)."""
        h = self.tb.add_host(name, behind_router=behind_router)
        if underlay6:
            self.tb.add_underlay6(h)
        os.makedirs(self._dir(h), exist_ok=True)
        if start:
            self.start_daemon(h, engine=engine, args=args, wait=wait)
        return h

    def remove_host(self, host, *, delete_lease: bool = True) -> None:
        """Stop the host's daemon, delete its namespace and (by default) its lease."""
        h = self.host(host)
        subnet = self.subnet(h) if delete_lease else None
        self.stop_daemon(h)
        self.tb.remove_host(h)
        if subnet is not None and self.etcd.is_running():
            self.delete_lease(subnet)

    def _dir(self, host) -> str:
        return os.path.join(self.tb.workdir, self.host(host).name)

    def prefer_subnet(self, host, *parts) -> None:
        """Write the host's subnet.env as a previous run would leave it, naming ``parts``, one
        per family (an IPv4 subnet, and an IPv6 part, else none: a dual-stack daemon then picks
        one at random): its daemon then takes that subnet when it is free, so peers can be
        pointed at it beforehand."""
        by_version = {part.version: part for part in map(ipaddress.ip_network, parts)}
        lines = [f"FLANNEL_NETWORK={self.network}"]
        for version, name in ((4, "FLANNEL_SUBNET"), (6, "FLANNEL_IPV6_SUBNET")):
            part = by_version.get(version)
            if part is not None:
                lines.append(f"{name}={part.network_address + 1}/{part.prefixlen}")
        lines += [f"FLANNEL_MTU={self.tb.mtu - 28}", "FLANNEL_IPMASQ=false"]
        with open(os.path.join(self._dir(host), "subnet.env"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def daemon_command(self, host: Host, engine: str, args=()) -> list[str]:
        """The daemon's `flannel-udp` arguments; ``--iface <veth>`` unless ``args`` choose the
        interface."""
        args = [*self.daemon_args, *args]
        chooses = any(a.lstrip("-").split("=")[0] in ("iface", "iface-regex", "iface-can-reach",
                                                     "public-ip") for a in args)
        return ["run", "--etcd-endpoints", self.etcd_url, "--etcd-prefix", self.prefix,
                *([] if chooses else ["--iface", host.iface]),
                "--subnet-file", self.subnet_file(host),
                "--engine", engine, "--healthz-port", str(self.healthz_port), *args]

    def daemon_argv(self, host: Host, engine: str, args=()) -> list[str]:
        """The daemon's command line as a child process (this very package)."""
        return cli_argv(*self.daemon_command(host, engine, args))

    def start_daemon(self, host, *, engine: str | None = None, args=(), wait: bool = True,
                     env: dict | None = None) -> DaemonProc:
        h = self.host(host)
        if h.name in self.daemons and self.daemons[h.name].running():
            raise RuntimeError(f"{h.name}: a daemon is already running (pid "
                               f"{self.daemons[h.name].pid})")
        engine = engine or self.engine
        d_dir = self._dir(h)
        os.makedirs(d_dir, exist_ok=True)
        sock_path = os.path.join(d_dir, "notify.sock")
        if os.path.exists(sock_path):
            os.unlink(sock_path)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(sock_path)
        # Each host's handover and status sockets in its own directory, and its kernel path's
        # pins (the defaults are one per machine).
        full_env = dict(os.environ, NOTIFY_SOCKET=sock_path, PYTHONUNBUFFERED="1",
                        FLANNELD_HANDOVER_SOCKET=self.handover_socket(h),
                        FLANNELD_STATUS_SOCKET=self.status_socket(h),
                        FLANNELD_BPF_PINS=self.tb.bpf_pins(h))
        full_env.update(env or {})
        wrap = None
        if self.cpu_weight is not None:
            self._cpu_groups.append(CpuGroup(self.cpu_weight))
            wrap = self._cpu_groups[-1].wrap
        logf = open(os.path.join(d_dir, "daemon.log"), "ab")
        try:
            proc = self.tb.popen(h, self.daemon_argv(h, engine, args), wrap=wrap, stdout=logf,
                                 stderr=subprocess.STDOUT, env=full_env, text=False)
        finally:
            logf.close()
        d = DaemonProc(h, engine, tuple(args), proc, d_dir, notify, started=time.monotonic())
        self.daemons[h.name] = d
        if wait:
            self.wait_ready(h)
        return d

    def remove_kernel_path(self, host) -> subprocess.CompletedProcess:
        """`flannel-udp cleanup --kernel-path` on the host (its daemon stopped): what a kernel
        path that outlived the daemon left (filters, pins, a persistent flannel0) removed, for a
        test that starts the host again from nothing."""
        h = self.host(host)
        return self.tb.exec(h, cli_argv("cleanup", "--kernel-path",
                                        f"--bpf-pins={self.tb.bpf_pins(h)}",
                                        f"--status-socket={self.status_socket(h)}",
                                        f"--handover-socket={self.handover_socket(h)}",
                                        f"--subnet-file={self.subnet_file(h)}"))

    def handover_socket(self, host) -> str:
        """Where the host's daemon offers a handover (``--handover`` takes it)."""
        return os.path.join(self._dir(host), "handover.sock")

    def status_socket(self, host) -> str:
        """Where the host's daemon answers `flannel-udp status`."""
        return os.path.join(self._dir(host), "status.sock")

    def daemon(self, host) -> DaemonProc:
        return self.daemons[self.host(host).name]

    def wait_ready(self, host, timeout: float = READY_TIMEOUT) -> DaemonProc:
        """Wait for READY=1 from the host's daemon; OverlayError if it exits or times out."""
        d = self.daemon(host)
        if d.ready_at is not None:
            return d
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not d.running():
                raise OverlayError(f"{d.host.name}: daemon exited with {d.proc.returncode}:\n"
                                   + d.log_text()[-3000:])
            d.notify.settimeout(0.2)
            try:
                msg = d.notify.recv(4096).decode(errors="replace")
            except socket.timeout:
                continue
            if "READY=1" in msg.split("\n"):
                d.ready_at = time.monotonic()
                return d
        raise OverlayError(f"{d.host.name}: daemon not ready after {timeout}s:\n"
                           + d.log_text()[-3000:])

    def wait_log(self, host, text: str, timeout: float = 10.0) -> bool:
        """True once the host's daemon log contains ``text``."""
        d = self.daemon(host)
        return wait_for(lambda: text in d.log_text(), timeout, interval=0.1)

    def wait_exit(self, host, timeout: float = 10.0):
        """The daemon's exit code once it exits by itself (None if still running)."""
        d = self.daemon(host)
        try:
            return d.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop_daemon(self, host, *, sig: int = signal.SIGTERM, timeout: float = 10.0):
        """Signal the daemon (by PID) and wait; returns its exit code (None if none ran)."""
        h = self.host(host)
        d = self.daemons.pop(h.name, None)
        if d is None:
            return None
        rc = self.tb.kill(d.proc, sig=sig, timeout=timeout)
        d.notify.close()
        return rc

    def handover_daemon(self, host, *, engine: str | None = None, args=None,
                        timeout: float = READY_TIMEOUT) -> tuple[DaemonProc, int | None]:
        """Start a new daemon on the host with ``--handover``: it takes flannel0, the sockets and
        the lease over from the running one, which exits. Returns the new daemon (ready) and
        the old one's exit code."""
        h = self.host(host)
        old = self.daemons.pop(h.name)
        engine = engine or old.engine
        args = tuple(args if args is not None else old.args)
        if "--handover" not in args:
            args += ("--handover",)
        try:
            new = self.start_daemon(h, engine=engine, args=args, wait=True)
        except BaseException:
            if h.name in self.daemons:
                self.stop_daemon(h)
            self.daemons[h.name] = old
            raise
        try:
            old.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        rc = self.tb.kill(old.proc)
        old.notify.close()
        return new, rc

    def restart_daemon(self, host, *, engine: str | None = None, args=None,
                       wait: bool = True) -> DaemonProc:
        h = self.host(host)
        old = self.daemons.get(h.name)
        engine = engine or (old.engine if old else None)
        args = args if args is not None else (old.args if old else ())
        self.stop_daemon(h)
        return self.start_daemon(h, engine=engine, args=args, wait=wait)

    # -- what a host got ------------------------------------------------------
    def subnet_file(self, host) -> str:
        """The host's ``--subnet-file`` (there before its daemon ever starts)."""
        return os.path.join(self._dir(host), "subnet.env")

    def subnet_env(self, host) -> dict:
        out = {}
        with open(self.subnet_file(host)) as f:
            for line in f:
                k, _, v = line.strip().partition("=")
                if k:
                    out[k] = v
        return out

    def subnet(self, host) -> ipaddress.IPv4Network:
        """The host's lease subnet (from its subnet.env)."""
        return ipaddress.IPv4Interface(self.subnet_env(host)["FLANNEL_SUBNET"]).network

    def flannel_ip(self, host) -> str:
        """The host's flannel0 address: its lease's network address."""
        return str(self.subnet(host).network_address)

    # -- traffic ----------------------------------------------------------------
    def exec(self, host, argv, **kw) -> subprocess.CompletedProcess:
        return self.tb.exec(self.host(host), argv, **kw)

    def ping(self, src, dst: str, *, count: int = 3, interval: float = 0.2,
             deadline: float | None = None, wait: float = 1.0) -> dict:
        """Ping ``dst`` from host ``src``; returns {"sent", "received", "rtt_avg_ms", "rc"}."""
        deadline = deadline or (count * interval + wait + 2)
        r = self.exec(src, ["ping", "-n", "-q", "-c", str(count), "-i", str(interval),
                            "-W", str(wait), "-w", str(int(deadline + 0.999)), dst],
                      timeout=deadline + 10)
        return parse_ping(r.stdout, r.returncode)

    def first_reply(self, src, dst: str, timeout: float, interval: float = 0.02):
        """Ping ``dst`` from host ``src`` every ``interval`` s: the wall-clock time (``time.time()``)
        of the first reply, or None within ``timeout``."""
        proc = self.tb.popen(src, ["ping", "-n", "-D", "-i", str(interval), "-W", "1",
                                   "-w", str(int(timeout + 0.999)), dst])
        try:
            for line in proc.stdout:
                m = re.match(r"\[(\d+\.\d+)\] \d+ bytes from", line)
                if m:
                    return float(m.group(1))
            return None
        finally:
            self.tb.kill(proc, sig=signal.SIGINT)

    def lease_acquired_at(self, host, timeout: float = 10.0):
        """The wall-clock time of the host's daemon's "Lease acquired" log line (ms), or None."""
        d = self.daemon(host)
        # the text log's time: date, time with milliseconds and the zone's offset (host/logfmt.py)
        pattern = re.compile(r"^(\d{4}-\d\d-\d\d \S+) \S+ \S+: Lease acquired", re.M)
        found = []
        wait_for(lambda: found.extend(pattern.findall(d.log_text())) or found, timeout, interval=0.02)
        if not found:
            return None
        return datetime.datetime.fromisoformat(found[0]).timestamp()

    def reachable(self, src, dst: str, timeout: float = 10.0) -> bool:
        """True once one ping from ``src`` to ``dst`` succeeds within ``timeout``."""
        return wait_for(lambda: self.ping(src, dst, count=1, wait=0.5)["received"] == 1,
                        timeout, interval=0.1)

    def healthz(self, host, path: str = "/healthz", port: int | None = None,
                addr: str = "127.0.0.1") -> tuple[int, str]:
        """GET a path of a healthz server at ``addr`` (default: the host's own), from inside the host."""
        url = f"http://{addr}:{port or self.healthz_port}{path}"
        code = ("import sys,urllib.request,urllib.error\n"
                "try:\n r=urllib.request.urlopen(sys.argv[1],timeout=5); print(r.status); "
                "sys.stdout.write(r.read().decode())\n"
                "except urllib.error.HTTPError as e:\n print(e.code); "
                "sys.stdout.write(e.read().decode())\n")
        r = self.exec(host, [sys.executable, "-c", code, url], timeout=20)
        status, _, body = r.stdout.partition("\n")
        return int(status or 0), body

    def metrics(self, host) -> dict:
        """The host's /metrics as {"name{labels}": value}."""
        status, body = self.healthz(host, "/metrics")
        if status != 200:
            raise OverlayError(f"{self.host(host).name}: /metrics answered {status}")
        return parse_metrics(body)

    def trace_events(self, host, after: int = 0) -> list:
        """The host's engine trace (daemon started with ``--trace``): events with seq > after."""
        status, body = self.healthz(host, f"/debug/trace?after={int(after)}")
        if status != 200:
            raise OverlayError(f"{self.host(host).name}: /debug/trace answered {status}: {body}")
        return json.loads(body)

    # -- teardown ---------------------------------------------------------------
    def close(self) -> None:
        errors = []
        for name in list(self.daemons):
            try:
                self.stop_daemon(name)
            except Exception as e:
                errors.append(f"daemon {name}: {e}")
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        etcd = getattr(self, "etcd", None)
        if etcd is not None:
            try:
                etcd.close()
            except Exception as e:
                errors.append(f"etcd: {e}")
        try:
            self.tb.close()
        except Exception as e:
            errors.append(str(e))
        for group in self._cpu_groups:      # after the processes inside are gone
            group.close()
        if errors:
            log.warning("overlay teardown: %s", "; ".join(errors))

    def __enter__(self) -> "Overlay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def parse_ping(out: str, rc: int = 0) -> dict:
    sent = received = 0
    m = re.search(r"(\d+) packets transmitted, (\d+) received", out)
    if m:
        sent, received = int(m.group(1)), int(m.group(2))
    rtt = None
    m = re.search(r"= [\d.]+/([\d.]+)/([\d.]+)/", out)
    if m:
        rtt = float(m.group(1))
    return {"sent": sent, "received": received, "rtt_avg_ms": rtt, "rc": rc}


# Labels whose samples parse_metrics also sums over: the engine's queues, the inner packet's
# family and the datapath, engine or kernel (docs/metrics.md).
_SUMMED = ("queue", "family", "datapath")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict:
    """{"name{labels}": value} of a /metrics text; a sample labelled by queue or family also
    adds to its sums over them, under the keys without those labels (PromQL's ``sum without
    (queue)``, ``sum without (family)``, ``sum without (queue, family)``):
    ``flannel_udp_packets_total{path="udp_tx"}`` is the host's, whatever --queues and both
    families."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        out[key] = v
        name, brace, rest = key.partition("{")
        labels = _LABEL.findall(rest) if brace else []
        summed = [k for k, _ in labels if k in _SUMMED]
        for n in range(1, len(summed) + 1):
            for gone in itertools.combinations(summed, n):
                kept = ",".join(f'{k}="{x}"' for k, x in labels if k not in gone)
                total = f"{name}{{{kept}}}" if kept else name
                out[total] = out.get(total, 0.0) + v
    return out
