"""The daemon's wait for the network config (daemon/startup.py wait_for_config) against a real etcd:
a missing key and an invalid config are waited on, retried and said, never taken
(docs/flannel-compat.md#etcd-keys)."""
from __future__ import annotations

import logging
import threading
import time
from ipaddress import IPv4Network

import pytest

from dataplane.control.config import ConfigError
from dataplane.daemon import startup

pytestmark = pytest.mark.etcd


class GaveUp(Exception):
    pass


def waiting(interval: float, limit: float):
    """A ``wait`` for wait_for_config: sleeps ``interval`` whatever it is asked, and gives up
    (GaveUp, as the daemon's Stopped) once ``limit`` seconds have passed."""
    deadline = time.monotonic() + limit

    def wait(_seconds):
        if time.monotonic() >= deadline:
            raise GaveUp()
        time.sleep(interval)
    return wait


def test_wait_for_config_retries_missing_and_invalid(shared_etcd, make_registry, caplog):
    reg = make_registry(shared_etcd, config=None)

    def writer():
        time.sleep(0.25)
        reg.put_config('{"Network":"10.5.0.0/29"}')      # invalid: retried with flanneld's message
        time.sleep(0.3)
        reg.put_config('{"Network":"10.5.0.0/16"}')

    t = threading.Thread(target=writer)
    t.start()
    with caplog.at_level(logging.WARNING, logger="dataplane.daemon.startup"):
        cfg = startup.wait_for_config(reg, waiting(0.1, 10))
    t.join()
    assert cfg.network == IPv4Network("10.5.0.0/16")
    assert "flannel config not found" in caplog.text
    assert "network is too small. Minimum useful network prefix is /28" in caplog.text


def test_wait_for_config_never_takes_an_invalid_one(shared_etcd, make_registry):
    reg = make_registry(shared_etcd, config='{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}')
    with pytest.raises(ConfigError):
        reg.get_config()
    with pytest.raises(GaveUp):
        startup.wait_for_config(reg, waiting(0.05, 0.2))
