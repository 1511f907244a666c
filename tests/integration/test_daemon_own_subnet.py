"""Bad data and failed writes never move a host off its workloads' subnet, nor hide the cause
(root, real etcd, both engines).

::

      h0 (engine E)  <-- ping every 0.1 s -->  h1 (the other engine)
           |                                        |
      -----+-------- bridge, switch netns: etcd ----+----
        a key planted with h1's PublicIP and no etcd lease; h1's own key overwritten with
        garbage; a 1 MB value; h1's subnet file on a full tmpfs while its lease moves

What must hold: h1 keeps its subnet while it can write its key (it takes the key back), the
planted key is a route on no host (not even to h1 itself), nothing of the ping is lost; a subnet
file that cannot be written is retried until it names the lease, and /readyz, /metrics and one
log line say so meanwhile.
"""
from __future__ import annotations

import ipaddress
import os
import subprocess
import tempfile
import time

import pytest

from tests.conftest import ENGINES, wait_until
from tests.integration.conftest import other_engine, overlay_of
from tests.integration.daemon_checks import Pinger, lease_json, logged, metric
from tests.integration.traffic import udp_probe

pytestmark = [pytest.mark.root, pytest.mark.etcd]


@pytest.fixture(scope="module", params=ENGINES)
def ov(request):
    engine = request.param
    yield from overlay_of(engine, (engine, other_engine(engine)))


def free_subnets(ov, n: int):
    taken = ov.leases()
    return [s for s in ipaddress.IPv4Network("10.5.0.0/16").subnets(new_prefix=24)
            if s not in taken and s.network_address.packed[2] >= 200][:n]


def test_a_planted_key_and_a_garbage_own_key_do_not_move_the_host(ov):
    h0, h1 = ov.hosts
    s1 = ov.subnet(h1)
    planted, big = free_subnets(ov, 2)
    planted_key = f"subnets/{planted.network_address}-24"
    big_key = f"subnets/{big.network_address}-24"
    pinger = Pinger(ov, h0, h1, seconds=12)   # at most: stopped once the 1 MB value is skipped
    try:
        assert pinger.replying(), pinger.stop()["out"]
        # by hand, with no etcd lease: h1's PublicIP under a subnet h1 does not hold
        ov.put(planted_key, lease_json(h1.ip))
        wait_until(lambda: logged(ov, h1, planted_key, "own PublicIP"), 10,
                   what="h1 to refuse a route to itself")
        wait_until(lambda: logged(ov, h0, planted_key, "conflict", f"already holds {s1}"), 10,
                   what="h0 to see the conflict")
        # then h1's own key broken: h1 takes that key back, it does not move to the planted one
        ov.put(f"subnets/{s1.network_address}-24", "not json{")
        wait_until(lambda: logged(ov, h1, "took it back"), 10, what="h1 to take its key back")
        wait_until(lambda: ov.leases().get(s1) == h1.ip, 10, what="h1's key naming h1 again")
        time.sleep(1.0)
        assert ov.subnet(h1) == s1, ov.daemon(h1).log_text()[-4000:]
        assert not logged(ov, h1, str(planted), "reusing")
        # no host routes the planted subnet: the engines answer net unreachable
        for h in (h0, h1):
            assert udp_probe(ov, h, str(planted.network_address + 1)) == "ENETUNREACH"
            assert metric(ov, h, "flannel_udp_peers") == 1
        # a value far over any flannel's size is skipped, even with a good PublicIP
        ov.put(big_key, lease_json("192.168.77.60", x="a" * (1 << 20)))
        for h in (h0, h1):
            wait_until(lambda: logged(ov, h, big_key, "oversized"), 10,
                       what=f"{h.name}: the 1 MB value skipped")
            assert metric(ov, h, "flannel_udp_peers") == 1
        r = pinger.stop()
        assert r["sent"] > 0 and r["received"] == r["sent"], r["out"]
    finally:
        pinger.kill()
        for key in (planted_key, big_key):
            ov.etcdctl("del", f"{ov.prefix}/{key}")
    for h in (h0, h1):
        assert ov.daemon(h).running()
        wait_until(lambda: metric(ov, h, "flannel_udp_bad_leases") == 0, 10,
                   what=f"{h.name}: nothing skipped once the keys are gone")


@pytest.fixture
def full_tmpfs():
    """A 64 KiB tmpfs, unmounted after the test."""
    path = tempfile.mkdtemp(prefix="fu-tmpfs-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        os.rmdir(path)


def fill(path: str) -> str:
    filler = os.path.join(path, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(1000):           # 64 KiB is full long before
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def test_a_subnet_file_that_could_not_be_written_is_rewritten_and_reported(ov, full_tmpfs):
    h0, h1 = ov.hosts
    env_path = os.path.join(full_tmpfs, "subnet.env")
    old = ov.subnet(h1)
    ov.restart_daemon(h1, args=("--subnet-file", env_path))
    try:
        assert open(env_path).read().count(f"FLANNEL_SUBNET={old.network_address + 1}/24") == 1
        filler = fill(full_tmpfs)
        # h1's subnet genuinely taken by another host: it must move, and cannot write the file
        ov.put(f"subnets/{old.network_address}-24", lease_json("192.168.77.99"))
        wait_until(lambda: ov.healthz(h1, "/readyz")[0] == 503, 15, what="/readyz to fail")
        status, body = ov.healthz(h1, "/readyz")
        assert "subnet_file" in body and "does not name the lease" in body, body
        assert metric(ov, h1, "flannel_udp_subnet_file_stale") == 1
        time.sleep(3)                      # retried every second, said once
        text = ov.daemon(h1).log_text()
        said = [l for l in text.splitlines() if f"Writing the subnet file {env_path}" in l]
        assert len(said) == 1 and f"still names {old}" in said[0], said
        assert metric(ov, h1, "flannel_udp_subnet_file_write_failures_total") >= 3
        os.unlink(filler)
        wait_until(lambda: f"FLANNEL_SUBNET={old.network_address + 1}/24" not in open(env_path).read(),
                   5, what="the subnet file rewritten")
        new = ipaddress.IPv4Interface(
            [l for l in open(env_path).read().splitlines()
             if l.startswith("FLANNEL_SUBNET=")][0].partition("=")[2]).network
        assert ov.leases().get(new) == h1.ip
        wait_until(lambda: ov.healthz(h1, "/readyz")[0] == 200, 5, what="/readyz to pass again")
        assert metric(ov, h1, "flannel_udp_subnet_file_stale") == 0
        assert logged(ov, h1, f"Writing the subnet file {env_path}", "recovered")
        assert ov.reachable(h0, str(new.network_address), 10)
    finally:
        ov.etcdctl("del", f"{ov.prefix}/subnets/{old.network_address}-24")
        ov.restart_daemon(h1, args=())
