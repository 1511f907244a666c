"""Build the optional C engine with cffi, and ship the engine contract's header;
everything else is in pyproject.toml.

The extension is marked optional: without a compiler the install still
succeeds and dataplane.engine logs once that it runs the Python engine.
"""
import glob
import hashlib
import os
import platform
import shutil
import subprocess

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HEADER = os.path.join("csrc", "dataplane.h")
HEADER_IN_PACKAGE = os.path.join("dataplane", "engine", "dataplane.h")
# The kernel path's programs (docs/kernel-path.md): their sources go into the package
# (dataplane/engine/bpf_contract.py reads maps.h there, bpf_build.py compiles them on a host that
# has clang), and the object compiled here where clang is, so a host without clang loads it.
BPF_SOURCES = [os.path.join("csrc", "bpf", "flannel.bpf.c")] + sorted(
    glob.glob(os.path.join("csrc", "bpf", "*.h")))
BPF_IN_PACKAGE = os.path.join("dataplane", "engine", "bpf")
BPF_OBJECT = "flannel.bpf.o"           # with BPF_OBJECT + ".sha256": the sources' hash


class build_py_with_header(build_py):
    """Copies csrc/dataplane.h into the built package: dataplane/engine/contract.py
    reads the engine's facts from it at import, and an installed package has no
    csrc/. In the checkout contract.py reads csrc/dataplane.h itself, so the
    header has one source and no copy in the tree."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, HEADER_IN_PACKAGE)
        self.mkpath(os.path.dirname(target))
        self.copy_file(HEADER, target, preserve_mode=False)
        bpf = os.path.join(self.build_lib, BPF_IN_PACKAGE)
        self.mkpath(bpf)
        for src in BPF_SOURCES:
            self.copy_file(src, os.path.join(bpf, os.path.basename(src)), preserve_mode=False)
        compile_bpf(bpf)

    def get_outputs(self, include_bytecode=1):
        bpf = os.path.join(self.build_lib, BPF_IN_PACKAGE)
        shipped = [os.path.join(bpf, os.path.basename(s)) for s in BPF_SOURCES]
        shipped += [p for p in (os.path.join(bpf, BPF_OBJECT), os.path.join(bpf, BPF_OBJECT + ".sha256"))
                    if os.path.exists(p)]
        return super().get_outputs(include_bytecode) + [
            os.path.join(self.build_lib, HEADER_IN_PACKAGE)] + shipped


def compile_bpf(directory):
    """The programs compiled beside their sources, as bpf_build.py compiles them (its CFLAGS),
    with the sources' hash, by which bpf_build.py takes the object only for these sources.
    Optional, as the C engine is: without clang or libbpf's headers the package has the
    sources only, and a host compiles them on first use where it has clang."""
    cc = os.environ.get("BPF_CLANG") or shutil.which("clang")
    if not cc or not os.path.isfile("/usr/include/bpf/bpf_helpers.h"):
        print("flannel-udp: no clang or no libbpf headers: the kernel path's programs are "
              "shipped as source only")
        return
    multiarch = f"/usr/include/{platform.machine()}-linux-gnu"
    flags = ["-O2", "-g", "-Wall", "-target", "bpf"] + (["-I", multiarch]
                                                        if os.path.isdir(multiarch) else [])
    out = os.path.join(directory, BPF_OBJECT)
    r = subprocess.run([cc, *flags, "-c", os.path.join(directory, "flannel.bpf.c"), "-o", out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"flannel-udp: compiling the kernel path's programs failed (shipped as source):\n"
              f"{r.stderr}")
        return
    h = hashlib.sha256()        # bpf_build.sources_hash: each file's name and bytes, by name
    for name in sorted(os.path.basename(p) for p in BPF_SOURCES):
        with open(os.path.join(directory, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    with open(out + ".sha256", "w") as f:
        f.write(h.hexdigest() + "\n")


setup(
    packages=find_packages(include=["dataplane", "dataplane.*"]),
    # the C engine (compiled); the kernel path's declarations, parsed (a Python module, no compiler)
    cffi_modules=["csrc/build_ffi.py:ffi", "csrc/bpf/build_ffi.py:ffi"],
    cmdclass={"build_py": build_py_with_header},
)
