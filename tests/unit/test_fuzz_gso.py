"""csrc/gso.c under libFuzzer with ASan + UBSan (csrc/fuzz/fuzz_gso.c).

Arbitrary virtio_net_hdr + packet bytes, as a TUN with IFF_VNET_HDR hands
them over; the target aborts when a segment is not a valid IPv4 packet
<= mtu with valid checksums or the segments do not carry the payload (its
header lists the checks). Seeds are built here from tests/gso_packets.py.
A missing clang or libFuzzer runtime skips locally and fails under CI.
"""
from __future__ import annotations

import re
import struct
import subprocess

import pytest

from tests import gso_packets as gp
from tests.unit.test_fuzz_c import build_fuzzer

FUZZ_SECONDS = 8


def _seeds() -> dict[str, bytes]:
    src, dst = "10.5.1.9", "10.5.2.7"
    data = bytes(range(256)) * 20
    tso = gp.tcp(src, dst, data[:4000], flags=gp.ACK | gp.PSH | gp.FIN | gp.CWR,
                 options=b"\x01\x01\x08\x0a" + bytes(8))
    uso = gp.udp(src, dst, data[:3001])
    mtu = struct.pack("!H", 1472)
    return {
        "tso": mtu + gp.vnet_hdr(gp.GSO_TCPV4, 1400, csum_start=20, csum_offset=16) + tso,
        "tso-tiny": mtu + gp.vnet_hdr(gp.GSO_TCPV4, 7) + tso[:300],
        "uso": mtu + gp.vnet_hdr(gp.GSO_UDP_L4, 1000, csum_offset=6) + uso,
        "csum": mtu + gp.vnet_hdr(csum_offset=16) + gp.partial_checksum(tso[:500]),
        "bare": mtu + gp.vnet_hdr(gp.GSO_TCPV4, 100) + gp.tcp(src, dst, b""),
    }


@pytest.fixture(scope="module")
def fuzz_gso(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz_gso")
    exe = build_fuzzer(out, "fuzz_gso", ("gso.c", "packet.c"))
    seeds = out / "seeds"
    seeds.mkdir()
    for name, data in _seeds().items():
        (seeds / name).write_bytes(data)
    return exe, out, seeds


def test_seeds_replay_clean(fuzz_gso):
    exe, _, seeds = fuzz_gso
    files = sorted(str(p) for p in seeds.iterdir())
    r = subprocess.run([str(exe), *files], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]


def test_bounded_fuzz_run(fuzz_gso):
    exe, out, seeds = fuzz_gso
    work = out / "work"
    work.mkdir(exist_ok=True)
    r = subprocess.run([str(exe), f"-max_total_time={FUZZ_SECONDS}", "-runs=2000000",
                        "-max_len=70000", "-rss_limit_mb=1024", "-print_final_stats=1",
                        f"-artifact_prefix={out}/", str(work), str(seeds)],
                       capture_output=True, text=True, timeout=FUZZ_SECONDS + 60)
    crashes = [p.name for p in out.iterdir() if p.name.startswith(("crash-", "leak-", "oom-",
                                                                   "timeout-"))]
    assert r.returncode == 0 and not crashes, f"fuzz_gso found {crashes} in {out}:\n" \
                                              f"{r.stderr[-4000:]}"
    execs = int(re.search(r"stat::number_of_executed_units:\s+(\d+)", r.stderr).group(1))
    print(f"fuzz_gso: {execs} execs in <= {FUZZ_SECONDS} s")
    assert execs >= 1000, "the fuzzer barely ran"
