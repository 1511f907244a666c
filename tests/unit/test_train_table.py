"""The buffer arithmetic of trains and vnet reads, case by case.

csrc/fuzz/table_train.c answers one case per line (train.c's plan, cut and
slot size, gso.c's dp_gso_read); each row below is a worked example of a
rule in csrc/dataplane.h ("Offloads"), with the answer written out by hand.
The fuzzers (test_fuzz_train.py, test_fuzz_gso.py) check the same
functions against invariants over arbitrary input.
"""
from __future__ import annotations

import subprocess

import pytest

from dataplane.engine.api import OFF_UDP_GRO, OFF_UDP_GSO, OFF_TUN_VNET, STAT_NAMES, TRACE_HEAD
from tests.cbuild import build_c

MALFORMED = STAT_NAMES.index("drop_malformed")
GRO_SLOT = 65536                       # a whole UDP_GRO train: 65535 - 8 bytes fit


def _q(*pairs) -> str:
    return "plan " + " ".join(f"{n}/{peer}" for n, peer in pairs)


PLAN = [
    # (queued datagrams: length/peer, the trains: first+count)
    (_q((1000, 1), (1000, 1), (500, 1), (1000, 1)), "0+3 3+1"),      # a shorter one ends it
    (_q((100, 1), (100, 2), (100, 2)), "0+1 1+2"),                   # another peer
    (_q((100, 1), (200, 1)), "0+1 1+1"),                             # a longer one cannot join
    (_q(*[(100, 1)] * 65), "0+64 64+1"),                             # 64 segments per send
    (_q(*[(1400, 1)] * 50), "0+46 46+4"),                            # 46 * 1400 <= 65000 < 47 * 1400
    (_q((64999, 1), (1, 1)), "0+2"),                                 # exactly 65000 bytes
    (_q((65000, 1), (1, 1)), "0+1 1+1"),                             # one byte over
    (_q((1000, 1), (1000, 1), (1000, 2), (1000, 1)), "0+2 2+1 3+1"),  # never skips a slot
    ("plan", ""),
]

CUT = [
    # (len seg room mtu: the message, its UDP_GRO size, the slot, the mtu), datagrams
    ("3000 1000 65536 1472", "train=1 0/1000 1000/1000 2000/1000"),
    ("2500 1000 65536 1472", "train=1 0/1000 1000/1000 2000/500"),   # the last shorter
    ("1000 0 65536 1472", "train=0 0/1000"),                          # no cmsg: one datagram
    ("1000 2000 65536 1472", "train=0 0/1000"),                       # seg over the length
    ("0 0 65536 1472", "train=0 0/0"),                                # an empty datagram
    ("2000 0 65536 1472", "train=0 0/1472!"),                         # over the mtu: truncated
    ("3000 1500 65536 1000", "train=1 0/1000! 1500/1000!"),
    # a train longer than the slot (a gro_max_size over 64 KB): cut by the slot
    ("70000 20000 65536 65535", "train=1 0/20000 20000/20000 40000/20000 60000/10000!"),
    ("140000 35000 65536 65535", "train=1 0/35000 35000/35000! 70000/35000? 105000/35000?"),
]

SLOT = [
    # (offloads mtu), (slot, stride)
    ("0 1400", "1400 1400"),
    (f"{OFF_UDP_GRO} 1400", f"{GRO_SLOT} {GRO_SLOT + TRACE_HEAD}"),   # slack for a trace head
    (f"{OFF_TUN_VNET | OFF_UDP_GSO} 9000", "9000 9000"),
]

READ = [
    # (r mtu gso_type: bytes read with the header), (reason, where, length)
    ("5 1400 0", f"{MALFORMED} slot 0"),                              # shorter than the header
    ("10 1400 0", "0 slot 0"),
    ("1010 1400 0", "0 slot 1000"),
    ("2010 1400 0", "0 slot 1400"),                                   # cut at mtu, as read(mtu)
    ("3010 1400 1", "0 big 3000"),                                    # TSO: whole in big
    ("500 1400 5", "0 big 490"),                                      # USO, however short
    ("65545 1400 1", "0 big 65535"),
]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    # every pure source (csrc/sources.txt), as the fuzzers: a hand-picked subset breaks
    # whenever one of them starts calling into another file
    return build_c(tmp_path_factory.mktemp("table"), "table_train", fuzzer=False)


def test_table(table):
    cases = [(q, a) for q, a in PLAN] + [(f"cut {q}", a) for q, a in CUT] + \
        [(f"slot {q}", a) for q, a in SLOT] + [(f"read {q}", a) for q, a in READ]
    r = subprocess.run([str(table)], input="".join(q + "\n" for q, _ in cases),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    got = r.stdout.split("\n")[:-1]
    assert len(got) == len(cases), r.stdout
    for (q, want), answer in zip(cases, got):
        assert answer == want, f"{q[:60]}: got {answer!r}, want {want!r}"
