"""The C packet path under libFuzzer with ASan + UBSan (csrc/fuzz/).

fuzz_packet.c drives both directions of the I/O-free core (csrc/path.c and
what it calls) with arbitrary bytes and aborts on any invariant of
dataplane.h it sees broken (its header lists them). Here we build it with
clang, replay the seed corpus and every regression input one by one, then
fuzz for a bounded time. A missing clang or libFuzzer runtime skips on a
developer's machine and fails under CI (Debian: clang, libclang-rt-14-dev).

A crash found by fuzzing becomes a regression: its input goes to
csrc/fuzz/corpus/regress-<name> and <name> into REGRESSIONS below.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import require

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUZZ = os.path.join(ROOT, "csrc", "fuzz")
CORPUS = os.path.join(FUZZ, "corpus")
FUZZ_SECONDS = 15
FUZZ_RUNS = 3_000_000

# name -> what it once broke (the input is csrc/fuzz/corpus/regress-<name>).
REGRESSIONS: dict[str, str] = {}


def _clang():
    cc = os.environ.get("CC", "")
    return shutil.which(cc if "clang" in cc else "clang")


def build_fuzzer(out, target: str, sources) -> str:
    """Compiles csrc/fuzz/<target>.c with csrc/<sources> for libFuzzer with
    ASan + UBSan into out/<target>; skips (locally) without clang or its
    libFuzzer runtime, fails on any other compiler error."""
    cc = _clang()
    require(cc is not None, "needs clang (apt-get install clang) for the libFuzzer target")
    exe = out / target
    csrc = os.path.join(ROOT, "csrc")
    cmd = [cc, "-g", "-O1", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
           "-Werror", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all",
           "-I", csrc, os.path.join(FUZZ, f"{target}.c")] + \
        [os.path.join(csrc, f) for f in sources] + ["-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    require(r.returncode == 0 or "fuzzer" not in r.stderr,
            f"libFuzzer runtime missing (apt-get install libclang-rt-14-dev): {r.stderr[-500:]}")
    assert r.returncode == 0, r.stderr
    return exe


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz")
    exe = build_fuzzer(out, "fuzz_packet", ("path.c", "packet.c", "routes.c", "trace.c", "gro.c"))
    return exe, out


def _run(args, timeout):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stderr


def test_seed_corpus_is_current():
    # The seeds are generated from dataplane.engine.ipv4; make_corpus.py must
    # reproduce the committed files byte for byte.
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_corpus", os.path.join(FUZZ, "make_corpus.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, data in mod.seeds().items():
        with open(os.path.join(CORPUS, f"seed-{name}"), "rb") as f:
            assert f.read() == data, f"seed-{name} is stale: run python csrc/fuzz/make_corpus.py"


def test_corpus_replays_clean(fuzzer):
    exe, _ = fuzzer
    files = sorted(os.path.join(CORPUS, f) for f in os.listdir(CORPUS))
    assert len(files) >= 10
    rc, err = _run([str(exe), *files], 60)
    assert rc == 0, err[-3000:]
    assert err.count("Executed ") == len(files)


def test_regressions(fuzzer):
    exe, _ = fuzzer
    found = {f[len("regress-"):] for f in os.listdir(CORPUS) if f.startswith("regress-")}
    assert found == set(REGRESSIONS), "every regress-* input is named in REGRESSIONS"
    for name, what in sorted(REGRESSIONS.items()):
        rc, err = _run([str(exe), os.path.join(CORPUS, f"regress-{name}")], 30)
        assert rc == 0, f"regress-{name} ({what}): {err[-3000:]}"


def test_bounded_fuzz_run(fuzzer):
    exe, out = fuzzer
    work = out / "work"
    work.mkdir(exist_ok=True)
    rc, err = _run([str(exe), f"-max_total_time={FUZZ_SECONDS}", f"-runs={FUZZ_RUNS}",
                    "-max_len=8192", "-rss_limit_mb=1024", "-print_final_stats=1",
                    f"-artifact_prefix={out}/", str(work), CORPUS], FUZZ_SECONDS + 30)
    crashes = [p.name for p in out.iterdir() if p.name.startswith(("crash-", "leak-", "oom-",
                                                                   "timeout-"))]
    assert rc == 0 and not crashes, (
        f"fuzz_packet found {crashes} (in {out}); copy the input to "
        f"csrc/fuzz/corpus/regress-<name> and add <name> to REGRESSIONS:\n{err[-4000:]}")
    execs = int(re.search(r"stat::number_of_executed_units:\s+(\d+)", err).group(1))
    cov = int(re.findall(r"cov: (\d+)", err)[-1])
    print(f"fuzz_packet: {execs} execs, cov {cov} in <= {FUZZ_SECONDS} s")
    assert execs >= 10_000, "the fuzzer barely ran"
    assert cov >= 200, "coverage collapsed: is the input layout still what the seeds use?"
