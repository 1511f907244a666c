"""Builds one C program from csrc/ for a test: a libFuzzer target under
csrc/fuzz/ (ASan + UBSan + libFuzzer), or a plain driver with a main()
there (ASan + UBSan). One helper, so every C test compiles the engine's
files with the same flags (-Werror included), and links the pure files
that csrc/sources.txt lists (PURE_SOURCES).

A missing clang or libFuzzer runtime skips on a developer's machine and
fails under CI (Debian: clang, libclang-rt-14-dev).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

from tests.conftest import require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
FUZZ = os.path.join(CSRC, "fuzz")


def _build_ffi():
    spec = importlib.util.spec_from_file_location("build_ffi", os.path.join(CSRC, "build_ffi.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build_ffi = _build_ffi()
# The files without I/O, which every program under csrc/fuzz/ may call.
PURE_SOURCES = tuple(build_ffi.sources("pure"))


def _clang():
    cc = os.environ.get("CC", "")
    return shutil.which(cc if "clang" in cc else "clang")


def build_c(out, target: str, sources=PURE_SOURCES, fuzzer: bool = True):
    """Compiles csrc/fuzz/<target>.c with csrc/<sources> (by default every
    pure file) into out/<target>; with fuzzer=False the target has its own
    main(). Fails on any compiler error but a missing compiler or fuzzer
    runtime. Each file is compiled on its own, as many at once as there are
    CPUs, and a file of csrc/ once a session for each set of flags (its
    object is the same for every program that links it)."""
    cc = _clang()
    require(cc is not None, "needs clang (apt-get install clang) for the C test programs")
    exe = out / target
    sanitize = "fuzzer,address,undefined" if fuzzer else "address,undefined"
    flags = ["-g", "-O1", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror",
             f"-fsanitize={sanitize}", "-fno-sanitize-recover=all"]
    # out is a tmp_path_factory directory: its parent lives as long as the session
    shared = out.parent / f"cbuild-{sanitize.replace(',', '-')}"
    shared.mkdir(exist_ok=True)
    objects = [(os.path.join(FUZZ, f"{target}.c"), out / f"{target}.o")] + \
        [(os.path.join(CSRC, f), shared / f"{os.path.splitext(f)[0]}.o") for f in sources]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for r in pool.map(lambda so: _compile(cc, flags, *so), objects):
            _check(r)
    r = subprocess.run([cc, *flags, *(str(o) for _, o in objects), "-o", str(exe)],
                       capture_output=True, text=True, timeout=120)
    _check(r)
    return exe


def _compile(cc, flags, src, obj):
    if obj.exists():
        return None
    tmp = obj.with_name(f"{obj.name}.{threading.get_ident()}.tmp")
    r = subprocess.run([cc, *flags, "-I", CSRC, "-c", src, "-o", str(tmp)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 0:
        os.replace(tmp, obj)
    return r


def _check(r) -> None:
    if r is None:
        return
    require(r.returncode == 0 or "fuzzer" not in r.stderr,
            f"libFuzzer runtime missing (apt-get install libclang-rt-14-dev): {r.stderr[-500:]}")
    assert r.returncode == 0, r.stderr


def fuzz_bounded(exe, out, corpus, seconds: int, runs: int, max_len: int, hint: str = "") -> str:
    """Runs a libFuzzer target for at most `seconds` and `runs` over the
    corpus directories (new inputs go to out/work, the first of them), and
    fails on any crash, leak, OOM or timeout it finds. Returns its stderr
    (the final stats: stat::number_of_executed_units, cov)."""
    work = out / "work"
    work.mkdir(exist_ok=True)
    r = subprocess.run([str(exe), f"-max_total_time={seconds}", f"-runs={runs}",
                        f"-max_len={max_len}", "-rss_limit_mb=1024", "-print_final_stats=1",
                        f"-artifact_prefix={out}/", str(work), *map(str, corpus)],
                       capture_output=True, text=True, timeout=seconds + 60)
    crashes = [p.name for p in out.iterdir() if p.name.startswith(("crash-", "leak-", "oom-",
                                                                   "timeout-"))]
    assert r.returncode == 0 and not crashes, \
        f"{exe.name} found {crashes} (in {out}){hint}:\n{r.stderr[-4000:]}"
    return r.stderr


def executed(stderr: str) -> int:
    """How many inputs a libFuzzer run executed (its final stats)."""
    import re
    return int(re.search(r"stat::number_of_executed_units:\s+(\d+)", stderr).group(1))


def seeded_fuzzer(out, target: str, seeds: dict[str, bytes]):
    """build_c's libFuzzer target, and its seeds written to out/seeds
    (name -> input); returns (exe, the seeds directory)."""
    exe = build_c(out, target)
    d = out / "seeds"
    d.mkdir()
    for name, data in seeds.items():
        (d / name).write_bytes(data)
    return exe, d


def replay(exe, files, timeout: float = 60) -> None:
    """Runs each input once and fails on the first the target aborts on."""
    r = subprocess.run([str(exe), *map(str, files)], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("Executed ") == len(files)
