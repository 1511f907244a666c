"""csrc/gso.c under libFuzzer with ASan + UBSan (csrc/fuzz/fuzz_gso.c).

Arbitrary virtio_net_hdr + packet bytes, as a TUN with IFF_VNET_HDR hands
them over; the target aborts when a segment is not a valid IPv4 (IPv6)
packet <= mtu of the super-packet's family with valid checksums, the segments do not carry the payload, or a
read does not land where tx.c expects it (dp_gso_scatter, dp_gso_read; its
header lists the checks). Seeds are built here from tests/gso_packets.py.
"""
from __future__ import annotations

import struct

import pytest

from tests import gso_packets as gp
from tests.cbuild import executed, fuzz_bounded, replay, seeded_fuzzer

# A smoke run on every `make test`: from these seeds the coverage stops growing within a few
# seconds (4 s reach what 8 s did), at executions far above the floor asserted below.
FUZZ_SECONDS = 4


def _seeds() -> dict[str, bytes]:
    src, dst = "10.5.1.9", "10.5.2.7"
    data = bytes(range(256)) * 20
    tso = gp.tcp(src, dst, data[:4000], flags=gp.ACK | gp.PSH | gp.FIN | gp.CWR,
                 options=b"\x01\x01\x08\x0a" + bytes(8))
    uso = gp.udp(src, dst, data[:3001])
    src6, dst6 = "fc00:5:0:1::9", "fc00:5:0:2::7"
    tso6 = gp.tcp6(src6, dst6, data[:4000], flags=gp.ACK | gp.PSH | gp.FIN | gp.CWR,
                   options=b"\x01\x01\x08\x0a" + bytes(8), flow_label=0x12345)
    uso6 = gp.udp6(src6, dst6, data[:3001])
    mtu = struct.pack("!H", 1472)
    return {
        "tso6": mtu + gp.vnet_hdr(gp.GSO_TCPV6, 1400, csum_start=40, csum_offset=16) + tso6,
        "uso6": mtu + gp.vnet_hdr(gp.GSO_UDP_L4, 1000, csum_start=40, csum_offset=6) + uso6,
        "csum6": mtu + gp.vnet_hdr(csum_start=40, csum_offset=16) + gp.partial_checksum(
            tso6[:500]),
        "tso": mtu + gp.vnet_hdr(gp.GSO_TCPV4, 1400, csum_start=20, csum_offset=16) + tso,
        "tso-tiny": mtu + gp.vnet_hdr(gp.GSO_TCPV4, 7) + tso[:300],
        "uso": mtu + gp.vnet_hdr(gp.GSO_UDP_L4, 1000, csum_offset=6) + uso,
        "csum": mtu + gp.vnet_hdr(csum_offset=16) + gp.partial_checksum(tso[:500]),
        "bare": mtu + gp.vnet_hdr(gp.GSO_TCPV4, 100) + gp.tcp(src, dst, b""),
        "short": mtu + bytes(5),                      # a read shorter than the header
    }


@pytest.fixture(scope="module")
def fuzz_gso(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz_gso")
    exe, seeds = seeded_fuzzer(out, "fuzz_gso", _seeds())
    return exe, out, seeds


def test_seeds_replay_clean(fuzz_gso):
    exe, _, seeds = fuzz_gso
    replay(exe, sorted(seeds.iterdir()))


def test_bounded_fuzz_run(fuzz_gso):
    exe, out, seeds = fuzz_gso
    execs = executed(fuzz_bounded(exe, out, [seeds], FUZZ_SECONDS, 2_000_000, 70000))
    print(f"fuzz_gso: {execs} execs in <= {FUZZ_SECONDS} s")
    assert execs >= 1000, "the fuzzer barely ran"
