"""The programs' sum over a whole packet (csrc/bpf/csum.h fu_bytes_sum) at every length that
crosses one of its boundaries, through BPF_PROG_TEST_RUN.

A test run's packet is CHECKSUM_NONE, as from a NIC without receive checksum offload, so
both programs sum every byte: the ingress program to check a datagram's UDP checksum, the
egress program to write one. The sum reads the packet's linear data in place, 512 bytes a
call and the rest in pieces of 256 down to 4 bytes and a last 1-3; bytes beyond the linear
data are copied out 128 at a time. Every length from a bare header to the MTU that starts or
ends one of those pieces (and the odd lengths beside them) is checked against the engine:
a right checksum is taken and the packet decapsulated as the engine writes it, a byte flipped
at the end or in the middle is dropped (rx_drop_checksum), and the egress program's outer
checksum is the one the engines' kernel computes. A test run's packet is always linear, so the
copy path is checked on the same packets by an object compiled with FU_SUM_COPY_ONLY, which
copies every byte out.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from dataplane.engine import bpf_contract as bc
from dataplane.engine import ipv4, ipv6
from tests.conftest import require_bpf
from tests.unit.test_bpf_programs import (MTU, OWN_IP, OWN_IP6, PEER, PEER6, REDIRECT, SHOT,
                                          datagram, egress_label, engine_tun, engine_udp,
                                          frame, loaded, outer, run)

# the lengths summed (the inner packet: a datagram's UDP payload) around each piece's edge
EDGES = sorted({n + d for n in (32, 64, 128, 256, 512, 768, 1024, 1280) for d in (-1, 0, 1, 3)}
               | {28, 29, 30, 31, 48, 49, 51, 1400, 1451, 1452, MTU - 1, MTU})


def _copy_only(directory) -> str:
    """The programs compiled as bpf_build.py compiles them, with FU_SUM_COPY_ONLY."""
    from dataplane.engine import bpf_build
    out = os.path.join(directory, "flannel-copy-only.bpf.o")
    src = os.path.join(bc.source_dir(), bc.PROGRAM_SOURCE)
    r = subprocess.run([bpf_build.clang(), *bpf_build._flags(), "-DFU_SUM_COPY_ONLY", "-c", src,
                        "-o", out], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module", params=["in-place", "copy-only"])
def kp(request, tmp_path_factory):
    require_bpf()
    obj = None if request.param == "in-place" else _copy_only(tmp_path_factory.mktemp("bpf"))
    k = loaded(obj)
    yield k
    k.close()


def inner4(length: int, src="10.5.2.3", dst="10.5.1.2") -> bytes:
    data = bytes((i * 7 + 1) & 0xFF for i in range(length - 28))
    return ipv4.build(src, dst, ipv4.udp_payload(4000, 5000, data))


def inner6(length: int, src="fd00:5:4::3", dst="fd00:5:1::2") -> bytes:
    data = bytes((i * 7 + 1) & 0xFF for i in range(length - 48))
    return ipv6.build(src, dst, ipv6.udp_payload(src, dst, 4000, 5000, data))


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1:]


@pytest.mark.parametrize("length", EDGES)
def test_ingress_sums_every_length(kp, length):
    cases = [(inner4(length), PEER)] + ([(inner6(length), PEER6)] if length >= 48 else [])
    for pkt, sender in cases:
        want, reason = engine_udp(pkt, sender)
        assert reason is None and want is not None
        data = datagram(pkt, src=sender)
        verdict, out, moved = run(kp, bc.PROG_INGRESS, data)
        assert (verdict, out[14:], moved) == (REDIRECT, want, {"tun_tx_packets": 1,
                                                               "tun_tx_bytes": len(pkt)}), length
        # the last byte (the last 1-3, or a piece's end) and one in the first piece
        for at in (len(data) - 1, len(data) - len(pkt) + len(pkt) // 2):
            verdict, _, moved = run(kp, bc.PROG_INGRESS, flipped(data, at))
            assert (verdict, moved) == (SHOT, {"rx_drop_checksum": 1}), (length, at)


@pytest.mark.parametrize("length", EDGES)
def test_egress_sums_every_length(kp, length):
    pkts = [ipv4.build("10.5.1.2", "10.5.2.3", bytes((i * 5 + 3) & 0xFF
                                                      for i in range(length - 20)))]
    if 48 <= length <= MTU + 28 - 48:
        pkts.append(inner6(length, src="fd00:5:1::2", dst="fd00:5:4::3"))
    for pkt in pkts:
        hop, inner, _ = engine_tun(pkt)
        verdict, out, moved = run(kp, bc.PROG_EGRESS, frame(pkt))
        assert (verdict, moved) == (REDIRECT, {"udp_tx_packets": 1, "udp_tx_bytes": len(pkt)})
        if hop[0] == PEER6:
            want = outer(inner, src=OWN_IP6, dst=PEER6, label=egress_label(out))
        else:
            want = outer(inner, src=OWN_IP, dst=PEER)
        assert out[14:] == want, length
