"""subnet.env kept equal to the lease: written when the lease is taken or moves, and rewritten on
the daemon's tick for as long as a write fails.

The file is what the workloads' runtime reads (the flannel CNI plugin gives every new container an
address from FLANNEL_SUBNET, and, with a dual-stack lease, one from FLANNEL_IPV6_SUBNET too,
written as flanneld writes them whenever the lease has an IPv6 part). A write that failed (the directory full, read-only, removed) leaves the
old file whole, which is worse than no file when the lease moved: new containers start, with
addresses of a subnet that is now another host's. So a failed write is not a warning and done: the
file is stale until a write succeeds; meanwhile /readyz fails with a line saying so, the metric
``flannel_udp_subnet_file_stale`` is 1, and the log says what it means for workloads (once, then a
reminder a minute; control/recurring.py).
"""
from __future__ import annotations

import logging
import threading
from typing import Optional

from ..control.recurring import Recurring
from ..control.subnetfile import read_previous_subnet, write_subnet_env

log = logging.getLogger(__name__)


class SubnetEnv:
    def __init__(self, path: str, ipmasq: bool):
        self.path = path
        self.ipmasq = ipmasq
        self._lock = threading.Lock()     # guards _want and _written
        # (parts, mtu) the file must hold
        self._want: Optional[tuple] = None
        self._written = False
        self.failures = Recurring(log, f"Writing the subnet file {path}", level=logging.ERROR)

    def want(self, parts, mtu: int) -> bool:
        """The file must name the lease's subnets of ``parts`` (host/family.py Part per family,
        IPv4 first: daemon/startup.py parts) from now on: written now; True when it was."""
        with self._lock:
            self._want = (tuple(parts), int(mtu))
            self._written = False
        return self.retry()

    def retry(self) -> bool:
        """Write the file if it is stale (the daemon's tick). True when it is current."""
        with self._lock:
            want, written = self._want, self._written
        if want is None or written:
            return True
        parts, mtu = want
        subnet = parts[0].subnet
        try:
            write_subnet_env(self.path, parts, mtu, self.ipmasq)
        except OSError as e:
            self.failures.fail(f"{e.strerror or e} ({type(e).__name__})", self._consequence(subnet))
            return False
        with self._lock:
            if self._want == want:
                self._written = True
        if not self.failures.ok(f"it names {subnet} now"):
            log.info("Wrote subnet file to %s", self.path)
        return True

    def stale(self) -> Optional[str]:
        """None when the file names the lease, else why not (for /readyz)."""
        with self._lock:
            want, written = self._want, self._written
        if want is None:
            return f"{self.path} not written yet (no lease yet)"
        if written:
            return None
        cause = self.failures.cause or "not written yet"
        return (f"{self.path} does not name the lease {want[0][0].subnet}: writing it failed ({cause}); "
                "retried every second")

    def _consequence(self, subnet) -> str:
        """What the failed write means for the workloads, from what the file holds now."""
        held = read_previous_subnet(self.path)
        if held is None:
            now = (f"there is no usable {self.path}, so workloads that read it (the flannel CNI "
                   "plugin) will not start")
        elif held == subnet:
            now = f"it still names {subnet}, so workloads start with the right subnet"
        else:
            now = (f"it still names {held}, not the lease {subnet}: workloads started now get "
                   f"addresses of {held}, which do not route to this host")
        return (f"{now}; retried every second: free space or make the directory writable "
                "(/readyz fails until it is written)")
