"""The few libbpf calls the kernel path makes, through cffi in ABI mode.

libbpf.so.1 (Debian's libbpf1, pulled in by libbpf-dev) is opened at first
use, so nothing is compiled for it and a host without it still imports this
module: ``lib()`` then raises BpfLibError saying what to install. The cdef
is libbpf 1.x's declarations of just these calls and their option structs,
with maps.h's (bpf_contract.CDEF) beside them, so map keys and values are
the programs' own structs. libbpf 1.x returns -errno from calls that return
an int and sets errno for those that return a pointer.
"""
from __future__ import annotations

import ctypes
import os

from cffi import FFI

from .bpf_contract import CDEF

LIBRARY = "libbpf.so.1"

ffi = FFI()
ffi.cdef(CDEF)
ffi.cdef("""
struct bpf_object; struct bpf_program; struct bpf_map;
struct bpf_object *bpf_object__open_file(const char *path, const void *opts);
int bpf_object__load(struct bpf_object *obj);
void bpf_object__close(struct bpf_object *obj);
struct bpf_program *bpf_object__find_program_by_name(const struct bpf_object *obj, const char *name);
struct bpf_map *bpf_object__find_map_by_name(const struct bpf_object *obj, const char *name);
int bpf_program__fd(const struct bpf_program *prog);
int bpf_program__set_log_buf(struct bpf_program *prog, char *log_buf, size_t log_size);
int bpf_program__set_log_level(struct bpf_program *prog, uint32_t log_level);
int bpf_map__fd(const struct bpf_map *map);
int bpf_map_update_elem(int fd, const void *key, const void *value, uint64_t flags);
int bpf_map_lookup_elem(int fd, const void *key, void *value);
int bpf_map_delete_elem(int fd, const void *key);
int libbpf_num_possible_cpus(void);

enum bpf_tc_attach_point { BPF_TC_INGRESS = 1, BPF_TC_EGRESS = 2, BPF_TC_CUSTOM = 4 };
struct bpf_tc_hook { size_t sz; int ifindex; enum bpf_tc_attach_point attach_point;
                     uint32_t parent; };   /* size_t :0 in libbpf.h: the size rounds up to 8, as here */
struct bpf_tc_opts { size_t sz; int prog_fd; uint32_t flags; uint32_t prog_id; uint32_t handle;
                     uint32_t priority; };
int bpf_tc_hook_create(struct bpf_tc_hook *hook);
int bpf_tc_hook_destroy(struct bpf_tc_hook *hook);
int bpf_tc_attach(const struct bpf_tc_hook *hook, struct bpf_tc_opts *opts);
int bpf_tc_detach(const struct bpf_tc_hook *hook, const struct bpf_tc_opts *opts);

struct bpf_test_run_opts { size_t sz; const void *data_in; void *data_out; uint32_t data_size_in;
                           uint32_t data_size_out; const void *ctx_in; void *ctx_out;
                           uint32_t ctx_size_in; uint32_t ctx_size_out; uint32_t retval;
                           int repeat; uint32_t duration; uint32_t flags; uint32_t cpu;
                           uint32_t batch_size; };
int bpf_prog_test_run_opts(int prog_fd, struct bpf_test_run_opts *opts);

/* pinning (bpf_pins.py): pins on bpffs, what an fd is, a pinned map reused by a new object */
int bpf_obj_pin(int fd, const char *pathname);
int bpf_obj_get(const char *pathname);
int bpf_obj_get_info_by_fd(int bpf_fd, void *info, uint32_t *info_len);
int bpf_prog_get_fd_by_id(uint32_t id);
int bpf_map_get_next_key(int fd, const void *key, void *next_key);
int bpf_map__reuse_fd(struct bpf_map *map, int fd);
struct bpf_map *bpf_object__next_map(const struct bpf_object *obj, const struct bpf_map *map);
const char *bpf_map__name(const struct bpf_map *map);
int bpf_map__type(const struct bpf_map *map);
uint32_t bpf_map__key_size(const struct bpf_map *map);
uint32_t bpf_map__value_size(const struct bpf_map *map);
uint32_t bpf_map__max_entries(const struct bpf_map *map);
uint32_t bpf_map__map_flags(const struct bpf_map *map);
int bpf_tc_query(const struct bpf_tc_hook *hook, struct bpf_tc_opts *opts);
void *libbpf_set_print(void *fn);

/* batched map writes (bpf_path.py's routes and peers): one syscall for many elements */
struct bpf_map_batch_opts { size_t sz; uint64_t elem_flags; uint64_t flags; };
int bpf_map_update_batch(int fd, const void *keys, const void *values, uint32_t *count,
                         const struct bpf_map_batch_opts *opts);
int bpf_map_delete_batch(int fd, const void *keys, uint32_t *count,
                         const struct bpf_map_batch_opts *opts);
""")

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


# glibc's malloc.h: mallopt's parameters, and the default both thresholds start from
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MALLOC_THRESHOLD = 128 << 10


def fix_malloc_thresholds() -> None:
    """glibc's mmap and trim thresholds fixed at their defaults, after a libbpf call that read
    the kernel's BTF (bpf_object__load: /sys/kernel/btf/vmlinux, ~5 MB, malloc'd and freed).
    Freeing a block that large raises both thresholds past it for the rest of the process
    (glibc's dynamic threshold), so that every later allocation under ~5 MB (an etcd listing's
    buffers, numpy's route arrays) is carved from the heap and, once freed, stays resident as
    free fragments: 8-11 MB of a kernel path daemon's idle RSS at 16,000 leases, which the C
    path's daemon, never reading the BTF, does not hold (perf/README.md#kernel-rss). Set
    explicitly, the thresholds stay put: a large block is mapped and given back at its free.
    A libc without mallopt (not glibc) is left as it is."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, MALLOC_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, MALLOC_THRESHOLD)


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
# ENOTSUPP, which os.strerror does not know), and to a key a delete does not find.
ENOTSUPP, ENOENT = 524, 2


def batch_supported(fd: int, delete: bool = False) -> bool:
    """Whether the map ``fd`` takes batched updates (``delete``: deletes): an empty batch
    asks, the kernel refusing it before it looks at the count where the map type has none."""
    count = ffi.new("uint32_t *", 0)
    nothing = ffi.new("char[1]")
    b = lib()
    rc = b.bpf_map_delete_batch(fd, nothing, count, sized("struct bpf_map_batch_opts")) \
        if delete else b.bpf_map_update_batch(fd, nothing, nothing, count,
                                               sized("struct bpf_map_batch_opts"))
    return rc not in (-ENOTSUPP, -95, -22)      # ENOTSUPP, EOPNOTSUPP, EINVAL: not here


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
