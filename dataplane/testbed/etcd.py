"""Real etcd servers for tests and the demo: one member (EtcdServer) or a 3-member cluster (EtcdCluster).

Each server gets free ports and a temporary data dir, optionally runs inside a network namespace
(`ip netns exec <ns> etcd ...`, which execs etcd so the PID we hold is etcd's) listening on a given
address. stop()/kill()/start() keep the data dir, so a restarted etcd keeps its revisions; close()
stops the process by PID and removes the data dir. Health is checked with `etcdctl endpoint health`
(run in the same namespace), so it works whether or not the caller can reach the namespace.

Secured etcd, as a cluster that takes security seriously runs it: make_certs() makes a CA and the
certificates with openssl (the server's, clients' whose CN names an etcd user, and a second CA's that
etcd does not trust), EtcdServer(tls=...) serves clients over TLS and requires their certificates,
enable_auth() adds users whose role reads and writes one prefix and turns etcd's auth on.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional

log = logging.getLogger(__name__)

ETCD_BIN = "etcd"
ETCDCTL_BIN = "etcdctl"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on `host` (in the caller's namespace)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host != "0.0.0.0" else "", 0))
        return s.getsockname()[1]


def make_certs(directory: str, server_ips=("127.0.0.1",), clients=("root",),
               days: int = 2) -> dict:
    """Certificates made with openssl in ``directory``: a CA ("ca"), the server's for
    ``server_ips`` ("server_cert", "server_key"), one client certificate per name of ``clients``
    ("<name>_cert", "<name>_key"; its CN is the name: with client certificate auth, etcd takes it
    as the user when no password is given), and a second CA ("other_ca") with a client
    certificate of its own ("rogue_cert", "rogue_key", CN the first client's name) that etcd,
    trusting "ca" only, refuses. Returns {name: path}."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    def ca(name: str) -> None:
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                "-out", f"{name}.crt", "-days", str(days), "-subj", f"/CN=fu-{name}")

    def signed(name: str, cn: str, ext: str, by: str) -> None:
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                f"{name}.csr", "-subj", f"/CN={cn}")
        with open(os.path.join(directory, f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{by}.crt", "-CAkey", f"{by}.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", str(days), "-extfile",
                f"{name}.ext")

    os.makedirs(directory, exist_ok=True)
    ca("ca")
    ca("other_ca")
    signed("server", "fu-etcd", "subjectAltName=" + ",".join(f"IP:{ip}" for ip in server_ips), "ca")
    paths = {"ca": "ca.crt", "other_ca": "other_ca.crt", "server_cert": "server.crt",
             "server_key": "server.key"}
    for name in clients:
        signed(name, name, "extendedKeyUsage=clientAuth", "ca")
        paths.update({f"{name}_cert": f"{name}.crt", f"{name}_key": f"{name}.key"})
    signed("rogue", clients[0], "extendedKeyUsage=clientAuth", "other_ca")
    paths.update({"rogue_cert": "rogue.crt", "rogue_key": "rogue.key"})
    return {k: os.path.join(directory, v) for k, v in paths.items()}


def server_tls(certs: dict, client: str = "root") -> dict:
    """EtcdServer's ``tls`` from make_certs(): TLS with client certificates signed by "ca"
    required; etcdctl presents ``client``'s."""
    return {"cert": certs["server_cert"], "key": certs["server_key"], "ca": certs["ca"],
            "client_cert": certs[f"{client}_cert"], "client_key": certs[f"{client}_key"]}


def _free_port_pair(host: str) -> tuple[int, int]:
    bind_host = host
    try:
        socket.inet_aton(host)
        with socket.socket() as s:
            s.bind((host, 0))
    except OSError:          # an address of another namespace: pick on loopback, the netns is fresh
        bind_host = "127.0.0.1"
    ports = set()
    while len(ports) < 2:
        ports.add(free_port(bind_host))
    a, b = sorted(ports)
    return a, b


class EtcdServer:
    """One etcd member. Use as a context manager, or call start() and close()."""

    def __init__(self, host: str = "127.0.0.1", client_port: Optional[int] = None,
                 peer_port: Optional[int] = None, netns: Optional[str] = None, name: str = "fu-etcd",
                 data_dir: Optional[str] = None, initial_cluster: Optional[str] = None,
                 cluster_token: Optional[str] = None, extra_args: tuple = (),
                 tls: Optional[dict] = None):
        """tls: {"cert", "key", "ca", "client_cert", "client_key"} paths: serve clients over https and,
        with a CA, require client certificates signed by it (client_* are what etcdctl presents)."""
        self.host = host
        self.tls = tls
        self.netns = netns
        self.name = name
        if client_port is None or peer_port is None:
            cp, pp = _free_port_pair(host)
            client_port = client_port or cp
            peer_port = peer_port or pp
        self.client_port = client_port
        self.peer_port = peer_port
        self._own_dir = data_dir is None
        self.base_dir = data_dir or tempfile.mkdtemp(prefix=f"fu-etcd-{os.getpid()}-")
        self.data_dir = os.path.join(self.base_dir, "data")
        self.log_path = os.path.join(self.base_dir, "etcd.log")
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.cluster_token = cluster_token or f"fu-{os.getpid()}-{self.client_port}"
        self.extra_args = tuple(extra_args)
        self.proc: Optional[subprocess.Popen] = None
        self.user: Optional[str] = None        # "name:password" etcdctl logs in with (enable_auth)

    @property
    def client_url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc else None

    def _wrap(self, argv: list[str]) -> list[str]:
        return (["ip", "netns", "exec", self.netns] + argv) if self.netns else argv

    def _argv(self) -> list[str]:
        return self._wrap([
            ETCD_BIN, "--name", self.name, "--data-dir", self.data_dir,
            "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster, "--initial-cluster-token", self.cluster_token,
            "--initial-cluster-state", "new", "--log-level", "warn", "--logger", "zap",
            *self._tls_server_args(), *self.extra_args,
        ])

    def _tls_server_args(self) -> list[str]:
        if not self.tls:
            return []
        args = ["--cert-file", self.tls["cert"], "--key-file", self.tls["key"]]
        if self.tls.get("ca"):
            args += ["--trusted-ca-file", self.tls["ca"], "--client-cert-auth"]
        return args

    def _tls_client_args(self) -> list[str]:
        if not self.tls:
            return []
        t = self.tls
        args = ["--cacert", t.get("ca") or t["cert"]]
        if t.get("client_cert"):
            args += ["--cert", t["client_cert"], "--key", t["client_key"]]
        return args

    def _auth_args(self) -> list[str]:
        return ["--user", self.user] if self.user else []

    def enable_auth(self, root_password: str, users: "dict[str, tuple[str, str]]") -> None:
        """Turn etcd's auth on: a root user (etcdctl logs in as it from now on) and, for each
        ``name: (password, prefix)``, a user whose role (of the same name) reads and writes the
        keys under ``prefix`` and nothing else."""
        self.etcdctl("user", "add", f"root:{root_password}")
        for name, (password, prefix) in users.items():
            self.etcdctl("user", "add", f"{name}:{password}")
            self.etcdctl("role", "add", name)
            self.etcdctl("role", "grant-permission", name, "--prefix=true", "readwrite", prefix)
            self.etcdctl("user", "grant-role", name, name)
        self.etcdctl("auth", "enable")
        self.user = f"root:{root_password}"

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, wait: bool = True, timeout: float = 20.0) -> "EtcdServer":
        if self.is_running():
            return self
        os.makedirs(self.base_dir, exist_ok=True)
        logf = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self._argv(), stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            logf.close()
        if wait:
            try:
                self.wait_healthy(timeout)
            except BaseException:
                self.kill()
                raise
        return self

    def etcdctl(self, *args: str, timeout: float = 10.0, check: bool = True,
                input: "str | bytes | None" = None) -> subprocess.CompletedProcess:
        """Run etcdctl against this server. ``input`` goes to its stdin (``put KEY`` without a
        value reads the value there: no argv limit, any bytes); bytes input gives bytes output."""
        env = dict(os.environ, ETCDCTL_API="3")
        argv = self._wrap([ETCDCTL_BIN, "--endpoints", self.client_url, "--dial-timeout", "2s",
                           *self._tls_client_args(), *self._auth_args(), *args])
        return subprocess.run(argv, env=env, capture_output=True, text=not isinstance(input, bytes),
                              timeout=timeout, check=check, input=input)

    def wait_healthy(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}: {self.log_tail()}")
            if self._port_open():
                try:
                    r = self.etcdctl("endpoint", "health", timeout=5, check=False)
                    last = (r.stderr + r.stdout).strip()
                    # With auth enabled, health answers "user name is empty": the server is serving.
                    if r.returncode == 0 or "user name is empty" in last or "permission denied" in last:
                        return
                except subprocess.TimeoutExpired:
                    last = "etcdctl timed out"
            time.sleep(0.02)
        raise TimeoutError(f"etcd at {self.client_url} not healthy after {timeout}s: {last}\n{self.log_tail()}")

    def _port_open(self) -> bool:
        if self.netns:
            return self._listening_in_netns()
        try:
            with socket.create_connection((self.host, self.client_port), timeout=0.5):
                return True
        except OSError:
            return False

    def _listening_in_netns(self) -> bool:
        """Whether etcd listens on its client port yet, from its namespace's socket table
        (/proc/PID/net/tcp is the table of PID's namespace; `ip netns exec` execs etcd, so the
        PID is etcd's). An etcdctl run before then waits out gRPC's 1 s reconnect backoff."""
        port = f":{self.client_port:04X} "
        try:
            for table in ("tcp", "tcp6"):
                with open(f"/proc/{self.proc.pid}/net/{table}") as f:
                    if any(port in line and line.split()[3] == "0A" for line in f):  # LISTEN
                        return True
            return False
        except (OSError, IndexError):
            return True                  # no table to read: etcdctl's health check decides

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process (by PID) and wait; SIGKILL if it does not exit. Keeps the data dir."""
        if not self.is_running():
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the process (by PID). Keeps the data dir."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            log.error("etcd pid %d did not die after SIGKILL", self.proc.pid)

    def restart(self, kill: bool = False, timeout: float = 20.0) -> None:
        self.kill() if kill else self.stop()
        self.start(wait=True, timeout=timeout)

    def revision(self) -> int:
        r = self.etcdctl("endpoint", "status", "-w", "json")
        return int(json.loads(r.stdout)[0]["Status"]["header"]["revision"])

    def compact(self, revision: Optional[int] = None) -> int:
        """Compact up to `revision` (default: the current one), physically. Returns the revision."""
        rev = revision if revision is not None else self.revision()
        self.etcdctl("compact", str(rev), "--physical")
        return rev

    def close(self) -> None:
        try:
            self.kill()
        finally:
            if self._own_dir:
                shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> "EtcdServer":
        return self.start() if not self.is_running() else self

    def __exit__(self, *exc) -> None:
        self.close()


class EtcdCluster:
    """A cluster of `size` members on loopback, each its own process and data dir."""

    def __init__(self, size: int = 3, host: str = "127.0.0.1"):
        token = f"fu-cluster-{os.getpid()}-{free_port(host)}"
        ports = []
        used: set = set()
        while len(ports) < size:
            cp, pp = _free_port_pair(host)
            if cp in used or pp in used:
                continue
            used.update((cp, pp))
            ports.append((cp, pp))
        names = [f"fu-m{i}" for i in range(size)]
        initial = ",".join(f"{n}=http://{host}:{pp}" for n, (_, pp) in zip(names, ports))
        self.members = [EtcdServer(host=host, client_port=cp, peer_port=pp, name=n,
                                   initial_cluster=initial, cluster_token=token)
                        for n, (cp, pp) in zip(names, ports)]

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    def start(self, timeout: float = 30.0) -> "EtcdCluster":
        try:
            for m in self.members:          # all at once: a member alone has no quorum
                m.start(wait=False)
            for m in self.members:
                m.wait_healthy(timeout)
        except BaseException:
            for m in self.members:
                m.kill()
            raise
        return self

    def stop_member(self, i: int, kill: bool = False) -> None:
        self.members[i].kill() if kill else self.members[i].stop()

    def start_member(self, i: int, timeout: float = 30.0) -> None:
        self.members[i].start(wait=True, timeout=timeout)

    def close(self) -> None:
        errors = []
        for m in self.members:
            try:
                m.close()
            except Exception as exc:       # keep closing the others
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
