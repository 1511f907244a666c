"""Setup for the harness: compile perf/udpgen.c, make sure iperf3 is there.

The C source lives in the repository's ``perf/`` directory and the binary in
``perf/bin/`` (gitignored); both are found relative to this package, so the
harness runs from a source checkout (``pip install -e .``, the project's way).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

PERF_DIR = Path(__file__).resolve().parents[2] / "perf"
SOURCE = PERF_DIR / "udpgen.c"
BIN_DIR = PERF_DIR / "bin"
UDPGEN = BIN_DIR / "udpgen"
CFLAGS = ["-O2", "-Wall", "-Wextra", "-std=gnu11"]


class SetupError(RuntimeError):
    """A prerequisite of the harness is missing and could not be installed."""


def build_udpgen(force: bool = False) -> Path:
    """Compile perf/udpgen.c into perf/bin/udpgen when missing or stale."""
    if not SOURCE.exists():
        raise SetupError(f"{SOURCE} not found: the bench runs from a source checkout")
    if not force and UDPGEN.exists() and UDPGEN.stat().st_mtime >= SOURCE.stat().st_mtime:
        return UDPGEN
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise SetupError("no C compiler (apt-get install gcc)")
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    tmp = UDPGEN.with_suffix(".tmp")
    r = subprocess.run([cc, *CFLAGS, "-o", str(tmp), str(SOURCE)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SetupError(f"compiling {SOURCE} failed:\n{r.stderr}")
    os.replace(tmp, UDPGEN)
    log.info("built %s", UDPGEN)
    return UDPGEN


def ensure_iperf3() -> str:
    """Path of iperf3, installing Debian's package if it is missing."""
    path = shutil.which("iperf3")
    if path:
        return path
    if shutil.which("apt-get") and os.geteuid() == 0:
        log.info("installing iperf3 with apt-get")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "install", "-y", "-qq", "iperf3"], env=env,
                       capture_output=True, timeout=600)
        path = shutil.which("iperf3")
    if not path:
        raise SetupError("iperf3 not found (apt-get install iperf3)")
    return path


def setup() -> dict:
    """Everything the harness needs before a run; returns the tool paths."""
    return {"udpgen": str(build_udpgen()), "iperf3": ensure_iperf3()}
