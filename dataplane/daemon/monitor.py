"""The serve loop's periodic checks, and how often each finding is logged.

Every MONITOR_PERIOD_S, and at once when an engine loop ends (engine.on_end wakes the serve loop),
the daemon asks: has an engine loop ended - flannel0 deleted (its queues read EBADFD) or anything
else; both exit with status 1 so that the service manager restarts the daemon, the lease kept -,
did the engine turn an offload off (UDP GSO when the kernel cannot segment), and what did the
engine drop. Datagrams from sources with no lease (they point at NAT between peers) and datagrams
whose inner source is this host's own (forged: docs/threat-model.md) are logged at most every 10 s
each; with -v the other drops too, as deltas over the same period.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

from ..engine import OFF_UDP_GSO

log = logging.getLogger(__name__)

MONITOR_PERIOD_S = 1.0
DROP_LOG_EVERY_S = 10.0
# Drops worth a warning without -v: the datagrams they count, and what to make of them.
WARNED_DROPS = {
    "drop_bad_source": "from sources that hold no lease ({total} in total): if peers reach this "
                       "host through address translation (NAT), run with --accept-from any",
    "drop_inner_local": "whose inner source is this host's own ({total} in total): forged on the "
                        "underlay with a lease's PublicIP, or a local pod's packet a peer sent "
                        "back without masquerading (docs/threat-model.md)",
}


class Monitor:
    def __init__(self, verbose: int = 0, clock=time.monotonic, offloads: int = 0):
        self.verbose = verbose
        self._clock = clock
        self._offloads = offloads             # the OFF_* bits in use at the last check
        self._warned = {stat: (0, 0.0) for stat in WARNED_DROPS}   # count and time last logged
        self._last_drops: Optional[dict] = None
        self._last_drop_log = clock()

    def check(self, engine, tun_name: str, on_purpose=lambda: False) -> Optional[int]:
        """The exit status when the daemon must stop, else None (after logging what it saw).
        ``on_purpose()`` says whether the engine was stopped on purpose (a handover, or a
        replacement): it is asked after the engine said it ended, because whoever stops an
        engine on purpose says so first, and the serve loop may have looked before that."""
        ended = engine.ended()
        if ended:
            if on_purpose():
                return None
            return self._ended(engine, tun_name, ended)
        try:
            stats = engine.stats()
            self._log_offloads_off(engine.offloads_in_use())
        except Exception:
            return None
        now = self._clock()
        self._log_warned(stats, now)
        if self.verbose >= 1:
            self._log_drops(stats, now)
        return None

    @staticmethod
    def _ended(engine, tun_name: str, ended: dict) -> int:
        gone = [i for i, why in ended.items() if why.tun_gone]
        if gone:
            log.error("%s was deleted from under the daemon (queue(s) %s: %s): nothing can be "
                      "forwarded; exiting with status 1 so that the service manager restarts the "
                      "daemon (the lease is kept)", tun_name, ", ".join(map(str, gone)),
                      ended[gone[0]])
        else:
            log.error("The %s forwarding engine stopped unexpectedly (queue(s) %s of %d); "
                      "exiting so that the service manager restarts the daemon (the lease "
                      "is kept)", engine.name,
                      ", ".join(f"{i}: {why}" for i, why in ended.items()), len(engine))
        return 1

    def _log_offloads_off(self, in_use: int) -> None:
        if self._offloads & OFF_UDP_GSO and not in_use & OFF_UDP_GSO:
            log.warning("UDP GSO is off from now on: the kernel cannot segment on this path "
                        "(EIO), so datagrams go out one by one (flannel_udp_offload_enabled"
                        '{offload="udp_gso"} is 0)')
        self._offloads = in_use

    def _log_warned(self, stats: dict, now: float) -> None:
        for stat, what in WARNED_DROPS.items():
            total = stats.get(stat, 0)
            last, last_log = self._warned[stat]
            if total > last and now - last_log >= DROP_LOG_EVERY_S:
                log.warning("Dropped %d datagram(s) %s", total - last, what.format(total=total))
                self._warned[stat] = (total, now)

    def _log_drops(self, stats: dict, now: float) -> None:
        if now - self._last_drop_log < DROP_LOG_EVERY_S:
            return
        drops = {k: v for k, v in stats.items() if k.startswith("drop_") and v}
        if self._last_drops is not None:
            delta = {k: v - self._last_drops.get(k, 0) for k, v in drops.items()
                     if v > self._last_drops.get(k, 0)}
            if delta:
                log.info("Drops in the last %.0f s: %s", now - self._last_drop_log,
                         ", ".join(f"{k[5:]}={v}" for k, v in sorted(delta.items())))
        self._last_drops, self._last_drop_log = drops, now
