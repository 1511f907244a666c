"""csrc/train.c under libFuzzer with ASan + UBSan (csrc/fuzz/fuzz_train.c).

The arithmetic of UDP trains: how a batch of queued datagrams is grouped
into UDP_SEGMENT sends, and how a UDP_GRO message is cut into datagrams
with what the receive slot holds of each; the target aborts on any broken
invariant (its header lists them). Seeds are built here in its input layout.
"""
from __future__ import annotations

import struct

import pytest

from tests.cbuild import executed, fuzz_bounded, replay, seeded_fuzzer

# A smoke run on every `make test`: this target is slow per input, but its coverage is reached
# within the first few hundred inputs. The run is FUZZ_RUNS inputs, whatever they take (200-500 a
# second on the 2-core machine, by its load); the time is only a cap against a hang. (A run of a
# fixed 5 s counted 561 inputs once, under a load of 5.)
FUZZ_RUNS = 1000
FUZZ_CAP_S = 120


def _input(mtu: int, queued, messages) -> bytes:
    """queued: (length, peer) per datagram of one send; messages: (length,
    segment size) per received message."""
    return struct.pack("!HB", mtu, len(queued)) + \
        b"".join(struct.pack("!HB", n, peer) for n, peer in queued) + \
        b"".join(struct.pack("!I", n)[1:] + struct.pack("!HH", seg, 0) for n, seg in messages)


def _seeds() -> dict[str, bytes]:
    return {
        "one-flow": _input(1472, [(1400, 1)] * 40 + [(700, 1)],
                           [(45000, 1400), (1400, 1400), (0, 0)]),
        "byte-limit": _input(1472, [(1472, 2)] * 200, [(65507, 1472)]),
        "mixed": _input(1400, [(1000, 1), (1000, 2), (1000, 2), (900, 2), (1000, 2), (50, 3)],
                        [(3001, 1000), (999, 1000), (5000, 0)]),
        "over-slot": _input(1000, [], [(0x30000, 1500), (70000, 0), (131072, 65535)]),
    }


@pytest.fixture(scope="module")
def fuzz_train(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz_train")
    exe, seeds = seeded_fuzzer(out, "fuzz_train", _seeds())
    return exe, out, seeds


def test_seeds_replay_clean(fuzz_train):
    exe, _, seeds = fuzz_train
    replay(exe, sorted(seeds.iterdir()))


def test_bounded_fuzz_run(fuzz_train):
    exe, out, seeds = fuzz_train
    execs = executed(fuzz_bounded(exe, out, [seeds], FUZZ_CAP_S, FUZZ_RUNS, 4096))
    assert execs >= FUZZ_RUNS, f"only {execs} of {FUZZ_RUNS} inputs ran within {FUZZ_CAP_S} s"
