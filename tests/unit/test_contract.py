"""dataplane/engine/contract.py reads csrc/dataplane.h, fact for fact.

The header is the one source: contract.py parses it at import. These tests
hold the parser to the C forms it must read (and refuse), every item of the
header's enums to a name in contract.py, and, where the C engine is built,
the cffi library to the same header. The header that an installed package
reads is checked in test_packaging.py.
"""
from __future__ import annotations

import os
import re

import pytest

from dataplane.engine import api, contract
from dataplane.engine.contract import HeaderError, parse_enum, parse_struct
from tests.conftest import require_engine

HEADER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "csrc", "dataplane.h")


def _header() -> str:
    with open(HEADER) as f:
        return f.read()


# ---- the parser ---------------------------------------------------------------------------

SAMPLE = """
enum other { X = 7 };
/* enum lookalike { NOT = 1 }; is a comment */
enum sample {
    A = 1,            /* a comment, with = and , inside */
    B,                /* one more than the last */
    C = 0x10,
    D
};
typedef struct sample_s {
    uint64_t first;   /* a note */
    uint32_t second;
    /* uint32_t hidden; a declaration inside a comment */
    uint8_t head[DP_TRACE_HEAD];  /* a note that goes on
                                     over two lines */
    uint64_t reserved[3];
} sample_s;
"""


def test_the_parser_reads_enums_and_structs():
    assert parse_enum(SAMPLE, "sample") == {"A": 1, "B": 2, "C": 16, "D": 17}
    assert parse_enum(SAMPLE, "other") == {"X": 7}
    assert parse_struct(SAMPLE, "sample_s") == [
        ("first", "a note"), ("second", ""),
        ("head", "a note that goes on over two lines"), ("reserved", "")]


@pytest.mark.parametrize("text,what", [
    ("enum e { A = 1 << 2 };", "enum"),          # an expression
    ("enum e { A = B };", "enum"),               # another item's name
    ("enum f { A = 1 };", "enum"),               # no enum e at all
    ("typedef struct e { uint32_t a, b; } e;", "struct"),
    ("typedef struct e { uint32_t (*fn)(void); } e;", "struct"),
    ("typedef struct f { uint32_t a; } f;", "struct"),
])
def test_the_parser_refuses_what_it_cannot_read(text, what):
    with pytest.raises(HeaderError):
        (parse_enum if what == "enum" else parse_struct)(text, "e")


# ---- every fact of the header has its name in contract.py -----------------------------------

def test_every_limit_and_offload_bit_has_its_name():
    items = {**parse_enum(_header(), "dp_limits"), **parse_enum(_header(), "dp_offload")}
    assert {"DP_ROUNDS", "DP_DENSE_WAITS", "DP_ICMP_TTL", "DP_VNET_HDR_LEN"} <= set(items)
    assert {k: getattr(contract, k[len("DP_"):], None) for k in items} == items
    assert contract.HEADER_CONSTANTS == items
    assert (api.MTU_MIN, api.MTU_MAX, api.BATCH_MAX) == (items["DP_MTU_MIN"], items["DP_MTU_MAX"],
                                                         items["DP_BATCH_MAX"])
    assert api.ICMP_RATE_DEFAULT == items["DP_ICMP_RATE_DEFAULT"]
    assert api.ICMP_BURST_DEFAULT == items["DP_ICMP_BURST_DEFAULT"]
    assert api.OFF_TUN_GRO_UDP == items["DP_OFF_TUN_GRO_UDP"]


def test_every_trace_kind_has_its_name():
    kinds = parse_enum(_header(), "dp_trace_kind")
    assert {k: getattr(contract, k[len("DP_"):], None) for k in kinds} == kinds
    assert api.TRACE_KINDS == {v: k[len("DP_TR_"):].lower() for k, v in kinds.items()}


