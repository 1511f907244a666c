"""cffi builder for the C engine (out-of-line API mode).

The header is the cdef: csrc/dataplane.h is read verbatim, minus its
preprocessor lines, so the Python side can never drift from the C contract.
The files to compile are those of csrc/sources.txt.
"""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))


def sources(kind=None):
    """csrc/sources.txt's files in link order; only those of `kind` ("io" or "pure") if given."""
    out = []
    with open(os.path.join(HERE, "sources.txt")) as f:
        for line in f:
            words = line.split("#", 1)[0].split()
            if words and (kind is None or words[1] == kind):
                out.append(words[0])
    return out


def _cdef_text(path):
    with open(path) as f:
        return "".join(line for line in f if not line.lstrip().startswith("#"))


ffi = FFI()
ffi.cdef(_cdef_text(os.path.join(HERE, "dataplane.h")))
ffi.set_source(
    "dataplane._dataplane_c",
    '#include "dataplane.h"',
    sources=[os.path.relpath(os.path.join(HERE, s)) for s in sources()],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    # A failed build must not fail the install: the Python engine takes over.
    optional=True,
)

if __name__ == "__main__":
    ffi.compile(verbose=True)
