"""A wheel of the checkout, installed (not editable) into a fresh virtual
environment without extras, works from any directory as a newcomer runs it.

The wheel carries the compiled C engine and the traffic generator's source;
`flannel-udp --version`, `run --version` and `run --help` work from outside the
checkout and from inside it; a child started by the installed package
(dataplane/host/child.py) imports the installed package even with the checkout,
whose `dataplane/` would win under `python -m`, as its current directory; the
daemon imports without the demo/bench extras, and demo and bench name the
extra to install. The sdist is built from a copy of the working tree (so the
checkout's build/ directory is neither used nor touched) and the wheel from the sdist.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest

from tests.conftest import require

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What a checkout holds besides the sources: never part of what `pip wheel .` should see.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                     "*.so", "_dataplane_c.c", "*.o", "out", ".pytest_cache",
                                     ".hypothesis")


def _run(argv, cwd, timeout=60, **kw):
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    require(shutil.which("gcc") is not None, "needs gcc (the wheel compiles the C engine)")
    base = tmp_path_factory.mktemp("installed")
    t0 = time.monotonic()
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCES)
    # The wheel is built from the sdist (as `python -m build` does), so a file missing from
    # the sdist fails here too.
    build_sdist = ("import sys; from setuptools import build_meta; "
                   "print(build_meta.build_sdist(sys.argv[1]))")
    r = _run([sys.executable, "-c", build_sdist, str(base / "dist")], cwd=src, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    sdist = base / "dist" / r.stdout.split()[-1]
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"),
              str(sdist)], cwd=base, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    wheel, = (base / "dist").glob("flannel_udp-*.whl")
    venv = base / "venv"
    r = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=base)
    assert r.returncode == 0, r.stderr
    # This environment's pip installs into the new one: no second pip to bootstrap.
    r = _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
              "-q", str(wheel)], cwd=base, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    outside = base / "elsewhere"
    outside.mkdir()
    print(f"wheel built and installed in {time.monotonic() - t0:.1f} s")
    return {"sdist": sdist, "wheel": wheel, "bin": venv / "bin", "outside": str(outside),
            "site": str(venv / "lib"), "cache": str(base / "cache")}


def test_the_sdist_carries_what_the_build_needs(installed):
    with tarfile.open(installed["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"csrc/dataplane.h", "csrc/build_ffi.py", "dataplane/bench/udpgen.c", "LICENSE"} <= names


def test_the_wheel_carries_the_c_engine_and_the_generator_source(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    assert any(n.startswith("dataplane/_dataplane_c") and n.endswith(".so") for n in names), names
    assert "dataplane/bench/udpgen.c" in names
    assert not [n for n in names if n.startswith(("tests/", "perf/", "csrc/"))]


def test_the_package_ships_the_kernel_paths_programs(installed):
    """The programs' sources go into the wheel, with the object compiled from them where
    clang was there; the installed bpf_build.py takes that object, and compiles the installed
    sources themselves when asked to (as for sources the package did not compile)."""
    with tarfile.open(installed["sdist"]) as tar:
        assert {"csrc/bpf/flannel.bpf.c", "csrc/bpf/maps.h"} <= {
            n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    assert {"dataplane/engine/bpf/flannel.bpf.c", "dataplane/engine/bpf/maps.h"} <= names
    require(shutil.which("clang") is not None and os.path.isfile("/usr/include/bpf/bpf_helpers.h"),
            "needs clang and libbpf-dev (the wheel compiles the kernel path's programs)")
    assert {"dataplane/engine/bpf/flannel.bpf.o", "dataplane/engine/bpf/flannel.bpf.o.sha256"} <= names
    py, env = str(installed["bin"] / "python"), dict(os.environ, XDG_CACHE_HOME=installed["cache"])
    build = "import sys; from dataplane.engine import bpf_build as b; print(b.build(force=sys.argv[1] == 'force'))"
    r = _run([py, "-c", build, "shipped"], installed["outside"], env=env)
    assert r.returncode == 0 and r.stdout.strip().startswith(installed["site"]), r.stdout + r.stderr
    assert r.stdout.strip().endswith("dataplane/engine/bpf/flannel.bpf.o"), r.stdout
    r = _run([py, "-c", build, "force"], installed["outside"], env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().startswith(installed["cache"]), r.stdout + r.stderr


@pytest.mark.parametrize("where", ["outside", "checkout"])
def test_commands_work_from_any_directory(installed, where):
    cwd = installed["outside"] if where == "outside" else ROOT
    fu = str(installed["bin"] / "flannel-udp")
    from dataplane import __version__
    r = _run([fu, "--version"], cwd)
    assert r.returncode == 0 and r.stdout.strip() == f"flannel-udp {__version__}", r
    r = _run([fu, "run", "--version"], cwd)
    assert r.returncode == 0 and r.stderr == f"{__version__}\n" and r.stdout == "", r
    r = _run([fu, "run", "--help"], cwd)
    assert r.returncode == 0 and "--etcd-endpoints" in r.stdout, r.stderr


def test_a_child_runs_the_installed_package_even_from_the_checkout(installed):
    py = str(installed["bin"] / "python")
    probe = "import dataplane; print(dataplane.__file__)"
    # The trap: from the checkout, the current directory's dataplane/ wins.
    r = _run([py, "-c", probe], ROOT)
    assert r.stdout.startswith(os.path.join(ROOT, "dataplane")), r
    # The parent runs the installed package; its child, started in the checkout, does too,
    # with the C engine the wheel built.
    parent = ("import subprocess, sys\n"
              "from dataplane.host.child import python_argv, cli_argv\n"
              "code = 'import dataplane, dataplane.engine as e; "
              "print(dataplane.__file__, e.c_available())'\n"
              "out = subprocess.run(python_argv(code), cwd=sys.argv[1], capture_output=True,"
              " text=True, timeout=60)\n"
              "print(out.stdout.strip(), out.stderr[-2000:])\n"
              "out = subprocess.run(cli_argv('run', '--version'), cwd=sys.argv[1],"
              " capture_output=True, text=True, timeout=60)\n"
              "print(out.returncode, out.stderr.strip())\n")
    r = _run([py, "-c", parent, ROOT], installed["outside"])
    assert r.returncode == 0, r.stderr
    child, cli = r.stdout.splitlines()[:2]
    path, c_built = child.split()[:2]
    assert path.startswith(installed["site"]) and c_built == "True", r.stdout
    from dataplane import __version__
    assert cli == f"0 {__version__}", r.stdout


def test_the_daemon_needs_no_extra_and_demo_and_bench_name_theirs(installed):
    py = str(installed["bin"] / "python")
    r = _run([py, "-c", "import importlib.util as u; import dataplane.daemon.main, dataplane.cli; "
                        "dataplane.cli.build_parser(); import sys; "
                        "print([m for m in ('rich', 'matplotlib') if u.find_spec(m) or m in "
                        "sys.modules])"], installed["outside"])
    assert r.returncode == 0 and r.stdout.strip() == "[]", r
    fu = str(installed["bin"] / "flannel-udp")
    for command, extra in (("demo", "demo"), ("bench", "bench")):
        r = _run([fu, command], installed["outside"])
        assert r.returncode == 2, r
        assert f"pip install 'flannel-udp[{extra}]'" in r.stderr and "Traceback" not in r.stderr


def test_the_installed_bench_compiles_its_generator_into_the_cache(installed):
    py = str(installed["bin"] / "python")
    env = dict(os.environ, XDG_CACHE_HOME=installed["cache"])
    code = "from dataplane.bench import build; print(build.build_udpgen())"
    r = _run([py, "-c", code], installed["outside"], env=env)
    assert r.returncode == 0, r.stderr
    binary = r.stdout.strip()
    assert binary.startswith(os.path.join(installed["cache"], "flannel-udp", "udpgen-")), binary
    r = _run([binary, "bogus"], installed["outside"], timeout=10)
    assert r.returncode != 0 and "usage: udpgen" in r.stderr, r
