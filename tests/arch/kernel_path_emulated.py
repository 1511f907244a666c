"""The kernel path on arm64 as far as QEMU user-mode emulation reaches (tests/arch/run.sh's bpf
step; not collected by pytest).

The emulator has no bpf() syscall (it answers ENOSYS), so the programs cannot be loaded there.
What it can show, in two halves:

``build OUT`` (in the arm64 root, emulated): the programs compile with the root's own clang
and libbpf headers, through bpf_build.py as any install compiles them, and the object is
copied to OUT; the engine choice then meets the missing bpf(): ``auto`` goes on with the C
engine and says why in one line, ``kernel`` refuses with that reason.

``compare OBJ`` (on this machine): OBJ is the same program as this machine's build. BPF
bytecode is the BPF target's, not the host's (both are little-endian), so any difference in
an instruction, a relocation or a map's definition means a header or a flag differs by host.
"""
from __future__ import annotations

import shutil
import subprocess
import sys

ENOSYS = "Function not implemented"


def build(out: str) -> None:
    from dataplane.engine import bpf_build
    from dataplane.engine.choice import EngineUnavailable, choose_engine
    obj = bpf_build.build(force=True)
    shutil.copyfile(obj, out)
    print(f"the programs compiled here with {bpf_build.clang()}: {obj}")
    auto = choose_engine("auto", kernel=True)
    assert auto.kernel is None and auto.cls.name == "c", auto
    assert ENOSYS in auto.kernel_why and auto.kernel_why.count("\n") == 0, auto.kernel_why
    print(f"auto: {auto.why}; {auto.kernel_why}")
    try:
        forced = choose_engine("kernel", kernel=True)
    except EngineUnavailable as e:
        assert ENOSYS in str(e), e
        print(f"kernel: refused: {e}")
    else:
        raise AssertionError(f"--engine kernel went on under emulation: {forced}")


def _program_text(obj: str) -> str:
    """Every code section's instructions and relocations, by name (the file name left out)."""
    r = subprocess.run(["llvm-objdump", "-d", "-r", "--no-show-raw-insn", obj],
                       capture_output=True, text=True, check=True)
    return r.stdout.split("\n", 2)[2]


def _raw_code(obj: str) -> dict[str, str]:
    """Each code section's bytes (hex), as llvm-objdump dumps them."""
    r = subprocess.run(["llvm-readelf", "-S", "-W", obj], capture_output=True, text=True,
                       check=True)
    names = [f.split("]", 1)[1].split()[0] for f in r.stdout.splitlines()
             if "PROGBITS" in f and " AX " in f]
    return {n: subprocess.run(["llvm-objdump", "-s", "-j", n, obj], capture_output=True,
                              text=True, check=True).stdout.split("\n", 2)[2] for n in names}


def _maps(obj: str) -> dict[str, tuple]:
    """The maps' definitions as libbpf reads them from the object (opened, not loaded)."""
    from dataplane.engine.bpf_lib import ffi, lib
    L = lib()
    o = L.bpf_object__open_file(obj.encode(), ffi.NULL)
    assert o != ffi.NULL, f"libbpf cannot open {obj}"
    try:
        out, m = {}, L.bpf_object__next_map(o, ffi.NULL)
        while m != ffi.NULL:
            out[ffi.string(L.bpf_map__name(m)).decode()] = (
                L.bpf_map__type(m), L.bpf_map__key_size(m), L.bpf_map__value_size(m),
                L.bpf_map__max_entries(m), L.bpf_map__map_flags(m))
            m = L.bpf_object__next_map(o, m)
        return out
    finally:
        L.bpf_object__close(o)


def compare(other: str) -> None:
    from dataplane.engine import bpf_build
    mine = str(bpf_build.build())
    code = _raw_code(mine)
    assert code and code == _raw_code(other), \
        f"the code sections differ from this machine's build ({mine}): {sorted(code)}"
    assert _program_text(mine) == _program_text(other), "the relocations differ"
    maps = _maps(mine)
    assert maps and maps == _maps(other), (maps, _maps(other))
    print(f"the arm64 object is this machine's program: {len(code)} code sections "
          f"({', '.join(sorted(code))}) byte for byte, their relocations and {len(maps)} maps "
          f"({', '.join(sorted(maps))}) alike")


if __name__ == "__main__":
    {"build": build, "compare": compare}[sys.argv[1]](sys.argv[2])
