"""A pytest plugin for the tests run under QEMU user-mode emulation (tests/arch/run.sh loads it
with ``-p tests.arch.emulated``; nothing else does, so CI never sees it).

The tests below meet a limit of the emulator, not of flannel-udp: each is marked as an expected
failure there, with the reason and, where it is known, the exception it ends with, so that any
other failure still fails. ``strict``: a test that passes after all (a newer QEMU) fails the
run, so the list is kept true. The plugin refuses to load unless FLANNEL_UDP_EMULATED, which the
recipe sets, names the emulator of this very machine's architecture.
"""
from __future__ import annotations

import os
import platform

import pytest

CBPF = ("QEMU's user-mode emulation does not emulate setsockopt(SO_ATTACH_REUSEPORT_CBPF) and "
        "answers ENOPROTOOPT: no reuseport group of several sockets can be steered (the daemon "
        "falls back to one queue, dataplane/host/udpsock.py; these tests exercise the steering)")

CMSG = ("QEMU passes the UDP_SEGMENT and UDP_GRO control messages (a segment size in host order) "
        "between this big-endian guest and the little-endian kernel without swapping their bytes: "
        "the kernel cuts or reports other sizes than were asked (a train of 3000 bytes sent with "
        "segments of 1000 leaves as one datagram; segments of 768 are EINVAL)")
ASAN = ("AddressSanitizer on s390x reserves its shadow memory high in a 53-bit address space "
        "(0x2000000001000 bytes at 0xffffffffff000), which QEMU cannot map for its guest in an "
        "x86_64 process's 47 bits: every sanitized program aborts at start (ENOMEM)")

# (node id prefix, the reason, the exception the test ends with), per platform.machine();
# "*" for every emulated architecture.
EXPECTED: dict[str, list[tuple[str, str, type[BaseException] | None]]] = {
    "*": [
        ("tests/unit/test_engine_multi.py::test_routes_reach_every_queue", CBPF, OSError),
        ("tests/unit/test_engine_multi.py::test_flows_from_one_peer_spread", CBPF, OSError),
        ("tests/unit/test_engine_multi.py::test_ipv6_flows_spread", CBPF, OSError),
        ("tests/unit/test_engine_multi.py::test_each_queue_sends_on_its_own_ipv6_socket", CBPF,
         OSError),
        ("tests/unit/test_engine_multi.py::test_own_sources_and_strict", CBPF, OSError),
        ("tests/unit/test_engine_multi.py::test_icmp_limit_is_split", CBPF, OSError),
        ("tests/unit/test_engine_multi.py::test_trace_is_queue_zero", CBPF, OSError),
        ("tests/unit/test_engine_multi.py::test_offloads_go_to_every_queue", CBPF, OSError),
        ("tests/unit/test_engine_multi.py::test_stop_and_close_are_idempotent", CBPF, OSError),
        ("tests/unit/test_engine_multi.py::test_on_end_hears_each_loop_end", CBPF, OSError),
        ("tests/unit/test_queue_fallback.py::test_this_kernel_steers", CBPF, AssertionError),
        # the kernel's EINVAL for a bad program: the emulator answers ENOPROTOOPT before
        ("tests/unit/test_queue_fallback.py::test_a_rejected_program_", CBPF,
         pytest.fail.Exception),
    ],
    "s390x": [
        # trains sent by the test's peer socket (both engines) or by the C engine
        ("tests/unit/test_engine_inner_source.py::test_each_datagram_of_a_train_is_judged_alone",
         CMSG, AssertionError),
        ("tests/unit/test_engine_udp_gro.py::test_train_is_split_into_its_datagrams", CMSG,
         AssertionError),
        ("tests/unit/test_engine_udp_gro.py::test_train_of_tcp_segments_becomes_one_gso_write",
         CMSG, AssertionError),
        ("tests/unit/test_engine_udp_gro.py::test_gro_counts_like_plain_receives", CMSG,
         AssertionError),
        ("tests/unit/test_engine_udp_gro.py::test_bad_source_in_a_train", CMSG, AssertionError),
        ("tests/unit/test_engine_offload_tx.py::test_tiny_gso_size_yields_hundreds_of_segments",
         CMSG, AssertionError),
        ("tests/unit/test_engine_offload_tx.py::test_udp_gso_trains_keep_every_datagram", CMSG,
         AssertionError),
        ("tests/unit/test_engine_offload_tx.py::test_udp_gso_train_limits", CMSG, AssertionError),
        # the C programs built with ASan (tests/cbuild.py): the fuzzers and the train table
        ("tests/unit/test_train_table.py::test_table", ASAN, AssertionError),
        ("tests/unit/test_fuzz_routes6.py::test_table", ASAN, AssertionError),
        ("tests/unit/test_fuzz_routes6.py::test_random_tables", ASAN, AssertionError),
        ("tests/unit/test_fuzz_c.py::test_corpus_replays_clean", ASAN, AssertionError),
        ("tests/unit/test_fuzz_gso.py::test_seeds_replay_clean", ASAN, AssertionError),
        ("tests/unit/test_fuzz_train.py::test_seeds_replay_clean", ASAN, AssertionError),
    ],
}


