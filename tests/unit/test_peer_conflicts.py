"""One host holds one subnet: leases that claim a PublicIP twice, or this host's own, are no
routes (no etcd, no root: the watcher over a registry the test drives)."""
from __future__ import annotations

import logging
from ipaddress import IPv4Address

import pytest

from dataplane.control.lease import MAX_VALUE_BYTES, LeaseAttrs, LeaseFormatError
from dataplane.control.peers import PeerWatcher
from dataplane.control.etcd_watch import WatchEvent
from tests.unit.test_peer_batches import OWN, PREFIX, FakeRegistry, Reports, subnet

OWN_IP = "192.168.77.1"


def put(i: int, ip: str, rev: int, created: int | None = None) -> WatchEvent:
    value = LeaseAttrs(IPv4Address(ip)).to_json()
    return WatchEvent("put", f"{PREFIX}{subnet(i).network_address}-24", value, rev, 0,
                      created if created is not None else rev)


def delete(i: int, rev: int) -> WatchEvent:
    return WatchEvent("delete", f"{PREFIX}{subnet(i).network_address}-24", b"", rev, 0)


@pytest.fixture
def watcher():
    started = []

    def start():
        reg, reports = FakeRegistry(), Reports()
        w = PeerWatcher(reg, OWN, reports, coalesce=60.0, own_ips=[IPv4Address(OWN_IP)])
        w.start()
        started.append(w)
        assert w.wait_ready(5) and reg.watching.wait(5)
        return w, reg
    yield start
    for w in started:
        w.stop()


def routes(w) -> dict:
    return {str(s): str(l.public_ip) for s, l in w.peers().items()}


def test_a_lease_naming_our_own_publicip_is_never_a_route(watcher, caplog):
    w, reg = watcher()
    with caplog.at_level(logging.WARNING):
        reg.send(put(2, "192.168.77.2", 11), put(7, OWN_IP, 12))
        w.flush()
    assert routes(w) == {"10.5.2.0/24": "192.168.77.2"}
    assert "own PublicIP" in w.bad()[f"{PREFIX}10.5.7.0-24"]
    said = [r.getMessage() for r in caplog.records if "10.5.7.0-24" in r.getMessage()]
    assert len(said) == 1 and "etcdctl del" in said[0]
    reg.send(delete(7, 13))
    w.flush()
    assert w.bad() == {} and routes(w) == {"10.5.2.0/24": "192.168.77.2"}


def test_a_second_key_for_a_publicip_is_a_conflict_the_first_keeps_its_route(watcher):
    w, reg = watcher()
    reg.send(put(5, "192.168.77.5", 11))
    w.flush()
    reg.send(put(3, "192.168.77.5", 12))        # planted later, lower subnet: still second
    w.flush()
    assert routes(w) == {"10.5.5.0/24": "192.168.77.5"}
    assert "already holds 10.5.5.0/24" in w.bad()[f"{PREFIX}10.5.3.0-24"]
    bad_total = w.bad_total
    # The holder's key rewritten (a renewal keeps its create revision): nothing changes, no new line
    reg.send(put(5, "192.168.77.5", 13, created=11))
    w.flush()
    assert routes(w) == {"10.5.5.0/24": "192.168.77.5"} and w.bad_total == bad_total
    # The holder goes: the other key is a route now; the holder comes back, newer: it waits
    reg.send(delete(5, 14))
    w.flush()
    assert routes(w) == {"10.5.3.0/24": "192.168.77.5"} and w.bad() == {}
    reg.send(put(5, "192.168.77.5", 15))
    w.flush()
    assert routes(w) == {"10.5.3.0/24": "192.168.77.5"}
    assert list(w.bad()) == [f"{PREFIX}10.5.5.0-24"]
    # One of them moves to an address of its own: both are routes
    reg.send(put(5, "192.168.77.50", 16, created=15))
    w.flush()
    assert routes(w) == {"10.5.3.0/24": "192.168.77.5", "10.5.5.0/24": "192.168.77.50"}
    assert w.bad() == {}


def test_every_host_decides_a_conflict_the_same_way_from_a_list(watcher):
    """A list (a new daemon, a re-list) sees both keys at once: the older key wins there too."""
    from dataplane.control.lease import lease_from_kv
    leases = [lease_from_kv(f"{PREFIX}10.5.3.0-24", LeaseAttrs(IPv4Address("192.168.77.5")).to_json(),
                            mod_revision=30, create_revision=30),
              lease_from_kv(f"{PREFIX}10.5.5.0-24", LeaseAttrs(IPv4Address("192.168.77.5")).to_json(),
                            mod_revision=40, create_revision=8)]
    reg, reports = FakeRegistry(leases), Reports()
    w = PeerWatcher(reg, OWN, reports, coalesce=60.0)
    w.start()
    try:
        assert w.wait_ready(5)
        assert routes(w) == {"10.5.5.0/24": "192.168.77.5"}
        assert list(w.bad()) == [f"{PREFIX}10.5.3.0-24"]
    finally:
        w.stop()


def test_an_oversized_value_is_no_lease():
    small = LeaseAttrs.from_json(b'{"PublicIP":"192.168.77.9","x":"' + b"a" * 100 + b'"}')
    assert str(small.public_ip) == "192.168.77.9"
    with pytest.raises(LeaseFormatError, match="oversized"):
        LeaseAttrs.from_json(b'{"PublicIP":"192.168.77.9","x":"' + b"a" * MAX_VALUE_BYTES + b'"}')


def test_the_bad_keys_are_answered_while_a_listing_holds_the_watcher(watcher):
    """/metrics counts them (flannel_udp_bad_leases) while the watcher applies a listing of
    16,000 leases under its lock: the answer is the one made when they last changed."""
    import threading
    w, reg = watcher()
    reg.send(put(7, OWN_IP, 12))
    w.flush()
    got = []
    with w._lock:                       # the listing's parse, in the watch thread
        asker = threading.Thread(target=lambda: got.append(w.bad()), daemon=True)
        asker.start()
        asker.join(2.0)
        answered = not asker.is_alive()
    asker.join(2.0)
    assert answered, "bad() waited for the watcher's lock"
    assert list(got[0]) == [f"{PREFIX}10.5.7.0-24"]
