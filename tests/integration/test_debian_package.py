"""The Debian package (`make deb`: debian/, packaging/build-deb) on two simulated hosts, each a
real systemd with a root of its own (tests/integration/systemd_box.py, ``SystemdBox(host=...)``:
dpkg, /etc, /opt and /run change only there), run as an operator runs it:

    build   packaging/build-deb: dpkg-buildpackage + lintian (no error or warning), once; the
            "newer build" is that package with a higher version (same code, repacked)
    h0, h1  apt-get install ./flannel-udp_*.deb: the unit starts and waits for etcd (its
            status says so); /etc/default/flannel-udp set to the overlay's etcd and the host's
            veth (h0 --engine c, h1 --engine python), systemctl restart: both forward
    upgrade paced UDP and TCP both ways between h0 and h1 while apt-get installs the newer
            build on h1, then on h0: the postinst reloads each daemon (the handover): no
            datagram lost, no TCP stream reset or silent for more than the handover's bound,
            the same flannel0 and lease, the new version on /metrics
    kernel  h1 restarted on the kernel path, pinned where only the environment file says
            (FLANNELD_BPF_PINS): it forwards
    remove  h1: the unit is gone, flannel0 is gone, and the kernel path (its filter, its pins
            where the environment file put them); the firewall rules, the lease and
            subnet.env stay, as a stopped flanneld leaves them
    purge   h1: no file of the package is left, nor subnet.env
"""
from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import time

import pytest

from dataplane.testbed.overlay import parse_metrics
from tests.conftest import require, require_bpf, wait_until
from tests.integration import restart_traffic, systemd_box
from tests.integration.conftest import overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = "flannel-udp.service"
ENV_FILE = "/etc/default/flannel-udp"
HEALTHZ_PORT = 10254                     # packaging/flannel-udp.env's
UPGRADE_STALL_BOUND_MS = 250             # the handover's bound, with dpkg busy beside it
BUILD_TOOLS = ("dpkg-buildpackage", "dh_virtualenv", "help2man", "lintian")
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
FAST_GZIP = {"DPKG_DEB_COMPRESSOR_LEVEL": "1"}     # dpkg-deb >= 1.21.10 (Debian 12 has 1.21.22)


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    """The package as `make deb` builds it, and a newer build of the same code."""
    for tool in BUILD_TOOLS:
        require(shutil.which(tool) is not None, f"needs {tool} (make deb installs it)")
    out = tmp_path_factory.mktemp("deb")
    t0 = time.monotonic()
    # gzip: this package is installed at once, and xz would take half the build's time; at
    # level 1 (dpkg-deb reads the level from its environment) the 80 MB of the venv take 2 s,
    # not 15 s at gzip's default 9
    r = subprocess.run([os.path.join(ROOT, "packaging", "build-deb"), str(out)],
                       capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, FLANNEL_UDP_DEB_COMPRESSION="gzip", **FAST_GZIP))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert "lintian: no errors or warnings" in r.stdout, r.stdout
    old, = out.glob("flannel-udp_*.deb")
    print(f"package built and checked in {time.monotonic() - t0:.0f} s: {r.stdout.strip()}")
    return old, newer_build(old, out)


def newer_build(deb, out):
    """``deb`` with the version one step higher, in dpkg's control data and in the code."""
    tree = out / "newer"
    subprocess.run(["dpkg-deb", "-R", str(deb), str(tree)], check=True)
    control = (tree / "DEBIAN" / "control").read_text()
    old = re.search(r"^Version: (\S+)$", control, re.M).group(1)
    new = f"{old}+1"
    (tree / "DEBIAN" / "control").write_text(control.replace(f"Version: {old}", f"Version: {new}"))
    init, = tree.glob("opt/flannel-udp/lib/python3*/site-packages/dataplane/__init__.py")
    init.write_text(init.read_text().replace(f'__version__ = "{old}"', f'__version__ = "{new}"'))
    sums = subprocess.run(["md5sum", str(init.relative_to(tree))], cwd=tree, check=True,
                          capture_output=True, text=True).stdout
    md5 = tree / "DEBIAN" / "md5sums"
    name = str(init.relative_to(tree))
    md5.write_text("".join(sums if line.endswith(f"  {name}\n") else line
                           for line in md5.read_text().splitlines(keepends=True)))
    newer = out / f"flannel-udp_{new}_{deb.name.rsplit('_', 1)[1]}"
    subprocess.run(["dpkg-deb", "-Zgzip", "-b", str(tree), str(newer)], check=True,
                   capture_output=True, env=dict(os.environ, **FAST_GZIP))
    return newer


