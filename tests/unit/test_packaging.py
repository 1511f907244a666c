"""What ships for operators: the systemd unit, its environment file, the licence,
and inside the package the engine contract's header.

The unit is checked with systemd's own verifier (ExecStart pointed at the
installed console script, since /opt/flannel-udp is not there on a developer's
machine), and every FLANNELD_* name the example environment file sets must be a
flag the daemon reads: a typo there would silently do nothing on a host. The
package is built (build_py: no compiler) from a copy of the sources and
imported from there, away from the checkout, as an install without the C
engine runs it.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from dataplane.cli import flanneld_flags
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "packaging" / "flannel-udp.service"
ENV_FILE = ROOT / "packaging" / "flannel-udp.env"


def _unit_settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_unit_is_notify_and_restarts_and_orders_before_the_runtime():
    s = _unit_settings()
    assert s["Type"] == ["notify"]
    assert s["Restart"] == ["on-failure"]
    assert "network-online.target" in s["After"][0].split()
    assert "docker.service" in s["Before"][0].split()
    # subnet.env must survive a stop: the next start takes its previous subnet from it
    assert s["RuntimeDirectory"] == ["flannel"] and s["RuntimeDirectoryPreserve"] == ["yes"]
    # what the daemon needs stays reachable under the hardening
    assert "AF_NETLINK" in s["RestrictAddressFamilies"][0]
    assert "/dev/net/tun rw" in s["DeviceAllow"]
    assert "CAP_NET_ADMIN" in s["CapabilityBoundingSet"][0]
    # the kernel path: the verifier refuses its programs without CAP_PERFMON, and they are
    # compiled into a cache the hardening leaves writable
    assert {"CAP_BPF", "CAP_PERFMON"} <= set(s["CapabilityBoundingSet"][0].split())
    assert s["CacheDirectory"] == ["flannel-udp"]
    assert "XDG_CACHE_HOME=/var/cache" in s["Environment"]
    assert "ProtectKernelTunables" not in s   # flannel0's accept_local sysctl is written at start


def test_unit_keeps_the_fds_across_a_restart_and_upgrades_in_place():
    from dataplane.host.queues import MAX_QUEUES
    s = _unit_settings()
    store = int(s["FileDescriptorStoreMax"][0])
    assert store >= 2 * MAX_QUEUES + 1                 # a TUN queue and a socket each, the state
    assert f"FDSTORE={store}" in s["Environment"]      # the daemon uses the store only when told
    # reload applies the edited environment file: the same binary and options as ExecStart
    assert s["ExecReload"] == ["/opt/flannel-udp/bin/flannel-udp reload $FLANNEL_UDP_OPTIONS"]
    assert s["ExecStart"] == ["/opt/flannel-udp/bin/flannel-udp run $FLANNEL_UDP_OPTIONS"]
    assert s["NotifyAccess"] == ["main"]              # the old main process names the new one


def test_unit_passes_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    require(analyze is not None, "needs systemd-analyze (Debian package systemd)")
    script = Path(sys.executable).with_name("flannel-udp")
    require(script.exists(), f"needs the installed console script {script} (make deps)")
    text = UNIT.read_text().replace("/opt/flannel-udp/bin/flannel-udp", str(script))
    unit = tmp_path / "flannel-udp.service"
    unit.write_text(text)
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if "flannel-udp.service" in ln]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr


def test_env_example_sets_only_flags_the_daemon_reads():
    known = {f.env for f in flanneld_flags.FLAGS}
    names = re.findall(r"^#?\s*(FLANNELD_[A-Z0-9_]+)=", ENV_FILE.read_text(), re.M)
    assert names, "the example sets no FLANNELD_* variable"
    assert set(names) <= known, set(names) - known
    # and the unit passes the rest of the command line through
    assert "$FLANNEL_UDP_OPTIONS" in _unit_settings()["ExecStart"][0]


def test_env_example_serves_health_and_metrics_on_loopback():
    """The shipped file turns /healthz, /readyz and /metrics on, on loopback, through the
    options the unit passes on; the daemon's own default stays flanneld's (off)."""
    import argparse
    import shlex
    from dataplane.daemon.options import Options
    text = ENV_FILE.read_text()
    env = dict(re.findall(r"^(FLANNELD_[A-Z0-9_]+)=(.*)$", text, re.M))
    options = re.search(r"^FLANNEL_UDP_OPTIONS=(.*)$", text, re.M).group(1)
    parser = argparse.ArgumentParser()
    flanneld_flags.add_arguments(parser)
    opts = flanneld_flags.resolve(parser.parse_args(shlex.split(options)), environ=env)
    assert (opts.healthz_ip, opts.healthz_port) == ("127.0.0.1", 10254)
    assert opts.metrics_on_healthz()
    assert Options().healthz_port == 0


def test_licence_matches_pyproject():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0" in text
    assert 'license = {text = "Apache-2.0"}' in (ROOT / "pyproject.toml").read_text()


# What setup.py's build_py reads: the package, the C engine's header and builder, the metadata.
BUILD_INPUTS = ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "csrc",
                "dataplane")


def _import_built(build_lib: Path, code: str) -> subprocess.CompletedProcess:
    """Runs code with only build_lib's package and this environment's dependencies:
    -S keeps the editable install's finder (a .pth file) from handing out the checkout."""
    path = f"{build_lib}:{sysconfig.get_paths()['purelib']}"
    return subprocess.run([sys.executable, "-S", "-c", code], cwd=build_lib.parent,
                          env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)


