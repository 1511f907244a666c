"""Following the network config while the daemon runs, to say what a change means.

The daemon applies the config it read at start, as flanneld does: flannel0's route, the lease length,
the port and where the firewall rules live (EnableNFTables) cannot change under running workloads. A
config changed, broken or deleted in etcd later is therefore not applied, but it must not go unnoticed
either: each new state of `<prefix>/config` is logged once (naming the key and the problem, in a bounded
line), and `mismatch` says whether etcd holds something other than the running config (exported as
flannel_udp_config_mismatch). Forwarding never depends on this watch.
"""
from __future__ import annotations

import logging
import threading
from typing import Optional

from .config import ConfigError, NetworkConfig, parse_config
from .etcd_watch import WatchLoop, read_then_watch
from .registry import Registry

log = logging.getLogger(__name__)


def config_changes(old: NetworkConfig, new: NetworkConfig) -> list[str]:
    """What differs between two valid configs, in the operator's field names."""
    # Every key this daemon acts on is here: one left out would make its change read as "matches
    # the running config" while the daemon keeps the old value until a restart.
    fields = (("Network", "network"), ("SubnetLen", "subnet_len"), ("SubnetMin", "subnet_min"),
              ("SubnetMax", "subnet_max"), ("Backend Type", "backend_type"), ("Port", "backend_port"),
              ("DirectRouting", "direct_routing"), ("EnableNFTables", "enable_nftables"),
              ("EnableIPv4", "enable_ipv4"), ("EnableIPv6", "enable_ipv6"),
              ("IPv6Network", "ipv6_network"), ("IPv6SubnetLen", "ipv6_subnet_len"),
              ("IPv6SubnetMin", "ipv6_subnet_min"), ("IPv6SubnetMax", "ipv6_subnet_max"))
    out = []
    for label, attr in fields:
        a, b = getattr(old, attr), getattr(new, attr)
        if attr == "backend_type":
            a, b = str(a).lower(), str(b).lower()
        if a != b:
            out.append(f"{label} {a} -> {b}")
    return out


class ConfigWatcher:
    def __init__(self, registry: Registry, running: NetworkConfig, *, retry_interval: float = 1.0):
        self.registry = registry
        self.running = running
        self.retry_interval = retry_interval
        self.mismatch = False
        self._said: Optional[str] = None
        self._stop = threading.Event()
        self._watch: Optional[WatchLoop] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "ConfigWatcher":
        self._thread = threading.Thread(target=self._run, name="config-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.cancel()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def watch_loop(self) -> Optional[WatchLoop]:
        return self._watch

    def _summary(self) -> str:
        c = self.running
        return f"Network {c.network}, SubnetLen {c.subnet_len}, backend udp port {c.backend_port}"

    def check(self, value: Optional[bytes]) -> None:
        """Judge what etcd holds now (None: no key) against the running config; log a new state."""
        key = self.registry.config_key
        keeps = f"flannel-udp keeps running with the config it started with ({self._summary()})"
        if value is None:
            msg = (f"The network config at {key} was deleted; {keeps}; a daemon that starts now "
                   "waits until one is put back")
        else:
            try:
                changes = config_changes(self.running, parse_config(value))
            except ConfigError as e:
                msg = f"The network config at {key} is invalid now: {e}; {keeps}; fix it with etcdctl put"
            else:
                msg = None if not changes else (
                    f"The network config at {key} changed: {', '.join(changes)}; {keeps}: a config "
                    "is applied only at start (as flanneld), restart the daemons to apply it")
        self.mismatch = msg is not None
        if msg == self._said:
            return
        if msg is None:
            log.info("The network config at %s matches the running config again", key)
        else:
            log.warning("%s", msg)
        self._said = msg

    def _read(self) -> int:
        kvs, rev = self.registry.get(self.registry.config_key)
        self.check(kvs[0].value if kvs else None)
        return rev

    def _on_events(self, events, _revision) -> None:
        last = events[-1]                       # only the latest state matters
        self.check(None if last.kind == "delete" else last.value)

    def _run(self) -> None:
        read_then_watch(
            self.registry, self.registry.config_key, prefix=False, read=self._read,
            on_events=self._on_events, stop=self._stop, on_watch=self._set_watch,
            retry_interval=self.retry_interval, name="config")

    def _set_watch(self, watch: WatchLoop) -> None:
        self._watch = watch
