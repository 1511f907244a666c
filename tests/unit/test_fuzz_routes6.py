"""The IPv6 part of the C route table and own sources, case by case and at random.

csrc/fuzz/table_routes6.c answers one case per line: a lookup in a table of
IPv6 routes (routes.c's dp_routes_lookup of DP_FAM6, checked against a naive
longest-prefix scan too), a table's validation (dp_routes_build), an own
source (local.c's dp_local_has6), and random tables of both families
against the naive scans. Each row below is a rule of csrc/dataplane.h
(dp_route6, dp_loop_set_local) with the answer written out by hand.
"""
from __future__ import annotations

import errno
import re
import subprocess

import pytest

from tests.cbuild import build_c

EINVAL = str(-errno.EINVAL)

LOOKUP = [
    # (routes: net/len=peer:port, the destination), the route taken: peer:port/len
    ("2001:db8::/32=10.0.0.1:8285 2001:db8:1::/48=10.0.0.2:8286 -> 2001:db8:1::5",
     "10.0.0.2:8286/48"),                                             # the longest prefix
    ("2001:db8::/32=10.0.0.1:8285 2001:db8:1::/48=10.0.0.2:8286 -> 2001:db8:2::5",
     "10.0.0.1:8285/32"),
    ("2001:db8::/32=10.0.0.1:8285 -> 2001:db9::1", "miss"),
    ("::/0=10.0.0.9:1 -> 2001:db8::1", "10.0.0.9:1/0"),               # a default route
    ("2001:db8::1/128=10.0.0.3:7 2001:db8::/127=10.0.0.4:8 -> 2001:db8::1", "10.0.0.3:7/128"),
    ("2001:db8::1/128=10.0.0.3:7 2001:db8::/127=10.0.0.4:8 -> 2001:db8::", "10.0.0.4:8/127"),
    # prefix lengths on both sides of the 64-bit halves
    ("2001:db8:0:0:8000::/65=10.0.0.5:9 2001:db8::/64=10.0.0.6:9 -> 2001:db8::8000:0:0:1",
     "10.0.0.5:9/65"),
    ("2001:db8:0:0:8000::/65=10.0.0.5:9 2001:db8::/64=10.0.0.6:9 -> 2001:db8::7fff:0:0:1",
     "10.0.0.6:9/64"),
    ("2001:db8:0:2::/63=10.0.0.7:9 -> 2001:db8:0:3::1", "10.0.0.7:9/63"),
    ("2001:db8:0:2::/63=10.0.0.7:9 -> 2001:db8:0:1::1", "miss"),
    # duplicates keep the last, as a dict would
    ("2001:db8::/64=10.0.0.3:7 2001:db8::/64=10.0.0.4:8 -> 2001:db8::ffff", "10.0.0.4:8/64"),
    ("2001:db8::1/64=10.0.0.3:7 -> 2001:db8::1", EINVAL),             # host bits
    ("-> 2001:db8::1", "miss"),                                       # no routes at all
    # peers of both underlays in one table, and the mtu with its route
    ("2001:db8::/32=[2001:db8:ff::1]:8285/1400 2001:db8:1::/48=10.0.0.2:8286 -> 2001:db8:2::5",
     "[2001:db8:ff::1]:8285/32 mtu 1400"),
    ("2001:db8::/32=[2001:db8:ff::1]:8285/1400 2001:db8:1::/48=10.0.0.2:8286 -> 2001:db8:1::5",
     "10.0.0.2:8286/48"),
    ("2001:db8::/64=[fe80::1]:8285 -> 2001:db8::5", EINVAL),
]

BUILD = [
    # (net/len, peer_ip, port, mtu, reserved), dp_routes_build's return
    ("2001:db8::/64 ::ffff:10.0.0.1 8285 0 0", "0"),
    ("2001:db8::/129 ::ffff:10.0.0.1 8285 0 0", EINVAL),              # prefixlen 0..128
    ("2001:db8::/64 2001:db8::1 8285 0 0", "0"),                      # the IPv6 underlay
    ("2001:db8::/64 ::1 8285 0 0", "0"),
    ("2001:db8::/64 ::10.0.0.1 8285 0 0", "0"),                       # IPv4-compatible: IPv6
    ("2001:db8::/64 :: 8285 0 0", EINVAL),                            # nobody
    ("2001:db8::/64 fe80::1 8285 0 0", EINVAL),                       # needs a scope
    ("2001:db8::/64 febf::1 8285 0 0", EINVAL),
    ("2001:db8::/64 ff0e::1 8285 0 0", EINVAL),                       # multicast
    ("2001:db8::/64 ::ffff:10.0.0.1 65536 0 0", EINVAL),              # port
    ("2001:db8::/64 ::ffff:10.0.0.1 8285 0 1", EINVAL),               # reserved not 0
    ("2001:db8::/64 2001:db8::1 8285 1280 0", "0"),                   # mtu 0 or 1280..65535
    ("2001:db8::/64 ::ffff:10.0.0.1 8285 65535 0", "0"),
    ("2001:db8::/64 2001:db8::1 8285 1279 0", EINVAL),
    ("2001:db8::/64 2001:db8::1 8285 68 0", EINVAL),
    ("2001:db8::/64 2001:db8::1 8285 65536 0", EINVAL),
    ("::/0 ::ffff:0.0.0.0 0 0 0", "0"),
]

LOCAL = [
    # (subnet/len, addresses -> the inner source), 1 if it is this host's own
    ("2001:db8:5::/48 fd00::1 -> 2001:db8:5:ffff::1", "1"),
    ("2001:db8:5::/48 fd00::1 -> 2001:db8:6::1", "0"),
    ("2001:db8:5::/48 fd00::1 fd00::9 -> fd00::9", "1"),
    ("2001:db8:5::/48 fd00::1 -> fd00::2", "0"),
    ("2001:db8:5::/128 -> 2001:db8:5::", "1"),
    ("::/0 -> fd00::2", "0"),                                         # prefixlen 0: no subnet
    ("::/0 :: -> ::", "1"),                                           # :: as an address
    ("2001:db8:5::1/48 -> fd00::2", EINVAL),                          # host bits
    ("::/129 -> fd00::2", EINVAL),
]

# Seeds of the random tables: each runs this many tables of up to 64 IPv6 and 8 IPv4 routes.
RANDOM = [(seed, 300) for seed in (1, 2, 3, 4)]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return build_c(tmp_path_factory.mktemp("routes6"), "table_routes6",
                   ("routes.c", "local.c"), fuzzer=False)


def _ask(table, questions) -> list[str]:
    r = subprocess.run([str(table)], input="".join(q + "\n" for q in questions),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = r.stdout.split("\n")[:-1]
    assert len(got) == len(questions), r.stdout
    return got


def test_table(table):
    cases = [(f"lookup {q}", a) for q, a in LOOKUP] + [(f"build {q}", a) for q, a in BUILD] + \
        [(f"local {q}", a) for q, a in LOCAL]
    for (q, want), answer in zip(cases, _ask(table, [q for q, _ in cases])):
        assert answer == want, f"{q[:70]}: got {answer!r}, want {want!r}"


def test_random_tables_match_a_naive_scan(table):
    answers = _ask(table, [f"random {seed} {n}" for seed, n in RANDOM])
    for (seed, _), answer in zip(RANDOM, answers):
        m = re.fullmatch(r"ok (\d+) (\d+)", answer)
        assert m, f"seed {seed}: {answer!r}"
        # Both outcomes were compared, and plenty of each: the addresses are drawn near the nets.
        assert int(m.group(1)) > 1000 and int(m.group(2)) > 1000, answer
