"""Setup for the harness: compile the traffic generator, make sure iperf3 is there.

The generator's C source (udpgen.c, beside this file) ships inside the
package, so the bench runs from an installed package as from a checkout. It
is compiled on first use into the user's cache directory, under a name keyed
by a hash of the source, the compiler and its flags: an edited source or
other flags give a new binary, and a stale one is never run.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..host.atomicfile import write_atomic

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().with_name("udpgen.c")
CFLAGS = ["-O2", "-Wall", "-Wextra", "-std=gnu11"]
# The source checkout's perf/ directory (results, soak, profile); absent in an installed package.
PERF_DIR = Path(__file__).resolve().parents[2] / "perf"


class SetupError(RuntimeError):
    """A prerequisite of the harness is missing and could not be installed."""


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/flannel-udp, else ~/.cache/flannel-udp."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "flannel-udp"


def in_checkout() -> bool:
    """Whether this package runs from a source checkout (which has perf/)."""
    return (PERF_DIR / "README.md").is_file() and (PERF_DIR.parent / "pyproject.toml").is_file()


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise SetupError("no C compiler to build the traffic generator udpgen "
                         "(apt-get install gcc)")
    return cc


def udpgen_path(cc: str) -> Path:
    """Where the binary built from this source with ``cc`` and CFLAGS lives."""
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update("\0".join([cc, *CFLAGS]).encode())
    return cache_dir() / f"udpgen-{h.hexdigest()[:16]}"


def build_udpgen(force: bool = False) -> Path:
    """The udpgen binary, compiled into the cache directory unless already there."""
    if not SOURCE.is_file():
        raise SetupError(f"{SOURCE} is missing: reinstall flannel-udp")
    cc = _compiler()
    target = udpgen_path(cc)
    if target.is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # The compiler writes into a private directory; the binary then replaces any old one at once
    # (a concurrent run never executes half a binary).
    with tempfile.TemporaryDirectory(prefix="udpgen-build-") as private:
        out = os.path.join(private, "udpgen")
        try:
            r = subprocess.run([cc, *CFLAGS, "-o", out, str(SOURCE)],
                               capture_output=True, text=True, timeout=120)
        except OSError as e:
            raise SetupError(f"cannot run the C compiler {cc}: {e} (apt-get install gcc)") from None
        if r.returncode != 0:
            raise SetupError(f"compiling {SOURCE} with {cc} failed:\n{r.stderr}")
        with open(out, "rb") as f:
            write_atomic(target, f.read(), mode=0o755)
    log.info("built %s", target)
    return target


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
