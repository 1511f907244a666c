"""Both peer watches, the thread (control/peers.py) and the child process (control/peer_process.py),
offer the interface the daemon holds, PeerWatch (control/peer_watch.py), member for member and
signature for signature; and the watch status /readyz reads is offered by both watches behind them
(no etcd, no root: nothing is started)."""
from __future__ import annotations

import inspect
from ipaddress import IPv4Network
from types import SimpleNamespace

import pytest

from dataplane.control.etcd_watch import WatchLoop
from dataplane.control.peer_process import PeerWatchProcess, _RemoteWatch
from dataplane.control.peer_watch import PeerWatch, WatchStatus
from dataplane.control.peers import PeerWatcher

OWN = IPv4Network("10.5.1.0/24")
WATCHES = [PeerWatcher, PeerWatchProcess]


def declared(protocol) -> dict[str, object]:
    """The members a protocol declares: its methods and properties."""
    return {name: value for name, value in vars(protocol).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))}


def make(cls):
    # Only what the constructors read of a registry: neither talks to etcd before start().
    registry = SimpleNamespace(spec={}, subnets_prefix="/coreos.com/network/subnets/")
    return cls(registry, OWN, None, retry_interval=0.2, network=IPv4Network("10.5.0.0/16"),
               coalesce=0.01, own_ips=())


def test_the_protocols_declare_what_the_daemon_uses():
    assert set(declared(PeerWatch)) == {
        "ready", "watch_loop", "bad_total", "revision", "snapshots", "batches", "start", "stop",
        "wait_ready", "set_own_subnet", "flush", "peers", "snapshot", "bad"}
    assert set(declared(WatchStatus)) == {"connected", "reconnects", "resyncs"}


@pytest.mark.parametrize("cls", WATCHES, ids=lambda c: c.__name__)
def test_each_peer_watch_implements_the_protocol(cls):
    watcher = make(cls)
    assert isinstance(watcher, PeerWatch)
    for name, member in declared(PeerWatch).items():
        if isinstance(member, property):
            # an attribute or a property, readable before start
            assert not callable(getattr(watcher, name)), name
            continue
        ours = inspect.signature(getattr(cls, name))
        theirs = inspect.signature(member)
        assert list(ours.parameters) == list(theirs.parameters), (cls.__name__, name, ours)
        for p in theirs.parameters.values():
            assert ours.parameters[p.name].default == p.default, (cls.__name__, name, p.name)
    watch = watcher.watch_loop
    assert watch is None or isinstance(watch, WatchStatus)


def test_the_daemon_builds_either_with_the_same_arguments():
    thread = inspect.signature(PeerWatcher.__init__).parameters
    process = inspect.signature(PeerWatchProcess.__init__).parameters
    for name, p in thread.items():
        assert name in process, name
        assert (process[name].kind, process[name].default) == (p.kind, p.default), name


def test_the_watches_behind_them_offer_the_watch_status():
    loop = WatchLoop(None, "/coreos.com/network/subnets/", prefix=True, start_revision=1,
                     on_events=lambda events, rev: None, on_compacted=lambda: 0,
                     retry_interval=1.0, name="subnets")
    for watch in (loop, _RemoteWatch()):
        assert isinstance(watch, WatchStatus)
        assert not watch.connected.is_set() and watch.reconnects == watch.resyncs == 0
