"""--ip-blackhole-route: ``blackhole <lease subnet>`` kept on the host for as long as the daemon
runs, following the lease (the route itself, and why its metric: host/blackhole.py).

flanneld checks it every --iptables-resync seconds, the first time one period after start, and
adds it when it is missing; it never removes it. Here the first check is right after the lease is
taken (at start, and by a daemon that takes over or restarts, which finds it there and adds
nothing): there is no reason to leave the subnet without it for a period, and then every
--iptables-resync seconds on the daemon's tick. Unlike flanneld, a blackhole of a subnet the host
no longer holds is removed: on a lease move, and at start when subnet.env named another subnet,
since that subnet may be another host's by now and the blackhole would drop its traffic here.
At exit it stays, as flanneld leaves it (the log says how to remove it; `flannel-udp cleanup`
does).

A failure (netlink refuses: no CAP_NET_ADMIN, a route in the way) is logged with its cause and
what to do, then reminded at a slow pace (control/recurring.py), and retried on the next check;
it never stops the daemon: without the route the host forwards as it does without the flag.
All calls come from the daemon's main thread; `status()` is read by the status socket's.
"""
from __future__ import annotations

import errno
import logging
import os
import time
from typing import Callable, Optional

from ..control.recurring import Recurring
from ..host import blackhole

log = logging.getLogger(__name__)


def _cause(e: Exception) -> str:
    code = getattr(e, "code", None) or getattr(e, "errno", None)
    if isinstance(code, int) and code in errno.errorcode:
        return f"netlink: {os.strerror(code)} ({errno.errorcode[code]})"
    return f"{type(e).__name__}: {e}"


class BlackholeRoute:
    """The blackhole route the daemon keeps; does nothing when the flag is off. ``host`` is what
    touches the kernel (host/blackhole.py: add, remove)."""

    def __init__(self, enabled: bool, period_s: float, *, host=blackhole,
                 clock: Callable[[], float] = time.monotonic):
        self.enabled = bool(enabled)
        self.period = float(period_s)
        self._host = host
        self._clock = clock
        self.subnet = None                  # the lease's: its blackhole is kept
        self._stale: set = set()            # subnets no longer ours: their blackholes must go
        self._due = 0.0
        self.present: Optional[bool] = None     # what the last check found (or made)
        self._checked = None                # the subnet ``present`` is about
        self.added = 0                      # times it was added, the first included
        self._adding = Recurring(log, "Adding the blackhole route (--ip-blackhole-route)")
        self._removing = Recurring(log, "Removing the blackhole route of a subnet no longer ours")

    def want(self, subnet, previous=None) -> None:
        """The lease is taken (start, takeover): checked now. ``previous``, the subnet subnet.env
        named before, loses its blackhole when it is another."""
        if not self.enabled:
            return
        if previous is not None and previous != subnet:
            self._stale.add(previous)
        self._stale.discard(subnet)
        self.subnet = subnet
        self.check()

    def moved(self, old, new) -> None:
        """The host is on ``new`` now (daemon/lease_move.py): ``old``'s goes, ``new`` gets one."""
        if not self.enabled or old == new:
            return
        self._stale.add(old)
        self._stale.discard(new)
        self.subnet = new
        self.check()

    def tick(self) -> None:
        """The daemon's tick: a check once a period."""
        if self.enabled and self.subnet is not None and self._clock() >= self._due:
            self.check()

    def check(self) -> None:
        self._due = self._clock() + self.period
        for old in sorted(self._stale):
            self._remove(old)
        self._add(self.subnet)

    def _remove(self, old) -> None:
        try:
            n = self._host.remove(old)
        except Exception as e:
            self._removing.fail(
                f"{old}: {_cause(e)}", f"traffic to {old}, which may be another host's now, is "
                f"dropped here until it goes; retried every {self.period:g} s (--iptables-resync); "
                f"by hand: {blackhole.removal_command(old)}", key=(old, _cause(e)))
            return
        self._stale.discard(old)
        if not self._removing.ok(f"{old} has none now") and n:
            log.info("Removed the blackhole route of %s, a subnet this host no longer holds", old)

    def _add(self, subnet) -> None:
        before = self.present if self._checked == subnet else None     # None: a first look
        self._checked = subnet
        try:
            added = self._host.add(subnet)
        except Exception as e:
            self.present = False
            self._adding.fail(
                f"blackhole {subnet}: {_cause(e)}", "traffic to addresses of the subnet that no "
                f"workload holds is not dropped here meanwhile; retried every {self.period:g} s "
                "(--iptables-resync); the daemon needs CAP_NET_ADMIN, and `ip route show "
                f"{subnet}` lists what may be in the way", key=(subnet, _cause(e)))
            return
        self.present = True
        if self._adding.ok(f"blackhole {subnet} is in place"):
            return
        if not added:
            if before is None:
                log.info("The blackhole route of %s is in place already: kept", subnet)
            return
        self.added += 1
        if before:
            log.info("The blackhole route of %s was gone (removed by hand or by another "
                     "program): added it again", subnet)
        else:
            log.info("Added the blackhole route: blackhole %s proto %d metric %d (the lowest "
                     "priority: a bridge's route of the subnet wins over it)", subnet,
                     blackhole.PROTO, blackhole.METRIC)

    def leave(self) -> None:
        """At exit: it stays, as flanneld leaves it."""
        if self.enabled and self.subnet is not None:
            log.info("The blackhole route of %s stays (as flanneld leaves it); remove it with: %s",
                     self.subnet, blackhole.removal_command(self.subnet))

    def status(self) -> Optional[dict]:
        """For `flannel-udp status`: None when the flag is off."""
        if not self.enabled:
            return None
        return {"subnet": None if self.subnet is None else str(self.subnet),
                "present": self.present, "problem": self._adding.cause or None,
                "add_failures": self._adding.total,
                "stale": sorted(str(s) for s in self._stale)}
