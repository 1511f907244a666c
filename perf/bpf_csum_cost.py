"""What the ingress program's UDP checksum costs per datagram, by BPF_PROG_TEST_RUN.

    python perf/bpf_csum_cost.py                       # 64 and 1400 byte datagrams, 5 rounds
    python perf/bpf_csum_cost.py --sizes 64,512,1400 --repeat 1000000 --rounds 3

A test run's skb is CHECKSUM_NONE, as a datagram from a NIC without receive checksum offload:
the ingress program sums every byte of it (csrc/bpf/csum.h, fu_bytes_sum). Each size is run
three ways, each `--repeat` times in the kernel (its own average per run, ns): from a sender
that holds no lease with the checksum right (summed, then dropped at step 2: the packet is not
changed, so the kernel repeats the same work), the same with the checksum wrong (summed,
dropped as rx_drop_checksum), and with the checksum 0 (IPv4's "none": not summed, dropped at
step 2). The first less the last is the sum's cost. A datagram the program decapsulates cannot
be timed this way: the kernel repeats the program on the packet it changed. As root; the
object is the one bpf_build.py compiles from csrc/bpf/ (docs/kernel-path.md, "pmtu-cost").
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataplane.engine import bpf_contract as bc, ipv4  # noqa: E402
from dataplane.engine.api import Route  # noqa: E402
from dataplane.engine.bpf_lib import check, ffi, lib, sized  # noqa: E402
from dataplane.engine.bpf_path import KernelPath  # noqa: E402

OWN, PEER, STRANGER, PORT, MTU = "192.168.77.1", "192.168.77.2", "192.168.77.9", 8285, 1472


def datagram(size: int, check_field: int | None) -> bytes:
    """An Ethernet frame: a UDP datagram of ``size`` bytes of payload (an inner IPv4 UDP
    packet) from STRANGER to own address and port; its checksum right, or ``check_field``."""
    inner = ipv4.build("10.5.2.3", "10.5.1.2", ipv4.udp_payload(4000, 5000,
                                                                bytes(range(256)) * 8)[:size - 20])
    seg = struct.pack("!HHHH", PORT, PORT, 8 + len(inner), 0) + inner
    if check_field is None:
        pseudo = ipaddress.IPv4Address(STRANGER).packed + ipaddress.IPv4Address(OWN).packed + \
            struct.pack("!BBH", 0, 17, len(seg))
        check_field = ipv4.checksum(pseudo + seg) or 0xFFFF
    udp = struct.pack("!HHHH", PORT, PORT, 8 + len(inner), check_field) + inner
    return bytes(range(1, 13)) + b"\x08\x00" + ipv4.build(STRANGER, OWN, udp, flags=2)


def per_run_ns(kp: KernelPath, data: bytes, repeat: int) -> tuple[int, int]:
    """(verdict, the kernel's average ns per run) of ``repeat`` runs of fu_ingress on ``data``."""
    opts = sized("struct bpf_test_run_opts")
    inp = ffi.from_buffer(data)
    out = ffi.new("char[]", len(data) + 4096)
    opts.data_in, opts.data_size_in = inp, len(data)
    opts.data_out, opts.data_size_out = out, len(out)
    opts.repeat = repeat
    check(lib().bpf_prog_test_run_opts(kp.prog_fd[bc.PROG_INGRESS], opts), "test run")
    return opts.retval, opts.duration


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64,1400", help="UDP payload bytes (default 64,1400)")
    ap.add_argument("--repeat", type=int, default=1_000_000, help="runs per measurement")
    ap.add_argument("--rounds", type=int, default=5, help="measurements per case (default 5)")
    ap.add_argument("--obj", help="a compiled object to time (default: bpf_build.py's)")
    args = ap.parse_args()
    with KernelPath(args.obj) as kp:
        kp.set_devices(41, 42, tun_l2=True, ext_l2=True)
        kp.configure(own_ip=OWN, port=PORT, mtu=MTU, own_subnets=["10.5.1.0/24"], strict=True)
        kp.set_routes([Route.make("10.5.2.0/24", PEER, PORT)])
        print(f"{'payload':>8} {'case':<16} ns per run (rounds of {args.repeat:,})")
        for size in (int(s) for s in args.sizes.split(",")):
            med = {}
            for case, field in (("checksum right", None), ("checksum wrong", 0x1234),
                                ("checksum 0", 0)):
                data = datagram(size, field)
                ns = []
                for _ in range(args.rounds):
                    before = kp.counters()
                    verdict, t = per_run_ns(kp, data, args.repeat)
                    moved = {k: v - before[k] for k, v in kp.counters().items() if v != before[k]}
                    ns.append(t)
                want = "rx_drop_checksum" if field == 0x1234 else "drop_bad_source"
                assert verdict == 2 and set(moved) == {want}, (case, verdict, moved)
                med[case] = sorted(ns)[len(ns) // 2]
                print(f"{size:>8} {case:<16} {' '.join(map(str, ns))}  (median {med[case]})")
            print(f"{size:>8} {'the sum':<16} {med['checksum right'] - med['checksum 0']} ns "
                  "(median right less median 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
