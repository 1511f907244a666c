"""glibc's thresholds (host/malloc.py): once fixed, a large block freed no longer makes the
later ones come from the heap, where they would stay resident after their free; the daemon
fixes them as its run begins, the kernel path's loader after libbpf's load."""
from __future__ import annotations

import ctypes
import gc
import sys

from dataplane.daemon.interpreter import StartInterpreter
from dataplane.host import malloc


_LIBC = ctypes.CDLL(None)
_LIBC.malloc.restype, _LIBC.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]


def mapped_alone(size: int) -> bool:
    """Whether a block of ``size`` bytes is mapped on its own (so unmapped at its free): glibc
    marks such a chunk in its size word, just before the block (IS_MMAPPED, 0x2). Read from the
    block itself, not from the process's total of mapped bytes (mallinfo2), which another
    thread's mapped block (gRPC's, in a suite that ran etcd tests first) can move meanwhile."""
    block = _LIBC.malloc(size)
    try:
        return bool(ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value
                    & 0x2)
    finally:
        _LIBC.free(block)


def _raise_threshold() -> None:
    """What libbpf's BTF read does: a large mapped block freed (glibc then raises its mmap
    threshold past it, unless the thresholds were fixed)."""
    _LIBC.free(_LIBC.malloc(16 << 20))


def test_fixed_thresholds_stay_where_a_large_free_would_raise_them():
    malloc.fix_thresholds()
    _raise_threshold()
    assert mapped_alone(2 << 20)


def test_the_daemons_run_begins_with_them_fixed():
    _raise_threshold()
    was = sys.getswitchinterval()
    i = StartInterpreter()
    try:
        i.begin()
        _raise_threshold()
        assert mapped_alone(2 << 20)
    finally:
        i.ready()
        gc.unfreeze()
        sys.setswitchinterval(was)
