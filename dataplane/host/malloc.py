"""glibc's allocator, kept from holding memory the daemon has freed.

glibc raises its mmap threshold past the size of any mapped block that is freed (its dynamic
threshold): once the process has freed one large block (an import's, the etcd listing's, libbpf's
5 MB copy of the kernel's BTF), every later block under that size is carved from the heap and,
once freed, mostly stays resident as free fragments. :func:`fix_thresholds` sets the mmap and
trim thresholds to glibc's defaults and so fixes them: a large block is mapped on its own and
given back at its free (4.8 MB of a C engine daemon's idle RSS at 16,000 leases, 8-11 MB of a
kernel path one: perf/README.md#kernel-rss). A libc that is not glibc is left as it is.
"""
from __future__ import annotations

import ctypes

# malloc.h: mallopt's parameters, and the default both thresholds start from
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
THRESHOLD = 128 << 10


def _libc():
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def fix_thresholds() -> None:
    """Both thresholds at glibc's default, no longer raised by a large free."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, THRESHOLD)


def give_back() -> None:
    """The free pages in the middle of the heap returned to the system (malloc_trim)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)
