"""daemon/listing_ahead.py: a fresh start's lease listing made in a thread, taken by the lease
manager's first listing; any later one, or one after a failed listing, asks etcd."""
from __future__ import annotations

import threading

from dataplane.control.etcd_errors import RegistryUnavailableError
from dataplane.daemon import listing_ahead


class Registry:
    """A stand-in for control/registry.py: counts its listings."""
    subnets_prefix = "/coreos.com/network/subnets/"

    def __init__(self, fail=False, gate=None):
        self.calls, self.fail, self.gate = [], fail, gate

    def list_leases(self, with_ttl=False, malformed=None):
        if self.gate is not None:
            self.gate.wait(5)
        self.calls.append(with_ttl)
        if self.fail:
            raise RegistryUnavailableError("etcd away")
        if malformed is not None:
            malformed.append(f"bad{len(self.calls)}")
        return [f"lease{len(self.calls)}"], len(self.calls)


def test_the_first_listing_is_the_one_made_ahead_and_the_next_ones_ask_etcd():
    gate = threading.Event()
    reg = Registry(gate=gate)
    ahead = listing_ahead.start(reg, None)
    managed = listing_ahead.registry_for(reg, ahead)
    threading.Timer(0.05, gate.set).start()
    bad = []
    assert managed.list_leases(malformed=bad) == (["lease1"], 1)     # waits for the thread
    assert bad == ["bad1"] and reg.calls == [False]
    assert managed.list_leases() == (["lease2"], 2)
    assert managed.list_leases(True) == (["lease3"], 3) and reg.calls == [False, False, True]
    assert managed.subnets_prefix == reg.subnets_prefix               # the rest is the registry's


def test_a_failed_listing_is_made_again_where_its_error_is_said():
    reg = Registry(fail=True)
    managed = listing_ahead.registry_for(reg, listing_ahead.start(reg, None))
    reg_error = None
    try:
        managed.list_leases(malformed=[])
    except RegistryUnavailableError as e:
        reg_error = e
    assert reg_error is not None and reg.calls == [False, False]


def test_a_takeover_lists_nothing_ahead():
    reg = Registry()
    assert listing_ahead.start(reg, inherited=object()) is None
    assert listing_ahead.registry_for(reg, None) is reg and reg.calls == []
