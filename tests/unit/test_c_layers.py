"""The C files of csrc/ call each other in layers: loop.c (epoll, the API) on
top, the two directions tx.c and rx.c under it, io.c under both, and the pure
files (no I/O) at the bottom. A file calls only into files below it, so no two
files call each other, directly or round a longer cycle; the two directions
share what they share through io.c, never through each other; and a pure file
never calls one that does I/O (the fuzz targets link only the pure ones).

Who calls whom is read from the compiled objects: a symbol that one file's
object leaves undefined and another's defines is a call (or a use of data)
from the first into the second. An object compiled at -O0 carries the static
inline helpers of the headers it uses, with their own calls, so a call hidden
in such a helper counts for the file that uses it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.cbuild import CSRC, build_ffi
from tests.conftest import require

SOURCES = build_ffi.sources()
PURE = set(build_ffi.sources("pure"))


def _symbols(obj) -> tuple[set[str], set[str]]:
    """(defined, undefined) external symbols of an object file."""
    r = subprocess.run([shutil.which("nm"), "-P", "-g", str(obj)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    defined, undefined = set(), set()
    for line in r.stdout.splitlines():
        name, kind = line.split()[:2]
        (undefined if kind in ("U", "w", "v") else defined).add(name)
    return defined, undefined


@pytest.fixture(scope="module")
def calls(tmp_path_factory) -> dict[str, set[str]]:
    """file -> the other files it calls into."""
    cc = shutil.which(os.environ.get("CC", "") or "gcc") or shutil.which("cc")
    require(cc is not None, "needs a C compiler (apt-get install gcc) to read the C call graph")
    require(shutil.which("nm") is not None, "needs nm (apt-get install binutils)")
    out = tmp_path_factory.mktemp("layers")
    defined, undefined = {}, {}

    def compile_one(src):
        obj = out / (src + ".o")
        r = subprocess.run([cc, "-O0", "-std=gnu11", "-I", CSRC, "-c", os.path.join(CSRC, src),
                            "-o", str(obj)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return obj
    # as many compilers at once as there are CPUs
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for src, obj in zip(SOURCES, pool.map(compile_one, SOURCES)):
            defined[src], undefined[src] = _symbols(obj)
    return {src: {other for other in SOURCES if other != src and undefined[src] & defined[other]}
            for src in SOURCES}


def _cycle(calls: dict[str, set[str]]) -> list[str] | None:
    """A cycle of calls as [a, b, ..., a], or None."""
    state: dict[str, int] = {}          # 1: on the current path, 2: done
    path: list[str] = []

    def visit(f):
        state[f] = 1
        path.append(f)
        for g in sorted(calls[f]):
            if state.get(g) == 1:
                return path[path.index(g):] + [g]
            if g not in state and (found := visit(g)):
                return found
        path.pop()
        state[f] = 2
        return None

    for f in SOURCES:
        if f not in state and (found := visit(f)):
            return found
    return None


def test_sources_txt_lists_every_c_file():
    on_disk = {f for f in os.listdir(CSRC) if f.endswith(".c")}
    assert set(SOURCES) == on_disk
    assert len(SOURCES) == len(set(SOURCES))
    assert PURE and PURE < set(SOURCES)


def test_the_call_graph_is_read(calls):
    # The top calls both directions: were the objects' symbols misread, this would be empty.
    assert {"tx.c", "rx.c"} <= calls["loop.c"]


def test_no_files_call_each_other(calls):
    cycle = _cycle(calls)
    assert cycle is None, "these files call each other: " + " -> ".join(cycle)


def test_nothing_calls_up_into_the_loop(calls):
    assert not {f for f in SOURCES if "loop.c" in calls[f]}


def test_the_directions_never_call_each_other(calls):
    assert "rx.c" not in calls["tx.c"] and "tx.c" not in calls["rx.c"]


def test_pure_files_call_only_pure_files(calls):
    assert {f: calls[f] - PURE for f in PURE if calls[f] - PURE} == {}
