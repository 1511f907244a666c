"""The host's forwarding sysctls, watched: said at start, reminded while off, said when on.

A warning, not one of the preflight's errors (daemon/preflight.py): on a Kubernetes node the CNI
``bridge`` plugin switches forwarding on when it makes the first pod's gateway, and that pod
waits for subnet.env, which the daemon writes; a start refused for forwarding off would never
let that pod come. The host's own traffic over flannel0 needs no forwarding either. And the daemon
does not switch a host-wide sysctl itself: IPv6 forwarding changes how every interface takes
router advertisements (host/forwarding.py ``fix``).

So the daemon reads ``net.ipv4.ip_forward`` (always: it forwards the pods' IPv4) and, with
``EnableIPv6``, ``net.ipv6.conf.all.forwarding`` on its tick. While one is off the log has one
WARNING naming the family, what it means (the pods' packets of that family stop at this host,
silently) and the fix, then a reminder at the slow pace of control/recurring.py, and one line
when it is on; ``flannel_udp_host_forwarding{family}`` is 0 meanwhile and `flannel-udp status`
has a ``forwarding`` row.
"""
from __future__ import annotations

import logging
import threading

from ..control.recurring import Recurring
from ..host import forwarding

log = logging.getLogger(__name__)

FAMILY = {4: "ipv4", 6: "ipv6"}


class HostForwarding:
    def __init__(self, read=forwarding.enabled, ra_interfaces=forwarding.ra_interfaces):
        self._read, self._ra_interfaces = read, ra_interfaces
        self._lock = threading.Lock()
        self._versions: tuple = ()
        self._state: dict = {}          # {"ipv4": True, "ipv6": False} at the last check
        self.off = Recurring(log, "Host forwarding")

    def want(self, ipv6: bool) -> None:
        """The families the daemon forwards from now on (IPv4, and IPv6 with EnableIPv6);
        checked at once."""
        with self._lock:
            self._versions = (4, 6) if ipv6 else (4,)
        self.check()

    def check(self) -> None:
        """Read the sysctls (the daemon's tick); log as control/recurring.py paces it."""
        with self._lock:
            versions = self._versions
        state = {v: self._read(v) for v in versions}
        with self._lock:
            self._state = {FAMILY[v]: on for v, on in state.items() if on is not None}
        off = [v for v, on in state.items() if on is False]
        if not off:
            self.off.ok("the pods' packets are forwarded")
            return
        keys = " and ".join(forwarding.SYSCTL[v] for v in off)
        families = " and ".join(f"IPv{v}" for v in off)
        key = tuple(off)
        # the fix is said on the first line of a new state only (reminders do not repeat it):
        # asked of the kernel only then
        advice = "" if self.off.key == key else self._advice(off)
        self.off.fail(
            f"{keys} {'is' if len(off) == 1 else 'are'} 0: this host does not forward, so its "
            f"pods' {families} packets to and from flannel0 stop here without an error",
            advice, key=key)

    def _advice(self, off: list) -> str:
        ra = self._ra_interfaces() if 6 in off else ()
        return ("fix: " + "; ".join(forwarding.fix(v, ra) for v in off)
                + ", and in /etc/sysctl.d/ to keep it across reboots (the daemon changes no "
                "host-wide sysctl; the CNI bridge plugin switches them on with a pod's gateway)")

    def status(self) -> dict:
        """{"ipv4": on, "ipv6": on} for the families checked (empty before the config is read)."""
        with self._lock:
            return dict(self._state)