class PackagedHost:
    """One simulated host with the package: its box, its testbed host, its engine."""

    def __init__(self, ov, host, box, engine):
        self.ov, self.host, self.box, self.engine = ov, host, box, engine
        # A host where services start: no policy-rc.d (the machine's may forbid them)
        box.run("rm", "-f", "/usr/sbin/policy-rc.d")
        # and a default route, by which the daemon finds its interface before it is told one
        # (on the testbed's link: nothing leaves the host's namespaces)
        r = ov.exec(host, ["ip", "route", "replace", "default", "dev", host.iface])
        assert r.returncode == 0, r.stderr

    def apt(self, *args, deb=None):
        if deb is not None:
            shutil.copy(deb, self.box.path("/tmp/"))
            args = (*args, f"/tmp/{os.path.basename(deb)}")
        r = self.box.run("apt-get", "-y", "-q", *args, env=APT_ENV)
        assert r.returncode == 0, f"apt-get {' '.join(args)}: {r.stdout[-3000:]}{r.stderr}"
        return r.stdout

    def configure(self):
        """What the operator sets in the environment file, then a restart."""
        with open(self.box.path(ENV_FILE)) as f:
            text = f.read()
        text = re.sub(r"^FLANNELD_ETCD_ENDPOINTS=.*$",
                      f"FLANNELD_ETCD_ENDPOINTS={self.ov.etcd_url}\n"
                      f"FLANNELD_ETCD_PREFIX={self.ov.prefix}\n"
                      f"FLANNELD_IFACE={self.host.iface}", text, flags=re.M)
        text = re.sub(r"^FLANNEL_UDP_OPTIONS=(.*)$", rf"FLANNEL_UDP_OPTIONS=\1 --engine "
                      f"{self.engine}", text, flags=re.M)
        with open(self.box.path(ENV_FILE), "w") as f:
            f.write(text)
        self.box.systemctl("restart", UNIT)

    def show(self, *props) -> dict:
        return self.box.show(UNIT, *props)

    def journal(self) -> str:
        return self.box.journalctl("-u", UNIT, "-o", "cat")

    def subnet_env(self) -> dict:
        with open(self.box.path("/run/flannel/subnet.env")) as f:
            return dict(line.strip().split("=", 1) for line in f if "=" in line)

    def flannel_ip(self) -> str:
        return self.subnet_env()["FLANNEL_SUBNET"].rsplit(".", 1)[0] + ".0"

    def lease_key(self) -> str:
        return f"{self.ov.prefix}/subnets/{self.flannel_ip()}-24"

    def metrics(self) -> dict:
        status, body = self.ov.healthz(self.host, "/metrics", port=HEALTHZ_PORT)
        assert status == 200, body
        return parse_metrics(body)

    def version(self) -> str:
        (key,) = [k for k in self.metrics() if k.startswith("flannel_udp_build_info{")]
        return re.search(r'version="([^"]+)"', key).group(1)

    def link(self, name="flannel0"):
        return self.ov.exec(self.host, ["ip", "-o", "link", "show", name])

    def rules(self) -> str:
        out = ""
        for argv in (["iptables-save"], ["nft", "list", "ruleset"]):
            if shutil.which(argv[0]):
                out += self.ov.exec(self.host, argv).stdout
        return out


def lease_revision(ph) -> int:
    import json
    r = ph.ov.etcdctl("get", ph.lease_key(), "-w", "json")
    kvs = json.loads(r.stdout).get("kvs", [])
    return int(kvs[0]["mod_revision"]) if kvs else 0


def test_install_upgrade_remove_purge(debs, figure):
    old_deb, new_deb = debs
    require(systemd_box.missing() is None, f"a systemd box: {systemd_box.missing()}")
    require_bpf()
    for ov in overlay_of("c", ()):
        hosts = [ov.add_host(start=False), ov.add_host(start=False)]
        with systemd_box.SystemdBox(host=hosts[0].netns) as box0, \
                systemd_box.SystemdBox(host=hosts[1].netns) as box1:
            phs = [PackagedHost(ov, hosts[0], box0, "c"), PackagedHost(ov, hosts[1], box1, "python")]
            try:
                _lifecycle(ov, phs, old_deb, new_deb, figure)
            finally:
                for ph in phs:
                    ph.box.systemctl("stop", UNIT, check=False)


