"""The kernel path's loader (dataplane/engine/bpf_*.py): route and peer updates of both
underlays reach the programs, and what cannot work says why (no clang, the verifier's refusal
with its log, an IPv6 underlay route without own PublicIPv6)."""
from __future__ import annotations

import ipaddress
import subprocess

import pytest

from dataplane.engine import bpf_contract as bc
from dataplane.engine import ipv4
from dataplane.engine.api import Route
from tests.conftest import require_bpf
from tests.unit.test_malloc import mapped_alone
from tests.unit.test_bpf_programs import (MTU, OK, OTHER_PEER, OWN_IP, OWN_IP6, PEER, PEER6, PORT,
                                          REDIRECT, SHOT, datagram, frame, udp4, udp6)


@pytest.fixture
def kp():
    require_bpf()
    from dataplane.engine.bpf_path import KernelPath
    with KernelPath() as k:
        k.set_devices(1, 1, tun_l2=True, ext_l2=True)
        yield k


def test_unconfigured_programs_pass_everything(kp):
    data = frame(udp4())
    assert kp.test_run(bc.PROG_EGRESS, data) == (OK, data)
    assert kp.test_run(bc.PROG_INGRESS, datagram(udp4())) == (OK, datagram(udp4()))
    assert set(kp.counters().values()) == {0}


def test_route_changes_reach_the_programs(kp):
    kp.configure(own_ip=OWN_IP, port=PORT, mtu=MTU)
    to_b, from_b = frame(udp4(dst="10.5.2.3")), datagram(udp4(src="10.5.2.3", dst="10.5.1.2"))
    kp.set_routes([Route.make("10.5.2.0/24", PEER, PORT), Route.make("10.5.4.0/24", PEER, PORT)])
    assert kp.test_run(bc.PROG_EGRESS, to_b)[0] == REDIRECT
    assert kp.test_run(bc.PROG_INGRESS, from_b)[0] == REDIRECT
    # one of PEER's two routes gone: PEER still holds a lease
    kp.set_routes([Route.make("10.5.2.0/24", PEER, PORT)])
    assert kp.test_run(bc.PROG_INGRESS, from_b)[0] == REDIRECT
    # the subnet moves to another peer: sent there, and PEER holds no lease any more
    kp.set_routes([Route.make("10.5.2.0/24", OTHER_PEER, PORT)])
    verdict, out = kp.test_run(bc.PROG_EGRESS, to_b)
    assert verdict == REDIRECT and str(ipv4.parse(out[14:]).dst) == OTHER_PEER
    assert kp.test_run(bc.PROG_INGRESS, from_b)[0] == SHOT
    kp.set_routes([])
    assert kp.test_run(bc.PROG_EGRESS, to_b) == (OK, to_b)
    assert kp.counters()["tx_pass_no_route"] == 1
    assert kp.counters()["drop_bad_source"] == 1


def test_accept_any_skips_the_source_check(kp):
    kp.configure(own_ip=OWN_IP, port=PORT, mtu=MTU, accept_any=True)
    assert kp.test_run(bc.PROG_INGRESS, datagram(udp4(src="10.5.2.3", dst="10.5.1.2")))[0] == REDIRECT


def test_an_ipv6_underlay_route_needs_own_publicipv6(kp):
    from dataplane.engine.bpf_path import KernelPathError
    kp.configure(own_ip=OWN_IP, port=PORT, mtu=MTU)
    with pytest.raises(KernelPathError, match=r"needs own PublicIPv6 \(configure\(own_ip6="):
        kp.set_routes([Route.make("fd00:5:2::/64", "2001:db8::2", PORT)])


