"""The daemon's state as its reports read it (dataplane/daemon/state.py) and the collector that
DECLARED drives (dataplane/daemon/metrics.py), no root, no etcd: every series has one source of
samples, a scrape asks the source once per value, the daemon's fields live in its state, and the
status document says what /readyz says.
"""
from __future__ import annotations

import threading
import time
from dataclasses import fields
from ipaddress import IPv4Address, IPv4Network, IPv6Network
from types import SimpleNamespace

from prometheus_client import generate_latest

from dataplane.control.direct import DirectRouting
from dataplane.host.family import V6
from dataplane.control.lease import Lease, LeaseAttrs
from dataplane.control.peerset import PeerSnapshot
from dataplane.control.routes import Ipv6Parts
from dataplane.daemon import status
from dataplane.daemon.main import Daemon
from dataplane.daemon.metrics import DECLARED, ENGINE_COUNTERS, MetricsSource, make_registry
from dataplane.daemon.options import Options
from dataplane.daemon.state import DaemonSource, DaemonState


def test_every_declared_series_has_one_source_of_samples():
    """A row reads its value off the source, or is one the engine's counters land on."""
    engine_families = {family for family, _ in ENGINE_COUNTERS.values()}
    for f in DECLARED:
        assert (f.read is None) == (f.name in engine_families), f.name


def test_a_scrape_asks_the_source_once_per_value():
    class Counting(MetricsSource):
        def __init__(self):
            self.asked = {}

        def __getattribute__(self, name):
            attr = object.__getattribute__(self, name)
            if callable(attr) and not name.startswith("_"):
                asked = object.__getattribute__(self, "asked")
                asked[name] = asked.get(name, 0) + 1
            return attr

        def etcd_watches(self):
            return {"subnets": {"connected": True, "reconnects": 1, "resyncs": 2}}

        def lease_counts(self):
            return {"renewals": 3}

        def subnet_file(self):
            return False, 4

        def bad_leases(self):
            return 1, 5

    src = Counting()
    reg = make_registry(src, standard=False)
    for _ in range(2):
        text = generate_latest(reg).decode()
    assert 'flannel_udp_etcd_watch_resyncs_total{watch="subnets"} 2.0' in text
    assert "flannel_udp_lease_renew_failures_total 0.0" in text
    assert "flannel_udp_bad_leases_seen_total 5.0" in text
    # three families read the etcd watches, four the lease counts: still one call a scrape
    assert src.asked["etcd_watches"] == src.asked["lease_counts"] == 2, src.asked
    assert all(n == 2 for n in src.asked.values()), src.asked


def test_each_fact_of_the_daemons_state_has_one_name():
    """The daemon holds its state: none of the state's fields is a daemon attribute too."""
    d = Daemon(Options())
    assert not {f.name for f in fields(DaemonState)} & set(dir(d))
    d.state.engine = SimpleNamespace(ended=lambda: {})
    d.state.lease = SimpleNamespace(subnet=IPv4Network("10.5.3.0/24"), expiration=None)
    assert d.state.current_lease() is d.state.lease
    # the reports are handed the state alone
    assert DaemonSource(d.state).readiness() == d.source.readiness()
    assert d.source.readiness()["lease"] is None and d.source.readiness()["engine"] is None


def test_the_status_document_says_what_readyz_says(tmp_path):
    d = Daemon(Options(subnet_file=str(tmp_path / "subnet.env"),
                       status_socket=str(tmp_path / "status.sock")))
    doc = status.document(d.state, d.source)
    assert doc["checks"] == d.source.readiness() and doc["ready"] is False
    assert doc["lease"] is None and doc["engine"] is None and doc["tun"] is None
    d.state.dataplane.tun_name = "flannel0"
    d.state.lease = SimpleNamespace(subnet=IPv4Network("10.5.3.0/24"),
                              public_ip="192.168.77.1", expiration=time.time() + 60,
                              reservation=False, ipv6_subnet=None,
                              attrs=SimpleNamespace(public_ipv6=None))
    doc = status.document(d.state, d.source)
    assert doc["tun"] == "flannel0" and doc["lease"]["subnet"] == "10.5.3.0/24"
    assert doc["lease"]["ipv6_subnet"] is None and doc["lease"]["public_ipv6"] is None
    assert doc["checks"]["lease"] is None


def test_a_bare_state_has_nothing_to_report_yet():
    st = DaemonState(Options(), subnet_env=SimpleNamespace(stale=lambda: None),
                     move_failures=SimpleNamespace(total=0), blackhole=None)
    src = DaemonSource(st)
    assert src.engine_queue_stats() is None and src.queues_count() == 0
    assert src.peers_count() == 0 and src.peers_by_mode() == {}
    assert src.peers_ipv6() is None and src.peers_ipv6_by_mode() == {}


