"""The kernel path's declarations (engine/bpf_cdef.py): the build's parsed module is what a
daemon opens libbpf with, so it imports no C parser; a maps.h other than the build's is parsed
at import instead, so the header stays the one source."""
from __future__ import annotations

import subprocess
import sys

from dataplane.engine import bpf_cdef, bpf_lib
from dataplane.engine.bpf_contract import CDEF


def test_the_loader_imports_no_c_parser():
    code = ("import sys; import dataplane.engine.bpf_path, dataplane.engine.bpf_pinned; "
            "print(sorted(m for m in sys.modules if m.startswith(('pycparser', 'cffi.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_build_holds_this_header():
    assert type(bpf_lib.ffi).__module__ == "_cffi_backend"      # not cffi.api's: not parsed here
    assert bpf_lib.ffi.integer_const(bpf_cdef.DIGEST_NAME) == bpf_cdef.digest(CDEF + bpf_cdef.LIBBPF)
    assert bpf_lib.ffi.sizeof("fu_hop") == 24


def test_another_header_is_parsed_at_import():
    changed = CDEF.replace("__u8 peer_ip6[16];", "__u8 peer_ip6[16]; __u32 added;", 1) + bpf_cdef.LIBBPF
    ffi = bpf_lib._ffi(changed)
    assert ffi is not bpf_lib.ffi
    assert ffi.sizeof("fu_hop") == bpf_lib.ffi.sizeof("fu_hop") + 4
