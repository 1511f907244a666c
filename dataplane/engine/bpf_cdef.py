"""The kernel path's cffi declarations as one text: maps.h's enums and structs (the programs'
own, less the preprocessor's lines, after the kernel's type names) and the libbpf 1.x calls the
loader makes (bpf_lib.py), with their option structs.

The text is read two ways. At build time csrc/bpf/build_ffi.py gives it to cffi's out-of-line
ABI mode, which writes the parsed declarations as a Python module
(dataplane/engine/_bpf_ffi.py; nothing is compiled), with the text's digest beside them. At
run time bpf_lib.py takes that module where its digest is the one of this text, made from the
maps.h found now, so that no daemon imports cffi's C parser nor parses the declarations (0.1 s
of a start and 1 MB of its RSS: perf/README.md#kernel-rss); a maps.h changed since the build,
or a checkout never built, is parsed at import as before. So the header stays the one source
of every fact.

Only the standard library here: the builder loads this file alone, without the package.
"""
from __future__ import annotations

import hashlib
import re

# The name of the digest's constant in the built module (a #define of cffi's cdef).
DIGEST_NAME = "FU_CDEF_DIGEST"

_KERNEL_TYPES = ("typedef uint8_t __u8; typedef uint16_t __u16; typedef uint32_t __u32; "
                 "typedef uint64_t __u64;\n")

LIBBPF = """
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
int bpf_map_lookup_batch(int fd, void *in_batch, void *out_batch, void *keys, void *values,
                         uint32_t *count, const struct bpf_map_batch_opts *opts);
"""


def maps_part(maps_h: str) -> str:
    """maps.h's declarations as cffi reads them: after the kernel's type names, less the
    preprocessor's lines."""
    return _KERNEL_TYPES + re.sub(r"(?m)^\s*#.*$", "", maps_h)


def text(maps_h: str) -> str:
    """The whole cdef of the header ``maps_h`` (its text) and libbpf's calls."""
    return maps_part(maps_h) + LIBBPF


def digest(cdef: str) -> int:
    """The digest of a cdef text, as the built module holds it (60 bits: a C constant)."""
    return int(hashlib.sha256(cdef.encode()).hexdigest()[:15], 16)


def with_digest(cdef: str) -> str:
    """``cdef`` with its digest as the constant DIGEST_NAME, for the builder."""
    return f"{cdef}\n#define {DIGEST_NAME} {digest(cdef)}\n"