def test_route_changes_of_both_underlays_reach_the_programs(kp):
    kp.configure(own_ip=OWN_IP, port=PORT, mtu=MTU, own_ip6=OWN_IP6)
    to_b = frame(udp6(dst="fd00:5:2::3"))
    from_b6 = datagram(udp6(src="fd00:5:2::3", dst="fd00:5:1::2"), src=PEER6)
    from_b4 = datagram(udp4(src="10.5.2.3", dst="10.5.1.2"))
    # PEER's host in both: its IPv4 subnet over IPv4, its IPv6 one over IPv6
    kp.set_routes([Route.make("10.5.2.0/24", PEER, PORT),
                   Route.make("fd00:5:2::/64", PEER6, PORT, mtu=MTU - 20)])
    verdict, out = kp.test_run(bc.PROG_EGRESS, to_b)
    assert verdict == REDIRECT and ipaddress.IPv6Address(out[14 + 24:14 + 40]) == \
        ipaddress.IPv6Address(PEER6)
    assert kp.test_run(bc.PROG_INGRESS, from_b6)[0] == REDIRECT
    assert kp.test_run(bc.PROG_INGRESS, from_b4)[0] == REDIRECT
    # its IPv6 subnet moves to the IPv4 underlay: sent there, PEER6 holds no lease any more
    kp.set_routes([Route.make("10.5.2.0/24", PEER, PORT), Route.make("fd00:5:2::/64", PEER, PORT)])
    verdict, out = kp.test_run(bc.PROG_EGRESS, to_b)
    assert verdict == REDIRECT and str(ipv4.parse(out[14:]).dst) == PEER
    assert kp.test_run(bc.PROG_INGRESS, from_b6)[0] == SHOT
    assert kp.test_run(bc.PROG_INGRESS, from_b4)[0] == REDIRECT
    assert kp.counters()["drop_bad_source"] == 1
    # and back, then all gone
    kp.set_routes([Route.make("fd00:5:2::/64", PEER6, PORT, mtu=MTU - 20)])
    assert kp.test_run(bc.PROG_INGRESS, from_b6)[0] == REDIRECT
    assert kp.test_run(bc.PROG_INGRESS, from_b4)[0] == SHOT
    kp.set_routes([])
    assert kp.test_run(bc.PROG_EGRESS, to_b) == (OK, to_b)
    assert kp.test_run(bc.PROG_INGRESS, from_b6)[0] == SHOT
    assert kp.counters()["drop_bad_source"] == 3


def test_no_clang_says_what_to_install(monkeypatch, tmp_path):
    from dataplane.engine import bpf_build
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("BPF_CLANG", raising=False)
    if not bpf_build.os.path.isfile("/usr/include/bpf/bpf_helpers.h"):
        pytest.skip("no libbpf headers: that error comes first")
    with pytest.raises(bpf_build.BpfBuildError, match="apt-get install clang"):
        bpf_build.build(force=True)


REFUSED = r"""
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
SEC("tc") int fu_egress(struct __sk_buff *skb)
{ return *(unsigned char *)(long)skb->data; }   /* no bounds check: the verifier says no */
SEC("tc") int fu_ingress(struct __sk_buff *skb) { return 0; }
char LICENSE[] SEC("license") = "GPL";
"""


def test_a_verifier_refusal_carries_its_log(tmp_path):
    require_bpf()
    from dataplane.engine import bpf_build
    from dataplane.engine.bpf_path import KernelPath, KernelPathError
    src, obj = tmp_path / "bad.bpf.c", tmp_path / "bad.bpf.o"
    src.write_text(REFUSED)
    subprocess.run([bpf_build.clang(), *bpf_build._flags(), "-c", str(src), "-o", str(obj)],
                   check=True, capture_output=True)
    with pytest.raises(KernelPathError) as e:
        KernelPath(obj)
    text = str(e.value)
    assert "the verifier said" in text and "--- fu_egress ---" in text
    assert "invalid access to packet" in text, text


def test_not_root_says_so(monkeypatch):
    from dataplane.engine import bpf_path
    monkeypatch.setattr(bpf_path.os, "geteuid", lambda: 1000)
    with pytest.raises(bpf_path.KernelPathError, match="needs root"):
        bpf_path.KernelPath()


def test_no_libbpf_says_what_to_install(monkeypatch):
    from dataplane.engine import bpf_lib, bpf_path
    monkeypatch.setattr(bpf_lib, "LIBRARY", "libbpf-not-here.so.1")
    monkeypatch.setattr(bpf_lib, "_lib", None)
    monkeypatch.setattr(bpf_path.os, "geteuid", lambda: 0)
    with pytest.raises(bpf_path.KernelPathError, match="apt-get install libbpf1"):
        bpf_path.KernelPath()


def test_a_large_block_is_given_back_after_the_load(kp):
    """libbpf's load reads the kernel's BTF (~5 MB) and frees it, which raised glibc's mmap
    threshold past that size: every later block under it stayed resident after its free
    (a kernel path daemon's idle RSS, 8 MB more at 16,000 leases). After a load, a 2 MiB block
    is mapped on its own again, and so unmapped at its free."""
    assert mapped_alone(2 << 20)


def test_the_counters_read_in_one_call_are_those_read_one_by_one(kp, monkeypatch):
    from dataplane.engine import bpf_lib
    kp.configure(own_ip=OWN_IP, port=PORT, mtu=MTU)
    lost = frame(udp4(dst="10.5.9.9"))              # no route: handed to the engine
    for _ in range(3):
        kp.test_run(bc.PROG_EGRESS, lost)
    batched = kp.counters()
    assert bpf_lib._lookup_batch is True            # this kernel (6.18) has batched lookups
    monkeypatch.setattr(bpf_lib, "_lookup_batch", False)
    assert kp.counters() == batched and batched["tx_pass_no_route"] == 3