def test_the_built_package_reads_the_header_it_ships(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.so", "_dataplane_c.c", "*.o", "fuzz"))
        else:
            shutil.copy(ROOT / name, src / name)
    build_lib = tmp_path / "lib"
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(build_lib)],
                       cwd=src, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    shipped = build_lib / "dataplane" / "engine" / "dataplane.h"
    assert shipped.read_bytes() == (ROOT / "csrc" / "dataplane.h").read_bytes()

    code = ("import dataplane.engine as e, dataplane.engine.contract as c\n"
            "print(c.HEADER)\n"
            "print(c.STAT_NAMES == e.STAT_NAMES, c.ROUNDS, c.TR_DROP)\n"
            "print(e.c_available(), e.choose_engine('auto', env={}).cls.name)\n")
    r = _import_built(build_lib, code)
    assert r.returncode == 0, r.stderr[-3000:]
    header, facts, engine = r.stdout.splitlines()
    assert Path(header) == shipped
    from dataplane.engine import contract
    assert facts == f"True {contract.ROUNDS} {contract.TR_DROP}"
    assert engine == "False python"        # no compiler ran: the Python engine, with its contract

    # Without the header the package says which file it misses rather than guess a number.
    shipped.unlink()
    r = _import_built(build_lib, "import dataplane.engine")
    assert r.returncode != 0 and "HeaderError" in r.stderr and str(shipped) in r.stderr, r.stderr


def test_the_version_lives_in_one_place_and_the_changelog_names_it():
    """dataplane/__init__.py holds the version; pyproject.toml reads it from there, and the Debian
    changelog's newest entry must name it (debian/rules refuses to build otherwise)."""
    from dataplane import __version__
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]$', pyproject, re.M)
    assert 'version = {attr = "dataplane.__version__"}' in pyproject
    assert not re.search(r'^version = "', pyproject, re.M)
    newest = (ROOT / "debian" / "changelog").read_text().splitlines()[0]
    assert re.match(rf"^flannel-udp \({re.escape(__version__)}\) ", newest), newest


def test_the_package_pins_what_the_suite_runs_with():
    """make deps (the suite) and the package install under one constraints file, and it pins
    every dependency the daemon declares."""
    makefile = (ROOT / "Makefile").read_text()
    assert "-c $(CONSTRAINTS)" in makefile
    assert "--constraint=packaging/constraints.txt" in (ROOT / "debian" / "rules").read_text()
    pins = {re.split(r"==", line)[0].lower().replace("_", "-")
            for line in (ROOT / "packaging" / "constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")}
    deps = re.search(r"^dependencies = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(),
                     re.M | re.S).group(1)
    names = {re.match(r'\s*"([A-Za-z0-9_.-]+)', line).group(1).lower().replace("_", "-")
             for line in deps.splitlines() if line.strip().startswith('"')}
    assert names and names <= pins, names - pins
