"""What the daemon holds of the peer watch, whichever runs it: the interface that PeerWatcher
(control/peers.py, a thread) and PeerWatchProcess (control/peer_process.py, a child process, for
the Python engine) both offer, declared once.

The daemon builds either with the same arguments (registry, own subnet, ``on_change``; by keyword
``retry_interval``, ``network``, ``coalesce``, ``own_ips``, ``listing``: a listing made already,
which the thread's watch reports first and the child process ignores) and then uses only what is below; the
integration tests run each of their cases on both. ``on_change`` gets the same ``PeerChange``
reports (control/peerset.py) in the same order from either. tests/unit/test_peer_watch_contract.py
holds both classes to it.
"""
from __future__ import annotations

import threading
from ipaddress import IPv4Network
from typing import Optional, Protocol, runtime_checkable

from .lease import Lease
from .peerset import PeerSnapshot


@runtime_checkable
class WatchStatus(Protocol):
    """What /readyz and /metrics read of an etcd watch (control/etcd_watch.py WatchLoop, or the
    child's as the daemon mirrors it)."""

    @property
    def connected(self) -> threading.Event:
        """Set while a stream is established."""

    @property
    def reconnects(self) -> int:
        """Streams broken and opened again (a child replaced counts as one)."""

    @property
    def resyncs(self) -> int:
        """Re-lists after a compacted or rewound cursor."""


@runtime_checkable
class PeerWatch(Protocol):
    """The other nodes' leases, kept equal to etcd and reported to ``on_change``."""

    @property
    def ready(self) -> threading.Event:
        """Set once the first listing is reported."""

    @property
    def watch_loop(self) -> Optional[WatchStatus]:
        """The watch of the subnets prefix; None before it first opens."""

    @property
    def bad_total(self) -> int:
        """Distinct (key, problem) pairs skipped since start."""

    @property
    def revision(self) -> int:
        """The last etcd revision applied."""

    @property
    def snapshots(self) -> int:
        """Listings reported (the first, re-lists, own subnet changes)."""

    @property
    def batches(self) -> int:
        """Reports of watch events."""

    def start(self) -> None:
        """List, then watch, in the background."""

    def stop(self, timeout: float = 10.0) -> None:
        """End the watch; on_change is not called after this returns."""

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Wait for ``ready``; False after ``timeout`` s."""

    def set_own_subnet(self, subnet: Optional[IPv4Network]) -> None:
        """Our lease moved: on_change gets one report for the new subnet before this returns."""

    def flush(self) -> None:
        """Report the events applied so far now, not after the coalescing wait."""

    def peers(self) -> dict[IPv4Network, Lease]:
        """The peers of the last report, by subnet."""

    def snapshot(self) -> PeerSnapshot:
        """The last report's snapshot."""

    def bad(self) -> dict[str, str]:
        """{key: problem} of the keys skipped now: no lease, or a lease in conflict."""