def test_peers_ipv6_counts_the_parts_the_engines_route_by_their_mode():
    own = IPv4Network("10.5.1.0/24")
    net6 = IPv6Network("fc00:5::/56")

    def lease(n, part, forwards=True):
        return Lease(IPv4Network(f"10.5.{n}.0/24"),
                     LeaseAttrs(IPv4Address(f"192.168.77.{n}"), direct_routing=True,
                                forwards_ipv6=forwards),
                     ipv6_subnet=IPv6Network(part) if part else None)
    leases = [lease(2, "fc00:5:0:2::/64"), lease(3, "fc00:5:0:3::/64"),
              lease(4, "fc00:5:0:4::/64", forwards=False),       # its host forwards no IPv6
              lease(5, "fc00:9::/64"),                           # outside IPv6Network
              lease(6, None)]                                    # no IPv6 part
    st = DaemonState(Options(), subnet_env=SimpleNamespace(stale=lambda: None),
                     move_failures=SimpleNamespace(total=0), blackhole=None,
                     config=SimpleNamespace(ipv6_network=net6),
                     peers={4: PeerSnapshot(), 6: PeerSnapshot.of(leases, own)})
    st.direct = DirectRouting(False, lambda ip: True,
                              ipv6_part=Ipv6Parts(net6, IPv6Network("fc00:5:0:1::/64")).why_not)
    src = DaemonSource(st)
    assert src.peers_ipv6() == 2 and src.peers_ipv6_by_mode() == {}
    st.direct.enabled = True
    st.direct.direct[V6] = {leases[0].subnet: leases[0]}
    assert src.peers_ipv6_by_mode() == {"direct": 1, "encapsulated": 1}
    st.config = SimpleNamespace(ipv6_network=None)                 # IPv6 off: no series
    assert src.peers_ipv6() is None and src.peers_ipv6_by_mode() == {}
    assert src.readiness()["engine"] == "not started yet"


class _Engine:
    """An engine's stats as the daemon reads them; closed: raises as a closed engine does."""

    def __init__(self, packets):
        self.packets, self.closed = packets, False

    def stats(self):
        if self.closed:
            raise OSError(9, "engine is closed")
        return {"tun_rx_packets": self.packets}

    def offloads_in_use(self):
        self.stats()
        return self.packets


def _bare_source():
    st = DaemonState(Options(), subnet_env=SimpleNamespace(stale=lambda: None),
                     move_failures=SimpleNamespace(total=0), blackhole=None)
    return st, DaemonSource(st)


def test_engine_stats_do_not_wait_for_a_table_being_published():
    # the peers' publisher holds state.lock while the engine takes a burst's table (the kernel
    # path writes its maps then): /metrics and status read the engine meanwhile
    st, src = _bare_source()
    st.engine = _Engine(7)
    st.offloads = SimpleNamespace(enabled=lambda bits: {"in_use": bits})
    got, held, done = [], threading.Event(), threading.Event()

    def publisher():
        with st.lock:
            held.set()
            done.wait(5)

    t = threading.Thread(target=publisher)
    t.start()
    try:
        held.wait(5)
        reader = threading.Thread(target=lambda: got.extend(
            [src.engine_queue_stats(), src.engine_stats(), src.offloads_enabled()]))
        reader.start()
        reader.join(2)
        assert got == [[{"tun_rx_packets": 7}], {"tun_rx_packets": 7}, {"in_use": 7}]
    finally:
        done.set()
        t.join()


def test_an_engine_closed_while_read_gives_the_one_that_replaced_it():
    st, src = _bare_source()
    old, new = _Engine(1), _Engine(2)
    st.engine = old
    old.closed = True

    class Replacing:
        """state.lock as the daemon holds it while it swaps engines"""
        def __enter__(self):
            st.engine = new

        def __exit__(self, *exc):
            return False

    st.lock = Replacing()
    assert src.engine_queue_stats() == [{"tun_rx_packets": 2}]
    st.engine, old.closed = old, True
    assert src.engine_stats() == {"tun_rx_packets": 2}


def test_routed_ipv6_parts_are_decided_once_per_lease():
    from dataplane.daemon.state import RoutedParts
    net6 = IPv6Network("fc00:5::/48")

    def lease(n, forwards=True):
        return Lease(IPv4Network(f"10.5.{n}.0/24"),
                     LeaseAttrs(IPv4Address(f"192.168.77.{n}"), forwards_ipv6=forwards),
                     ipv6_subnet=IPv6Network(f"fc00:5:0:{n:x}::/64"))

    asked = []

    def why_not(l):
        asked.append(l.subnet)
        return None if l.attrs.forwards_ipv6 else "no ForwardsIPv6"

    leases = {l.subnet: l for l in [lease(2), lease(3), lease(4, forwards=False)]}
    first = SimpleNamespace(peers=dict(leases))
    parts = RoutedParts()
    assert parts.count(first, ("rule", net6), why_not) == 2 and len(asked) == 3
    assert parts.count(first, ("rule", net6), why_not) == 2 and len(asked) == 3
    # a change: one lease more, one gone: only the new one is decided
    new = lease(5)
    second = SimpleNamespace(peers={**{k: v for k, v in leases.items() if k.network_address.packed[2] != 2},
                                    new.subnet: new})
    assert parts.count(second, ("rule", net6), why_not) == 2
    assert asked[3:] == [new.subnet]
    # a lease replaced by an equal one is another object: decided again
    again = lease(3)
    third = SimpleNamespace(peers={**second.peers, again.subnet: again})
    assert parts.count(third, ("rule", net6), why_not) == 2 and asked[4:] == [again.subnet]
    # another rule (our own part moved): every lease again
    assert parts.count(third, ("rule", None), why_not) == 2 and len(asked) == 8
