"""cffi builder for the C engine (out-of-line API mode).

The header is the cdef: csrc/dataplane.h is read verbatim, minus its
preprocessor lines, so the Python side can never drift from the C contract.
"""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["loop.c", "tx.c", "rx.c", "path.c", "routes.c", "packet.c", "trace.c", "gso.c",
           "gro.c", "train.c", "local.c"]


def _cdef_text(path):
    with open(path) as f:
        return "".join(line for line in f if not line.lstrip().startswith("#"))


ffi = FFI()
ffi.cdef(_cdef_text(os.path.join(HERE, "dataplane.h")))
ffi.set_source(
    "dataplane._dataplane_c",
    '#include "dataplane.h"',
    sources=[os.path.relpath(os.path.join(HERE, s)) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    # A failed build must not fail the install: the Python engine takes over.
    optional=True,
)

if __name__ == "__main__":
    ffi.compile(verbose=True)
