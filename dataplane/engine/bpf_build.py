"""Compiling the kernel path's tc programs (csrc/bpf/flannel.bpf.c) with clang.

As the bench compiles its traffic generator: on first use, into the user's
cache directory, under a name keyed by a hash of the sources (the program and
maps.h), the compiler and its flags, so an edited source gets a new object
and a stale one is never loaded. The object is written in a private file and
renamed into place, so a concurrent build never loads half of one.

An installed package (a wheel, the Debian package) has the sources in
dataplane/engine/bpf/ and, where clang was there when it was built, the object
compiled from them beside them with the sources' hash (setup.py): that one is
loaded as it is, so a host needs clang only for sources the package did not
compile.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from .bpf_contract import MAPS_HEADER, PROGRAM_SOURCE, source_dir

# Debian keeps asm/types.h under the multiarch directory, which clang's BPF target does not search.
MULTIARCH = f"/usr/include/{platform.machine()}-linux-gnu"
CFLAGS = ["-O2", "-g", "-Wall", "-target", "bpf"]      # setup.py's compile_bpf uses the same
SHIPPED_OBJECT = "flannel.bpf.o"     # beside the sources in an installed package (setup.py)


class BpfBuildError(RuntimeError):
    """The programs cannot be compiled here: no clang, no libbpf headers, or a compile error."""


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/flannel-udp/bpf, else ~/.cache/flannel-udp/bpf."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "flannel-udp" / "bpf"


def clang() -> str:
    cc = os.environ.get("BPF_CLANG") or shutil.which("clang")
    if not cc:
        raise BpfBuildError("no clang to compile the kernel path's programs (apt-get install clang)")
    return cc


def _flags() -> list[str]:
    flags = list(CFLAGS)
    if os.path.isdir(MULTIARCH):
        flags += ["-I", MULTIARCH]
    return flags


def object_path(cc: str, src: str) -> Path:
    """Where the object built from these sources with ``cc`` and its flags lives."""
    h = hashlib.sha256(sources_hash(src).encode())
    h.update("\0".join([cc, *_flags()]).encode())
    return cache_dir() / f"flannel-{h.hexdigest()[:16]}.bpf.o"


def sources_hash(src: str) -> str:
    """The hash of the programs' sources in ``src`` (the program and every header beside it,
    each by its name), as setup.py records it beside the object it compiles."""
    h = hashlib.sha256()
    for name in sorted({PROGRAM_SOURCE, MAPS_HEADER} | {p.name for p in Path(src).glob("*.h")}):
        h.update(name.encode() + b"\0" + Path(src, name).read_bytes())
    return h.hexdigest()


def shipped_object(src: str) -> Path | None:
    """The object an installed package brought, compiled from these very sources when the
    package was built (setup.py), else None. It needs no clang on the host."""
    obj = Path(src, SHIPPED_OBJECT)
    try:
        recorded = Path(src, SHIPPED_OBJECT + ".sha256").read_text().strip()
    except OSError:
        return None
    return obj if obj.is_file() and recorded == sources_hash(src) else None


def build(force: bool = False) -> Path:
    """The compiled object: the package's own when it has one for these sources, else built
    unless already in the cache."""
    src = source_dir()
    shipped = None if force else shipped_object(src)
    if shipped is not None:
        return shipped
    if not os.path.isfile("/usr/include/bpf/bpf_helpers.h"):
        raise BpfBuildError("libbpf's headers are missing (apt-get install libbpf-dev)")
    cc = clang()
    target = object_path(cc, src)
    if target.is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".build-", suffix=".o")
    os.close(fd)
    try:
        try:
            r = subprocess.run([cc, *_flags(), "-c", os.path.join(src, PROGRAM_SOURCE), "-o", tmp],
                               capture_output=True, text=True, timeout=120)
        except OSError as e:
            raise BpfBuildError(f"cannot run {cc}: {e} (apt-get install clang)") from None
        if r.returncode != 0:
            raise BpfBuildError(f"compiling {PROGRAM_SOURCE} with {cc} failed:\n{r.stderr}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
