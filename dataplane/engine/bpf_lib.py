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
