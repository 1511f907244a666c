"""cffi builder of the kernel path's declarations (out-of-line ABI mode): nothing is compiled;
cffi writes them, parsed, as the module dataplane/engine/_bpf_ffi.py, with which bpf_lib.py
opens libbpf. The text is dataplane/engine/bpf_cdef.py's of this directory's maps.h, with its
digest: bpf_lib.py takes the module only for the maps.h it was made from (else it parses the
text at import, as without a build)."""
import importlib.util
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
_SPEC = importlib.util.spec_from_file_location(
    "_fu_bpf_cdef", os.path.join(HERE, "..", "..", "dataplane", "engine", "bpf_cdef.py"))
bpf_cdef = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bpf_cdef)

with open(os.path.join(HERE, "maps.h")) as _f:
    ffi = FFI()
    ffi.cdef(bpf_cdef.with_digest(bpf_cdef.text(_f.read())))
ffi.set_source("dataplane.engine._bpf_ffi", None)

if __name__ == "__main__":
    ffi.compile(verbose=True)
