"""Run a command on a host that refuses the UDP sockets' steering program.

``python refuse_steering.py ARGV...`` installs a seccomp filter that fails
``setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, ...)`` with ENOPROTOOPT,
what QEMU's user-mode emulation and kernels before 4.5 answer, then execs
ARGV. The filter stays on across exec, in every thread and every child, and
touches no other call: the test sees the refusal the daemon would meet there,
on this machine's kernel. :func:`wrap` builds that command line.

Plain prctl + classic BPF through ctypes, so the suite needs no libseccomp
binding in its virtual environment.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys

SOL_SOCKET = 1
SO_ATTACH_REUSEPORT_CBPF = 51
# The architectures the filter knows: (AUDIT_ARCH_*, setsockopt's number) from <linux/audit.h>
# and each one's syscall table; a call of another ABI (x32, compat) passes untouched.
ARCHES = {"x86_64": (0xC000003E, 54), "aarch64": (0xC00000B7, 208), "s390x": (0x80000016, 366)}

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn))]


def _arg_low(i: int) -> int:
    """Offset of the low 32 bits of args[i] in struct seccomp_data (the values are
    compared as 32-bit words)."""
    return 16 + 8 * i + (0 if sys.byteorder == "little" else 4)


def program(machine: str = platform.machine()) -> list[tuple[int, int, int, int]]:
    """(code, jt, jf, k): ENOPROTOOPT for setsockopt(_, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF),
    everything else allowed."""
    if machine not in ARCHES:
        raise SystemExit(f"refuse_steering: no syscall numbers for {machine}")
    arch, nr = ARCHES[machine]
    # each test that fails jumps to the last instruction, ALLOW
    return [
        (_LD_W_ABS, 0, 0, 4),                      # arch
        (_JEQ_K, 0, 7, arch),
        (_LD_W_ABS, 0, 0, 0),                      # syscall number
        (_JEQ_K, 0, 5, nr),
        (_LD_W_ABS, 0, 0, _arg_low(1)),            # level
        (_JEQ_K, 0, 3, SOL_SOCKET),
        (_LD_W_ABS, 0, 0, _arg_low(2)),            # optname
        (_JEQ_K, 0, 1, SO_ATTACH_REUSEPORT_CBPF),
        (_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOPROTOOPT),
        (_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]


def install() -> None:
    insns = program()
    arr = (_Insn * len(insns))(*[_Insn(*i) for i in insns])
    prog = _Prog(len(insns), arr)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                           ctypes.c_ulong]
    # no_new_privs: what the kernel asks of a filter installed without CAP_SYS_ADMIN
    for option, arg, ptr in ((PR_SET_NO_NEW_PRIVS, 1, None),
                             (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog))):
        if libc.prctl(option, arg, ptr, 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"prctl({option}): {os.strerror(e)}")


def wrap(argv: list[str]) -> list[str]:
    """``argv`` run under the filter."""
    return [sys.executable, os.path.abspath(__file__), *argv]


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: refuse_steering.py ARGV...")
    install()
    os.execvp(sys.argv[1], sys.argv[1:])