def test_end_kinds():
    assert api.END_KINDS == {v: k[len("DP_END_"):].lower()
                             for k, v in parse_enum(_header(), "dp_loop_end").items()}


def test_stat_names_are_the_dp_stats_fields():
    fields = parse_struct(_header(), "dp_stats")
    assert fields[-1][0] == "reserved"
    assert api.STAT_NAMES == tuple(name for name, _ in fields[:-1])
    stats = re.search(r"typedef struct dp_stats \{.*?\} dp_stats;", _header(), re.S).group(0)
    reserved = int(re.search(r"reserved\[(\d+)\]", stats).group(1))
    assert len(api.STAT_NAMES) + reserved == 64          # the block's fixed size


def test_ipv6_shares_are_the_v6_fields_of_the_counters_that_have_one():
    """The header's "Counters by family": each v6_<counter> is the share of a counter before
    it, never a drop_* (api.DROP_STATS are the reasons), and the shares are the packet and byte
    counters, the ICMP errors of both families and the drop reasons an IPv6 packet meets."""
    shares = [n for n in api.STAT_NAMES if n.startswith("v6_")]
    assert contract.V6_SHARES == {n[3:]: n for n in shares}
    assert all(api.STAT_NAMES.index(t) < api.STAT_NAMES.index(s)
               for t, s in contract.V6_SHARES.items())
    assert not set(shares) & set(api.DROP_STATS)
    assert set(contract.V6_SHARES) == {
        f"{path}_{unit}" for path in ("tun_rx", "udp_tx", "udp_rx", "tun_tx")
        for unit in ("packets", "bytes")} | {"icmp_unreach_sent", "icmp_ttl_sent"} | (
        set(api.DROP_STATS) - {"drop_not_ipv4", "drop_truncated", "drop_scope", "drop_too_big"})
    # a share of no counter is refused rather than served as the share of nothing
    with pytest.raises(HeaderError, match="v6_polls_x"):
        contract.v6_shares(api.STAT_NAMES + ("v6_polls_x",))


def test_offload_stats_are_the_counters_of_an_offload():
    assert api.OFFLOAD_STATS == {name for name, note in parse_struct(_header(), "dp_stats")
                                 if "DP_OFF_" in note}
    assert api.OFFLOAD_STATS == {"tun_rx_gso", "udp_tx_gso", "udp_rx_gro", "tun_tx_gso",
                                 "udp_gso_fallbacks"}


def test_a_checkout_reads_its_own_header():
    assert os.path.samefile(contract.HEADER, HEADER)


# ---- the built library --------------------------------------------------------------------

def test_the_built_library_agrees():
    require_engine("c")
    from dataplane._dataplane_c import ffi, lib
    from dataplane.engine import native
    text = _header()
    for name, value in {**parse_enum(text, "dp_limits"), **parse_enum(text, "dp_offload"),
                        **parse_enum(text, "dp_trace_kind"),
                        **parse_enum(text, "dp_loop_end")}.items():
        assert getattr(lib, name) == value, name
    assert [n for n, _ in ffi.typeof("dp_stats").fields] == [n for n, _ in parse_struct(text,
                                                                                         "dp_stats")]
    assert ffi.sizeof("dp_stats") == 64 * 8
    assert (native.STAT_NAMES, native.TRACE_KINDS) == (api.STAT_NAMES, api.TRACE_KINDS)
    assert ffi.sizeof("dp_route") == 16
    assert ffi.sizeof("dp_route6") == 48
    assert [n for n, _ in ffi.typeof("dp_state").fields] == [n for n, _ in parse_struct(text,
                                                                                         "dp_state")]
    assert native.END_KINDS == api.END_KINDS
    assert [n for n, _ in ffi.typeof("dp_trace_event").fields] == [
        n for n, _ in parse_struct(text, "dp_trace_event")]
    assert ffi.sizeof(ffi.typeof("dp_trace_event").fields[-1][1].type) == lib.DP_TRACE_HEAD