SPEED = ("a bounded fuzz run asserts a minimum of inputs run within its time bound, a speed "
         "emulation does not keep (fuzz_train ran 262 of 1000 in 8 s on arm64); the fuzzers' "
         "corpora and seeds are replayed under the sanitizers all the same")

TIMING = ("whether a pass is followed by a coalescing wait depends on passes ending within a window "
          "of DENSE_WAITS x COALESCE_MAX_US (milliseconds): an emulated pass takes longer than that "
          "when the emulator is loaded (s390x beside a full suite: 0 waits of 12), so the outcome "
          "measures the emulator's speed; the other coalescing tests run")

# Not run at all under emulation: (node id prefix, the reason). An expected failure would hide
# a crash the run found behind the speed check (both are AssertionError).
DESELECTED: dict[str, list[tuple[str, str]]] = {
    "*": [
        ("tests/unit/test_fuzz_c.py::test_bounded_fuzz_run", SPEED),
        ("tests/unit/test_fuzz_gso.py::test_bounded_fuzz_run", SPEED),
        ("tests/unit/test_fuzz_train.py::test_bounded_fuzz_run", SPEED),
        ("tests/unit/test_engine_coalesce.py::test_work_is_dense_within_dense_waits_waits_of_the_last",
         TIMING),
    ],
}


def _machine_of(emulator: str) -> str:
    return {"qemu-aarch64": "aarch64", "qemu-s390x": "s390x"}.get(emulator, "")


def pytest_configure(config):
    emulator = os.environ.get("FLANNEL_UDP_EMULATED", "")
    if not emulator or _machine_of(emulator) != platform.machine():
        raise pytest.UsageError(
            f"tests.arch.emulated marks tests as failing under emulation: it loads only under "
            f"QEMU user mode (FLANNEL_UDP_EMULATED={emulator!r}, machine {platform.machine()}); "
            "tests/arch/run.sh sets it")
    config._emulated = emulator


def pytest_report_header(config):
    rules = EXPECTED.get("*", []) + EXPECTED.get(platform.machine(), [])
    return [f"under {config._emulated}: {len(rules)} test(s) marked as failing by the emulator "
            "(tests/arch/emulated.py)"]


def pytest_collection_modifyitems(config, items):
    leave_out = DESELECTED.get("*", []) + DESELECTED.get(platform.machine(), [])
    kept, config._left_out = [], []
    for item in items:
        why = next((reason for prefix, reason in leave_out if item.nodeid.startswith(prefix)),
                   None)
        if why is None:
            kept.append(item)
        else:
            config._left_out.append((item, why))
    if config._left_out:
        config.hook.pytest_deselected(items=[item for item, _ in config._left_out])
        items[:] = kept
    rules = EXPECTED.get("*", []) + EXPECTED.get(platform.machine(), [])
    for item in items:
        for prefix, reason, raises in rules:
            if item.nodeid.startswith(prefix):
                item.add_marker(pytest.mark.xfail(reason=f"{config._emulated}: {reason}",
                                                  raises=raises, strict=True))
                break


def pytest_terminal_summary(terminalreporter, config):
    for item, why in getattr(config, "_left_out", []):
        terminalreporter.write_line(f"DESELECTED under {config._emulated}: {item.nodeid} - {why}")
