"""The few libbpf calls the kernel path makes, through cffi in ABI mode.

libbpf.so.1 (Debian's libbpf1, pulled in by libbpf-dev) is opened at first
use, so nothing is compiled for it and a host without it still imports this
module: ``lib()`` then raises BpfLibError saying what to install. The
declarations (bpf_cdef.py) are libbpf 1.x's of just these calls and their
option structs, with maps.h's (bpf_contract.CDEF) beside them, so map keys
and values are the programs' own structs: parsed at build time (the module
dataplane/engine/_bpf_ffi.py, csrc/bpf/build_ffi.py) where that build is of this
maps.h, else here at import. libbpf 1.x returns -errno from calls that
return an int and sets errno for those that return a pointer.
"""
from __future__ import annotations

import errno
import os

from . import bpf_cdef
from .bpf_contract import CDEF

LIBRARY = "libbpf.so.1"


def _ffi(cdef: str):
    """The declarations ``cdef`` parsed: the build's module where it holds this very text (its
    digest), so that neither cffi's parser is imported nor the text parsed; else parsed now."""
    try:
        from ._bpf_ffi import ffi as built
        if built.integer_const(bpf_cdef.DIGEST_NAME) == bpf_cdef.digest(cdef):
            return built
    except (ImportError, AttributeError):    # not built (a bare checkout), or another build's
        pass
    from cffi import FFI
    parsed = FFI()
    parsed.cdef(cdef)
    return parsed


ffi = _ffi(CDEF + bpf_cdef.LIBBPF)
_lib = None


class BpfLibError(OSError):
    """libbpf is missing, or one of its calls failed (errno and what was being done)."""


def lib():
    """libbpf, opened once."""
    global _lib
    if _lib is None:
        try:
            lb = ffi.dlopen(LIBRARY)
        except OSError as e:
            raise BpfLibError(f"cannot open {LIBRARY} ({e}): apt-get install libbpf1 "
                              "(libbpf-dev brings it)") from None
        # libbpf writes its own lines to stderr, which is the daemon's log (the journal's
        # format): among them the kernel's answer to looking for a hook where none is ("Parent
        # Qdisc doesn't exists"), an expected answer here. Every call's result is checked and
        # said in our words, and a refused program's verifier log is kept by its own buffer.
        lb.libbpf_set_print(ffi.NULL)
        _lib = lb
    return _lib


def check(rc: int, what: str) -> int:
    """rc of a libbpf int call: itself when >= 0, else BpfLibError naming ``what``."""
    if rc < 0:
        raise BpfLibError(-rc, f"{what}: {os.strerror(-rc)}")
    return rc


def check_ptr(ptr, what: str):
    """A pointer a libbpf call returned, or BpfLibError with its errno."""
    if ptr == ffi.NULL:
        err = ffi.errno or 1
        raise BpfLibError(err, f"{what}: {os.strerror(err)}")
    return ptr


def sized(ctype: str):
    """A new libbpf options struct with its sz set, as libbpf's OPTS macros make them."""
    p = ffi.new(ctype + " *")
    p.sz = ffi.sizeof(ctype)
    return p


# The kernel's answer to a batch call on a map type without batch operations (its own
# ENOTSUPP, which os.strerror and the errno module do not know), and to a key a delete does
# not find.
ENOTSUPP, ENOENT = 524, errno.ENOENT
# What a kernel without a batch operation answers (ENOTSUPP, EOPNOTSUPP, EINVAL), negated
NO_BATCH = (-ENOTSUPP, -errno.EOPNOTSUPP, -errno.EINVAL)


def batch_supported(fd: int, delete: bool = False) -> bool:
    """Whether the map ``fd`` takes batched updates (``delete``: deletes): an empty batch
    asks, the kernel refusing it before it looks at the count where the map type has none."""
    count = ffi.new("uint32_t *", 0)
    nothing = ffi.new("char[1]")
    b = lib()
    rc = b.bpf_map_delete_batch(fd, nothing, count, sized("struct bpf_map_batch_opts")) \
        if delete else b.bpf_map_update_batch(fd, nothing, nothing, count,
                                               sized("struct bpf_map_batch_opts"))
    return rc not in NO_BATCH


def update_batch(fd: int, keys: bytes, values: bytes, n: int, what: str) -> None:
    """``n`` elements written in one call: ``keys`` and ``values`` each ``n`` of the map's
    keys and values, packed one after the other (the kernel writes them in order)."""
    count = ffi.new("uint32_t *", n)
    check(lib().bpf_map_update_batch(fd, ffi.from_buffer(keys), ffi.from_buffer(values), count,
                                     sized("struct bpf_map_batch_opts")), what)


def delete_batch(fd: int, keys: bytes, n: int, size: int, what: str) -> None:
    """``n`` keys of ``size`` bytes deleted in one call; a key that is not there is skipped
    (the kernel stops at it, the rest goes on in a new call)."""
    b = lib()
    done = 0
    while done < n:
        count = ffi.new("uint32_t *", n - done)
        rc = b.bpf_map_delete_batch(fd, ffi.from_buffer(keys[done * size:]), count,
                                    sized("struct bpf_map_batch_opts"))
        done += count[0]
        if rc == -ENOENT:
            done += 1                   # gone already
        elif rc < 0:
            check(rc, what)
        elif count[0] == 0:
            return


_lookup_batch = None            # whether the kernel reads an array in one call (asked once)


def percpu_sums(fd: int, n: int, what: str) -> list:
    """The first ``n`` elements of the per-CPU array of __u64 ``fd``, each summed over the CPUs:
    read with one call where the kernel has batched lookups, else one element at a time. A
    /metrics scrape reads the counters so, and each call gives the interpreter lock up and
    waits to take it back behind whatever thread is busy (a burst of lease events): one
    call, not one per counter (perf/README.md#burst-answers)."""
    global _lookup_batch
    b = lib()
    ncpus = check(b.libbpf_num_possible_cpus(), "counting the CPUs")
    vals = ffi.new("__u64[]", n * ncpus)
    if _lookup_batch is not False:
        keys, count = ffi.new("uint32_t[]", n), ffi.new("uint32_t *", n)
        rc = b.bpf_map_lookup_batch(fd, ffi.NULL, ffi.new("uint32_t *"), keys, vals, count,
                                    sized("struct bpf_map_batch_opts"))
        if rc in (0, -ENOENT) and count[0] == n:       # ENOENT: read up to the array's end
            _lookup_batch = True
            sums = [0] * n
            for i in range(n):
                sums[keys[i]] = sum(vals[i * ncpus:(i + 1) * ncpus])
            return sums
        if _lookup_batch is None and rc in NO_BATCH:
            _lookup_batch = False
        else:
            check(rc if rc < 0 else -errno.EIO, what)      # fewer than asked
    key, sums = ffi.new("uint32_t *"), []
    for i in range(n):
        key[0] = i
        check(b.bpf_map_lookup_elem(fd, key, vals), what)
        sums.append(sum(vals[0:ncpus]))
    return sums
