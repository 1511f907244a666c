"""The C packet path under libFuzzer with ASan + UBSan (csrc/fuzz/).

fuzz_packet.c drives both directions of the I/O-free core (csrc/path.c and
what it calls) with arbitrary bytes and aborts on any invariant of
dataplane.h it sees broken (its header lists them). Here we build it with
clang (tests/cbuild.py), replay the seed corpus and every regression input
one by one, then fuzz for a bounded time.

A crash found by fuzzing becomes a regression: its input goes to
csrc/fuzz/corpus/regress-<name> and <name> into REGRESSIONS below.
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.cbuild import FUZZ, build_c, executed, fuzz_bounded, replay

CORPUS = os.path.join(FUZZ, "corpus")
# A smoke run on every `make test`, not a fuzzing campaign (csrc/fuzz/run.sh is the one): from
# the seed corpus the coverage climbs in the first seconds, then gains an edge every few seconds;
# 8 s ends within an edge of where 15 s did, with executions far above the floor asserted below.
FUZZ_SECONDS = 8
FUZZ_RUNS = 3_000_000

# name -> what it once broke (the input is csrc/fuzz/corpus/regress-<name>).
REGRESSIONS: dict[str, str] = {}


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz")
    exe = build_c(out, "fuzz_packet")
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
    replay(exe, files)


def test_regressions(fuzzer):
    exe, _ = fuzzer
    found = {f[len("regress-"):] for f in os.listdir(CORPUS) if f.startswith("regress-")}
    assert found == set(REGRESSIONS), "every regress-* input is named in REGRESSIONS"
    for name, what in sorted(REGRESSIONS.items()):
        rc, err = _run([str(exe), os.path.join(CORPUS, f"regress-{name}")], 30)
        assert rc == 0, f"regress-{name} ({what}): {err[-3000:]}"


def test_bounded_fuzz_run(fuzzer):
    exe, out = fuzzer
    err = fuzz_bounded(exe, out, [CORPUS], FUZZ_SECONDS, FUZZ_RUNS, 8192,
                       "; copy the input to csrc/fuzz/corpus/regress-<name> and add <name> "
                       "to REGRESSIONS")
    execs = executed(err)
    cov = int(re.findall(r"cov: (\d+)", err)[-1])
    print(f"fuzz_packet: {execs} execs, cov {cov} in <= {FUZZ_SECONDS} s")
    assert execs >= 10_000, "the fuzzer barely ran"
    assert cov >= 200, "coverage collapsed: is the input layout still what the seeds use?"