def _lifecycle(ov, phs, old_deb, new_deb, figure):
    h0, h1 = phs
    # install: the unit starts at once and, unconfigured, waits for etcd saying so
    for ph in phs:
        ph.box.start_journal()
        t0 = time.monotonic()
        out = ph.apt("install", deb=old_deb)
        figure(f"apt-get install on {ph.host.name}", f"{time.monotonic() - t0:.1f} s")
        assert "set the etcd endpoints and the interface in /etc/default/flannel-udp" in out, out
        assert ph.show("UnitFileState")["UnitFileState"] == "enabled"
        assert ph.box.run("flannel-udp", "--version").stdout.strip() == \
            f"flannel-udp {_version_of(old_deb)}"
        with gzip.open(ph.box.path("/usr/share/man/man8/flannel-udp.8.gz"), "rt") as f:
            page = f.read()
        assert ".SH NAME\nflannel-udp \\-" in page and "\\-\\-etcd\\-endpoints" in page
        wait_until(lambda: "waiting for etcd" in ph.show("StatusText")["StatusText"], 20, 0.2,
                   "the unconfigured daemon to tell systemd it waits for etcd")
        assert ph.show("ActiveState")["ActiveState"] == "activating"
        # the registry names the flag (FLANNELD_ETCD_ENDPOINTS in the environment file)
        wait_until(lambda: "--etcd-endpoints" in ph.journal(), 20, 0.5,
                   "the daemon to log which endpoints it cannot reach")
    # configure: both forward
    for ph in phs:
        ph.configure()
        assert ph.show("ActiveState")["ActiveState"] == "active", ph.journal()[-3000:]
        assert ph.version() == _version_of(old_deb)
    ip0, ip1 = h0.flannel_ip(), h1.flannel_ip()
    assert ov.reachable(h0.host, ip1) and ov.reachable(h1.host, ip0)
    before = {ph.host.name: (ph.link().stdout.split(":")[0], lease_revision(ph),
                             int(ph.show("MainPID")["MainPID"])) for ph in phs}

    # upgrade both, one after the other, under traffic
    timings = {}

    def upgrade():
        for ph in (h1, h0):
            t0 = time.monotonic()
            out = ph.apt("install", deb=new_deb)
            timings[ph.host.name] = time.monotonic() - t0
            assert "handing the running daemon over" in out, out
            wait_until(lambda: "Exiting: pid" in ph.journal()
                       and ph.show("ActiveState")["ActiveState"] == "active", 30, 0.1,
                       "the new daemon to take over")

    outcome = restart_traffic.across(ov.tb, h1.host, h0.host, ip1, ip0, upgrade)
    figure("package upgrade on h1 (python) then h0 (c) under traffic", outcome.summary())
    figure("apt-get install of the newer build", {k: f"{v:.1f} s" for k, v in timings.items()})
    assert outcome.tcp_problems() == [], outcome.details()
    assert outcome.udp_lost() == {"a->b": 0, "b->a": 0}, outcome.details()
    for direction, gap in outcome.tcp_max_gap_ms().items():
        assert gap <= UPGRADE_STALL_BOUND_MS, f"TCP {direction} silent {gap} ms: " \
                                              f"{outcome.details()}"
    new_version = _version_of(new_deb)
    for ph in phs:
        ifindex, revision, pid = before[ph.host.name]
        assert ph.version() == new_version
        assert ph.link().stdout.split(":")[0] == ifindex            # the same flannel0
        assert lease_revision(ph) == revision                        # no write to etcd
        assert int(ph.show("MainPID")["MainPID"]) not in (0, pid)
        assert "through the handover socket" in ph.journal()

    # h1 on the kernel path, pinned where only the environment file says (a host's systemd
    # mounts the bpffs at boot; the box's does not)
    pins = "/sys/fs/bpf/fu-pkg-test"
    assert h1.box.run("mount", "-t", "bpf", "bpffs", "/sys/fs/bpf").returncode == 0
    with open(h1.box.path(ENV_FILE)) as f:
        text = f.read().replace("--engine python", "--engine kernel")
    with open(h1.box.path(ENV_FILE), "w") as f:
        f.write(f"{text}FLANNELD_BPF_PINS={pins}\n")
    h1.box.systemctl("restart", UNIT)
    assert "fu_ingress" in h1.box.run("tc", "filter", "show", "dev", h1.host.iface,
                                      "ingress").stdout, h1.journal()[-3000:]
    assert os.path.exists(h1.box.path(f"{pins}/flannel0/fu_ingress"))
    assert ov.reachable(h0.host, h1.flannel_ip())

    # remove (h1): stopped and gone, the kernel path too; rules, lease and subnet.env stay
    subnet = h1.subnet_env()["FLANNEL_SUBNET"]
    files = h1.box.run("dpkg", "-L", "flannel-udp").stdout.split()
    h1.apt("remove", "flannel-udp")
    assert h1.show("LoadState")["LoadState"] == "not-found"
    assert h1.link().returncode != 0
    assert "fu_" not in h1.box.run("tc", "filter", "show", "dev", h1.host.iface, "ingress").stdout
    assert not os.path.exists(h1.box.path(f"{pins}/flannel0"))
    assert ov.etcdctl("get", h1.lease_key(), "--print-value-only").stdout.strip()
    assert "10.5.0.0/16" in h1.rules()
    assert h1.subnet_env()["FLANNEL_SUBNET"] == subnet
    assert os.path.exists(h1.box.path(ENV_FILE))                      # a conffile: until purge

    # purge (h1): nothing of the package is left
    h1.apt("purge", "flannel-udp")
    left = [f for f in files if os.path.lexists(h1.box.path(f)) and not os.path.isdir(
        h1.box.path(f))]
    assert left == []
    for path in ("/opt/flannel-udp", ENV_FILE, "/run/flannel/subnet.env"):
        assert not os.path.lexists(h1.box.path(path)), path
    # h0 forwards on, with its upgraded daemon
    assert h0.show("ActiveState")["ActiveState"] == "active"


def _version_of(deb) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True,
                          text=True, check=True).stdout.strip()

