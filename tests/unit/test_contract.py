"""dataplane/engine/contract.py is csrc/dataplane.h, fact for fact.

The header is the source: these tests read its text (no compiler needed, so
they hold for the Python engine alone) and, where the C engine is built,
hold the cffi library to the same values.
"""
from __future__ import annotations

import os
import re

from dataplane.engine import api, contract
from tests.conftest import require_engine

HEADER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "csrc", "dataplane.h")


def _header() -> str:
    with open(HEADER) as f:
        return f.read()


def _code(text: str) -> str:
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def header_enum(name: str) -> dict[str, int]:
    """enum <name> { A = 1, B, ... } as {"A": 1, "B": 2, ...}."""
    body = re.search(r"enum\s+%s\s*\{(.*?)\}" % name, _code(_header()), re.S).group(1)
    out, nxt = {}, 0
    for item in filter(None, (i.strip() for i in body.split(","))):
        key, _, value = (p.strip() for p in item.partition("="))
        nxt = int(value, 0) if value else nxt
        out[key] = nxt
        nxt += 1
    return out


def header_stats() -> list[tuple[str, str]]:
    """The dp_stats fields in order, each with its comment ("" if none)."""
    body = re.search(r"typedef struct dp_stats \{(.*?)\} dp_stats;", _header(), re.S).group(1)
    return re.findall(r"uint64_t (\w+)(?:\[\d+\])?;[ \t]*(?:/\*(.*?)\*/)?", body)


def test_limits_and_offload_bits():
    want = {**header_enum("dp_limits"), **header_enum("dp_offload")}
    assert contract.HEADER_CONSTANTS == want
    assert (api.MTU_MIN, api.MTU_MAX, api.BATCH_MAX) == (want["DP_MTU_MIN"], want["DP_MTU_MAX"],
                                                         want["DP_BATCH_MAX"])
    assert api.ICMP_RATE_DEFAULT == want["DP_ICMP_RATE_DEFAULT"]
    assert api.ICMP_BURST_DEFAULT == want["DP_ICMP_BURST_DEFAULT"]
    assert api.OFF_TUN_GRO_UDP == want["DP_OFF_TUN_GRO_UDP"]


def test_stat_names_are_the_dp_stats_fields():
    fields = header_stats()
    assert fields[-1][0] == "reserved"
    assert api.STAT_NAMES == tuple(name for name, _ in fields[:-1])
    reserved = int(re.search(r"reserved\[(\d+)\]", _header()).group(1))
    assert len(api.STAT_NAMES) + reserved == 64          # the block's fixed size


def test_offload_stats_are_the_counters_of_an_offload():
    assert api.OFFLOAD_STATS == {name for name, note in header_stats() if "DP_OFF_" in note}
    assert api.OFFLOAD_STATS == {"tun_rx_gso", "udp_tx_gso", "udp_rx_gro", "tun_tx_gso",
                                 "udp_gso_fallbacks"}


def test_trace_kinds():
    assert api.TRACE_KINDS == {v: k[len("DP_TR_"):].lower()
                               for k, v in header_enum("dp_trace_kind").items()}


def test_end_kinds():
    assert api.END_KINDS == {v: k[len("DP_END_"):].lower()
                             for k, v in header_enum("dp_loop_end").items()}


def header_state() -> list[str]:
    body = re.search(r"typedef struct dp_state \{(.*?)\} dp_state;", _header(), re.S).group(1)
    return re.findall(r"uint32_t (\w+)(?:\[\d+\])?;", body)


def test_the_built_library_agrees():
    require_engine("c")
    from dataplane._dataplane_c import ffi, lib
    from dataplane.engine import native
    for name, value in {**header_enum("dp_limits"), **header_enum("dp_offload"),
                        **header_enum("dp_trace_kind"), **header_enum("dp_loop_end")}.items():
        assert getattr(lib, name) == value, name
    assert [n for n, _ in ffi.typeof("dp_stats").fields] == [n for n, _ in header_stats()]
    assert ffi.sizeof("dp_stats") == 64 * 8
    assert (native.STAT_NAMES, native.TRACE_KINDS) == (api.STAT_NAMES, api.TRACE_KINDS)
    assert ffi.sizeof("dp_route") == 16
    assert [n for n, _ in ffi.typeof("dp_state").fields] == header_state()
    assert native.END_KINDS == api.END_KINDS
    assert [n for n, _ in ffi.typeof("dp_trace_event").fields] == [
        "seq", "ts_ns", "kind", "len", "addr", "port", "batch", "head_len", "head"]
    assert ffi.sizeof(ffi.typeof("dp_trace_event").fields[-1][1].type) == lib.DP_TRACE_HEAD
