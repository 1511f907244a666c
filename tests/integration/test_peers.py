"""PeerWatcher against a real etcd: the peer view always converges to what etcd holds.

Each test that watches runs twice: with the watcher in a thread (the C engine's daemon) and in a
child process (PeerWatchProcess, the Python engine's), which must report the same changes.

Also the 2- and 50-node scenario: every node acquires concurrently with its own LeaseManager and
watches peers with its own PeerWatcher; no duplicate subnet, and the time until every watcher sees all
other nodes is measured and printed (run with -s to see it).
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from ipaddress import IPv4Address, IPv4Network

import pytest

from dataplane.control.lease import LeaseAttrs
from dataplane.control.peer_process import PeerWatchProcess
from dataplane.control.peers import PeerWatcher
from dataplane.control.lease_manager import LeaseManager
from tests.conftest import wait_until
from tests.integration.conftest import reach_again

pytestmark = pytest.mark.etcd
OWN = IPv4Network("10.5.1.0/24")


def attrs(i: int) -> bytes:
    return LeaseAttrs(IPv4Address(f"192.168.77.{i}")).to_json()


def key(reg, third: int) -> str:
    return f"{reg.subnets_prefix}10.5.{third}.0-24"


def etcd_view(reg, own=OWN) -> dict:
    leases, _ = reg.list_leases()
    return {l.subnet: l.attrs for l in leases if l.subnet != own}


def watcher_view(w) -> dict:
    return {s: l.attrs for s, l in w.peers().items()}


class Recorder:
    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, change):
        with self.lock:
            self.calls.append(([str(l.subnet) for l in change.added],
                               [str(l.subnet) for l in change.removed]))


@pytest.fixture(params=[PeerWatcher, PeerWatchProcess], ids=["thread", "process"])
def watcher_cls(request):
    return request.param


@pytest.fixture
def started(watcher_cls):
    watchers = []

    def start(reg, own=OWN, retry_interval=0.2):
        rec = Recorder()
        w = watcher_cls(reg, own, rec, retry_interval=retry_interval)
        w.start()
        watchers.append(w)
        assert w.wait_ready(10)
        return w, rec

    yield start
    for w in watchers:
        w.stop()


def converged(reg, w, own=OWN):
    return lambda: etcd_view(reg, own) == watcher_view(w)


def test_snapshot_filters_own_and_skips_malformed(shared_etcd, make_registry, started, caplog):
    reg = make_registry(shared_etcd)
    reg.put(key(reg, 1), attrs(1))                      # our own lease
    reg.put(key(reg, 2), attrs(2))
    reg.put(reg.subnets_prefix + "not-a-subnet", attrs(3))
    reg.put(key(reg, 4), b"{broken")
    with caplog.at_level(logging.WARNING):
        w, rec = started(reg)
    assert set(w.peers()) == {IPv4Network("10.5.2.0/24")}
    assert rec.calls == [(["10.5.2.0/24"], [])]
    # the peer-watch process's log lines and status travel apart from its peers: they may follow
    wait_until(lambda: "not-a-subnet" in caplog.text and "10.5.4.0-24" in caplog.text,
               what=lambda: f"both bad keys logged: {caplog.text}")
    wait_until(lambda: set(w.bad()) == {reg.subnets_prefix + "not-a-subnet", key(reg, 4)},
               what=lambda: f"both bad keys known, have {w.bad()}")
    # Malformed events while watching are skipped too; a peer whose value turns bad keeps its last
    # valid lease (as flanneld, which ignores an event it cannot parse) until the key is deleted.
    reg.put(reg.subnets_prefix + "zzz", attrs(5))
    reg.put(key(reg, 2), b'{"PublicIP":"nope"}')
    reg.put(key(reg, 6), attrs(6))
    wait_until(lambda: IPv4Network("10.5.6.0/24") in w.peers(), what="event after malformed ones")
    assert set(w.peers()) == {IPv4Network("10.5.2.0/24"), IPv4Network("10.5.6.0/24")}
    assert w.peers()[IPv4Network("10.5.2.0/24")].attrs == LeaseAttrs.from_json(attrs(2))
    wait_until(lambda: len(w.bad()) == 4 and w.bad_total == 4,
               what=lambda: f"4 bad keys, have {w.bad()} ({w.bad_total} in all)")
    later = rec.calls[1:]                # one or more calls, depending on how etcd batched the events
    assert [s for a, _ in later for s in a] == ["10.5.6.0/24"]
    assert [s for _, r in later for s in r] == []
    # the same holds across a re-list (compaction, own subnet change), which logs nothing new
    w.set_own_subnet(OWN)
    assert IPv4Network("10.5.2.0/24") in w.peers()
    wait_until(lambda: w.bad_total == 4, what=lambda: f"bad_total 4, have {w.bad_total}")
    # fixed keys leave bad(); a deleted one takes its peer with it
    reg.put(key(reg, 4), attrs(4))
    reg.delete(key(reg, 2))
    wait_until(lambda: IPv4Network("10.5.4.0/24") in w.peers()
               and IPv4Network("10.5.2.0/24") not in w.peers(), what="fix and delete")
    # the peer-watch process sends its status (bad keys) apart from the peers: it may follow them
    want_bad = {reg.subnets_prefix + "not-a-subnet", reg.subnets_prefix + "zzz"}
    wait_until(lambda: set(w.bad()) == want_bad, what=lambda: f"bad keys {want_bad}, have {w.bad()}")


def test_leases_outside_the_network_or_unusable_are_skipped(shared_etcd, make_registry, watcher_cls):
    reg = make_registry(shared_etcd)
    for k, ip in (("10.5.2.0-24", "192.168.77.2"), ("10.9.0.0-24", "192.168.77.3"),
                  ("10.5.3.0-24", "127.0.0.1"), ("10.5.4.0-24", "10.5.2.9"),
                  ("10.5.5.0-24", "0.0.0.0"), ("10.5.2.7-24", "192.168.77.66")):
        reg.put(reg.subnets_prefix + k, LeaseAttrs(IPv4Address(ip)).to_json())
    w = watcher_cls(reg, OWN, None, network=IPv4Network("10.5.0.0/16"))
    w.start()
    try:
        assert w.wait_ready(10)
        assert {s: str(l.public_ip) for s, l in w.peers().items()} == {
            IPv4Network("10.5.2.0/24"): "192.168.77.2"}          # the host-bits key hijacks nothing
        problems = {k.rsplit("/", 1)[1]: p for k, p in w.bad().items()}
        assert "outside the Network" in problems["10.9.0.0-24"]
        assert "127.0.0.1" in problems["10.5.3.0-24"] and "0.0.0.0" in problems["10.5.5.0-24"]
        assert "inside the Network" in problems["10.5.4.0-24"]
        assert "host bits" in problems["10.5.2.7-24"]
    finally:
        w.stop()


def test_one_by_one_and_in_one_transaction(shared_etcd, make_registry, started):
    reg = make_registry(shared_etcd)
    w, rec = started(reg)
    for i in (2, 3, 4):
        reg.put(key(reg, i), attrs(i))
        wait_until(lambda: len(rec.calls) == i - 1, what=f"add {i}")
    assert rec.calls == [(["10.5.2.0/24"], []), (["10.5.3.0/24"], []), (["10.5.4.0/24"], [])]
    reg.delete(key(reg, 3))
    wait_until(lambda: len(rec.calls) == 4, what="remove one")
    assert rec.calls[-1] == ([], ["10.5.3.0/24"])

    # Several creations and deletions in ONE revision: all arrive, as one change.
    rev = reg.txn_put_delete({key(reg, i): attrs(i) for i in range(10, 15)}, deletes=[key(reg, 2)])
    wait_until(lambda: len(rec.calls) == 5, what="txn change")
    assert rec.calls[-1] == ([f"10.5.{i}.0/24" for i in range(10, 15)], ["10.5.2.0/24"])
    # (the peer watch process sends its status, with the revision, after the report it covers)
    wait_until(lambda: w.revision >= rev, timeout=5, what="the watcher's revision")

    # Our own lease never shows up; a renewal (same value) is not a change; a new PublicIP is.
    reg.put(key(reg, 1), attrs(1))
    reg.put(key(reg, 10), attrs(10))
    reg.put(key(reg, 11), attrs(99))
    wait_until(lambda: len(rec.calls) == 6, what="attr change")
    assert rec.calls[-1] == (["10.5.11.0/24"], [])
    assert w.peers()[IPv4Network("10.5.11.0/24")].attrs.public_ip == IPv4Address("192.168.77.99")

    # `etcdctl del --prefix`: every lease gone in one revision.
    reg.delete(reg.subnets_prefix, prefix=True)
    wait_until(lambda: not w.peers(), what="prefix delete")
    assert sorted(rec.calls[-1][1]) == sorted(f"10.5.{i}.0/24" for i in (4, 10, 11, 12, 13, 14))
    assert etcd_view(reg) == watcher_view(w) == {}



def test_transactions_from_another_client(shared_etcd, make_registry, started):
    """Leases written in one txn by the etcd client library itself (as another tool would) all arrive."""
    import pyetcd

    reg = make_registry(shared_etcd)
    w, rec = started(reg)
    cli = pyetcd.client(host=shared_etcd.host, port=shared_etcd.client_port, timeout=5)
    try:
        t = cli.transactions
        ok, _ = cli.transaction(compare=[], success=[t.put(key(reg, i), attrs(i)) for i in (20, 21, 22, 23)],
                                failure=[])
        assert ok
        wait_until(lambda: len(w.peers()) == 4, what="four leases from one txn")
        ok, _ = cli.transaction(compare=[], success=[t.delete(key(reg, 21)), t.delete(key(reg, 22)),
                                                     t.put(key(reg, 24), attrs(24))], failure=[])
        assert ok
        wait_until(converged(reg, w), what="deletes and a put from one txn")
        assert set(w.peers()) == {IPv4Network(f"10.5.{n}.0/24") for n in (20, 23, 24)}
        assert rec.calls == [(["10.5.20.0/24", "10.5.21.0/24", "10.5.22.0/24", "10.5.23.0/24"], []),
                             (["10.5.24.0/24"], ["10.5.21.0/24", "10.5.22.0/24"])]
    finally:
        cli.close()

def test_etcd_restarted_mid_watch(etcd, make_registry, started):
    reg = make_registry(etcd)
    reg.put(key(reg, 2), attrs(2))
    w, rec = started(reg)
    for round_ in range(2):
        reg.put(key(reg, 20 + round_), attrs(20 + round_))
        etcd.kill() if round_ == 0 else etcd.stop()      # a crash, then a clean stop
        etcd.start()
        reach_again(reg)
        reg.txn_put_delete({key(reg, 30 + round_): attrs(30 + round_),
                            key(reg, 40 + round_): attrs(40 + round_)},
                           deletes=[key(reg, 2)] if round_ == 0 else [key(reg, 20)])
        reg.put(key(reg, 50 + round_), attrs(50 + round_))
        wait_until(converged(reg, w), what=f"convergence after restart {round_}")
    wait_until(lambda: w.watch_loop.reconnects >= 2, what="the reconnects counted")
    assert set(w.peers()) == {IPv4Network(f"10.5.{n}.0/24") for n in (21, 30, 31, 40, 41, 50, 51)}


def test_compacted_mid_watch_relists(etcd, make_registry, started):
    reg = make_registry(etcd)
    for i in (2, 3, 4):
        reg.put(key(reg, i), attrs(i))
    w, rec = started(reg, retry_interval=3.0)           # the watcher stays away while we compact
    etcd.kill()
    etcd.start()
    reach_again(reg)
    reg.delete(key(reg, 3))
    reg.txn_put_delete({key(reg, 7): attrs(7), key(reg, 8): attrs(8)}, deletes=[key(reg, 4)])
    reg.put(key(reg, 2), attrs(22))
    etcd.compact()
    wait_until(converged(reg, w), timeout=15, what="convergence after compaction")
    wait_until(lambda: w.watch_loop.resyncs >= 1 and w.snapshots >= 2, what="the re-list counted")
    assert set(w.peers()) == {IPv4Network(f"10.5.{n}.0/24") for n in (2, 7, 8)}
    added = {s for a, _ in rec.calls for s in a}
    removed = {s for _, r in rec.calls for s in r}
    assert {"10.5.7.0/24", "10.5.8.0/24", "10.5.2.0/24"} <= added
    assert {"10.5.3.0/24", "10.5.4.0/24"} <= removed
    # Still watching after the re-list.
    reg.put(key(reg, 9), attrs(9))
    wait_until(converged(reg, w), what="event after re-list")



def test_random_churn_with_restarts_and_compaction_converges(etcd, make_registry, started):
    """Random puts, deletes and multi-key txns while etcd crashes, restarts and compacts."""
    import random

    from dataplane.control.etcd_errors import RegistryError

    rng = random.Random(1234)
    reg = make_registry(etcd)
    w, _ = started(reg, retry_interval=0.2)
    stop = threading.Event()
    done, failed = [0], [0]

    def writer():
        while not stop.is_set() and done[0] < 400:
            try:
                op = rng.random()
                if op < 0.5:
                    i = rng.randrange(1, 40)   # a new PublicIP, never another key's
                    reg.put(key(reg, i), LeaseAttrs(IPv4Address(
                        f"192.168.{rng.randrange(78, 250)}.{i}")).to_json())
                elif op < 0.8:
                    reg.delete(key(reg, rng.randrange(1, 40)))
                else:
                    picks = rng.sample(range(1, 40), 6)
                    reg.txn_put_delete({key(reg, i): attrs(i) for i in picks[:3]},
                                       deletes=[key(reg, i) for i in picks[3:]])
                done[0] += 1
            except RegistryError:
                failed[0] += 1
                time.sleep(0.05)              # etcd is down: the writer waits like a real node

    t = threading.Thread(target=writer)
    t.start()
    try:
        wait_until(lambda: done[0] >= 10, what="writes before the crash")
        etcd.kill()
        wait_until(lambda: failed[0] >= 2, what="writes refused while etcd is down")
        etcd.start()
        after_restart = done[0]
        wait_until(lambda: done[0] >= after_restart + 10, timeout=20, what="writes after the restart")
        etcd.compact()
        etcd.stop()
        etcd.start()
    finally:
        stop.set()
        t.join(20)
    assert done[0] > 20
    reach_again(reg)
    wait_until(converged(reg, w), timeout=15, what="convergence after random churn")
    wait_until(lambda: w.watch_loop.reconnects >= 2, what="the reconnects counted")

def test_set_own_subnet_after_reacquire(shared_etcd, make_registry, started):
    reg = make_registry(shared_etcd)
    reg.put(key(reg, 1), attrs(1))
    reg.put(key(reg, 2), attrs(2))
    w, rec = started(reg)
    assert set(w.peers()) == {IPv4Network("10.5.2.0/24")}
    # We lost 10.5.1.0/24 to another node and now hold 10.5.2.0/24.
    w.set_own_subnet(IPv4Network("10.5.2.0/24"))
    assert set(w.peers()) == {IPv4Network("10.5.1.0/24")}
    assert rec.calls[-1] == (["10.5.1.0/24"], ["10.5.2.0/24"])


def test_watch_process_killed_is_replaced_and_catches_up(shared_etcd, make_registry, caplog):
    """The child dies: the daemon side logs it, starts another, and reports what changed while
    nobody watched (against the peers it had, not against nothing)."""
    reg = make_registry(shared_etcd)
    reg.put(key(reg, 2), attrs(2))
    reg.put(key(reg, 3), attrs(3))
    rec = Recorder()
    w = PeerWatchProcess(reg, OWN, rec, retry_interval=0.2)
    w.start()
    procs = []
    try:
        assert w.wait_ready(10)
        procs.append(w._proc)
        # Ctrl-C and systemd's stop signal reach the whole group: the child leaves the decision
        # to the daemon.
        os.kill(w.pid, signal.SIGINT)
        os.kill(w.pid, signal.SIGTERM)
        time.sleep(0.3)           # no event to wait for: time for a wrong exit to show
        assert w._proc.poll() is None and w.restarts == 0
        with caplog.at_level(logging.ERROR):
            os.kill(w.pid, signal.SIGKILL)
            reg.delete(key(reg, 3))
            reg.put(key(reg, 4), attrs(4))
            wait_until(lambda: w._proc is not procs[0], what="a new child")
            procs.append(w._proc)
            wait_until(converged(reg, w), what="the new child's listing")
        assert "peer watch process exited (killed by SIGKILL)" in caplog.text
        assert w.restarts == 1
        assert rec.calls == [(["10.5.2.0/24", "10.5.3.0/24"], []), (["10.5.4.0/24"], ["10.5.3.0/24"])]
        wait_until(lambda: w.watch_loop.connected.is_set(), what="watching again")
        assert w.watch_loop.reconnects >= 1
        reg.put(key(reg, 5), attrs(5))
        wait_until(converged(reg, w), what="an event after the restart")
        assert rec.calls[-1] == (["10.5.5.0/24"], [])
    finally:
        w.stop()
    assert all(p.poll() is not None for p in procs)


def test_watch_process_ends_when_the_daemon_side_closes(shared_etcd, make_registry):
    """What a daemon killed with SIGKILL leaves: its end of the socket closed by the kernel."""
    reg = make_registry(shared_etcd)
    w = PeerWatchProcess(reg, OWN, None)
    w.start()
    try:
        assert w.wait_ready(10)
        proc = w._proc
        w._stop.set()             # no replacement: this side is "dead"
        w._link.close()
        assert proc.wait(5) == 0
    finally:
        w.stop()


def _run_nodes(make_registry, server, n: int):
    """n simulated nodes: each acquires concurrently, then watches; returns (leases, seconds to converge)."""
    first = make_registry(server)
    regs = [first] + [make_registry(server, prefix=first.prefix, config=None) for _ in range(n - 1)]
    barrier = threading.Barrier(n)
    leases: list = [None] * n
    managers: list = [None] * n
    watchers: list = [None] * n
    errors: list = []
    t0 = [0.0]

    def node(i):
        try:
            barrier.wait(30)
            if i == 0:
                t0[0] = time.monotonic()
            mgr = LeaseManager(regs[i], IPv4Address(f"192.168.{i // 200}.{i % 200 + 1}"))
            leases[i] = mgr.acquire()
            managers[i] = mgr
            mgr.start()
            w = PeerWatcher(regs[i], leases[i].subnet, None)
            watchers[i] = w
            w.start()
        except Exception as exc:            # reported below
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        subnets = [l.subnet for l in leases]
        assert len(set(subnets)) == n, "duplicate subnet"
        wait_until(lambda: all(w is not None and len(w.peers()) == n - 1 for w in watchers),
                   timeout=60, interval=0.01, what="the peer views to converge")
        elapsed = time.monotonic() - t0[0]
        for i, w in enumerate(watchers):
            assert set(w.peers()) == set(subnets) - {subnets[i]}
        held = {l.subnet: l.attrs.public_ip for l in first.list_leases()[0]}
        assert held == {l.subnet: l.attrs.public_ip for l in leases}
        races = sum(m.races_lost for m in managers)
        print(f"\n{n} nodes: {races} creation race(s) lost and retried", end="")
        return leases, elapsed
    finally:
        for w in watchers:
            if w is not None:
                w.stop()
        for m in managers:
            if m is not None:
                m.stop()


def test_two_nodes_converge(shared_etcd, make_registry):
    _, elapsed = _run_nodes(make_registry, shared_etcd, 2)
    print(f"\n2 nodes: acquired distinct subnets and saw each other in {elapsed:.3f}s")


@pytest.mark.slow
def test_fifty_nodes_converge(shared_etcd, make_registry, record_property):
    _, elapsed = _run_nodes(make_registry, shared_etcd, 50)
    record_property("convergence_s_50_nodes", elapsed)
    print(f"\n50 nodes: acquired 50 distinct subnets and every watcher saw all 49 peers in {elapsed:.3f}s")
    assert elapsed < 30
