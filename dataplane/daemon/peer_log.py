"""How peer changes reach the log: a line per lease while changes are rare, a summary during a burst.

A host joining or leaving gets its own INFO line at once, in flanneld's words (``Subnet added:
<subnet>``, ``Subnet removed: <subnet>``, then what flannel-udp adds), as long as the window (1 s)
has had fewer than ``BUDGET`` such lines. Beyond that (an autoscaling event, an etcd restore: thousands of leases
within seconds) the changes are folded into one INFO summary written when the window ends: how many
peers were added and removed, in how many reports, the route table's size, and the first and last
few leases of each kind. So a burst of 1,000 adds writes a handful of lines, not thousands
(journald's default rate limit is 10,000 lines per 30 s, and a flood hides everything else). With
`-v=2` each folded lease also gets a DEBUG line.

Not thread-safe on its own: the daemon calls ``record`` with the peer watcher's reports, which come
one at a time, and ``tick`` from its main loop, both under the daemon's lock.
"""
from __future__ import annotations

import collections
import logging
import time

from ..control.direct import DIRECT, ENCAPSULATED
from ..host.family import V4, V6

log = logging.getLogger(__name__)

WINDOW_S = 1.0      # at most one summary per window
BUDGET = 5          # lines per window for single leases before they are folded into the summary
DETAIL = 3          # leases named at each end of a summary


class PeerLog:
    def __init__(self, port: int, clock=time.monotonic, window: float = WINDOW_S):
        self.port = port
        self._clock = clock
        self.window = window
        self._window_end = 0.0
        self._lines = 0             # INFO lines in the current window
        self._reset()

    def _reset(self) -> None:
        self._reports = 0
        self._first_at = self._last_at = None
        self._size = 0
        self._counts = {"added": 0, "removed": 0}
        self._first = {"added": [], "removed": []}
        self._last = {"added": collections.deque(maxlen=DETAIL),
                      "removed": collections.deque(maxlen=DETAIL)}

    def record(self, change, table_size: int, direct=None) -> None:
        """One report of the peer watcher, applied; ``table_size``: routes in the engine's table
        now; ``direct`` (control/direct.py DirectRouting): which way each added peer goes, said
        when DirectRouting is on."""
        if not change:
            return
        now = self._clock()
        self.tick(now)
        n = len(change.added) + len(change.removed)
        if not self._reports and self._lines + n <= BUDGET:
            # flanneld's udp backend says "Subnet added: <subnet>" and "Subnet removed:
            # <subnet>": the lines start with its words, for the greps and alerts written for it
            for lease in change.removed:
                log.info("Subnet removed: %s (was via %s); %d peer(s) in the route table",
                         lease.subnet, lease.public_ip, table_size,
                         extra=self._fields(lease, "removed", table_size))
            for lease in change.added:
                fields = self._fields(lease, "added", table_size)
                on = direct is not None and direct.enabled
                six = _ipv6_way(direct, lease) if on else ""
                if on and direct.mode(lease.subnet, V4) == DIRECT:
                    fields["mode"] = DIRECT
                    log.info("Subnet added: %s via %s, a direct route (DirectRouting: on this "
                             "host's link)%s; %d peer(s) through flannel0", lease.subnet,
                             lease.public_ip, six, table_size, extra=fields)
                    continue
                why = (direct.why_not(lease, V4) or "its lease changed meanwhile") if on else ""
                if why:
                    fields["mode"] = ENCAPSULATED
                log.info("Subnet added: %s via %s:%d%s%s; %d peer(s) in the route table",
                         lease.subnet, lease.public_ip, self.port,
                         f", encapsulated: {why}" if why else "", six, table_size, extra=fields)
            self._lines += n
            return
        debug = log.isEnabledFor(logging.DEBUG)     # a listing folds thousands of leases
        for kind, leases in (("removed", change.removed), ("added", change.added)):
            for lease in leases if debug else ():
                log.debug("Subnet %s: %s via %s", kind, lease.subnet, lease.public_ip,
                          extra=self._fields(lease, kind))
            self._counts[kind] += len(leases)
            self._first[kind].extend(leases[:DETAIL - len(self._first[kind])])
            self._last[kind].extend(leases[-DETAIL:])
        if self._first_at is None:
            self._first_at = now
        self._last_at = now
        self._reports += 1
        self._size = table_size

    def tick(self, now: float | None = None) -> None:
        """End the window when its time is up, with the summary of what was folded in it (the
        daemon calls this every second)."""
        now = self._clock() if now is None else now
        if now < self._window_end:
            return
        self._lines = 0
        if self._reports:
            self._summary()
            self._lines = 1
        self._window_end = now + self.window

    def _summary(self) -> None:
        parts = []
        for kind in ("added", "removed"):
            n = self._counts[kind]
            if not n:
                continue
            first, last = self._first[kind], list(self._last[kind])[max(0, DETAIL - (n - DETAIL)):]
            named = ", ".join(self._name(lease, kind) for lease in first)
            if last:
                named += (", ..., " if n > 2 * DETAIL else ", ") + \
                    ", ".join(self._name(lease, kind) for lease in last)
            parts.append(f"{n} {kind} ({named})")
        log.info("Peers changed: %s in %d update(s) over %.2f s; %d peer(s) in the route table",
                 "; ".join(parts), self._reports, self._last_at - self._first_at, self._size,
                 extra={"event": "peers_changed", "added": self._counts["added"],
                        "removed": self._counts["removed"], "updates": self._reports,
                        "peers": self._size})
        self._reset()

    def _fields(self, lease, kind: str, table_size: int | None = None) -> dict:
        """A lease's event as fields of a json log line."""
        out = {"event": f"subnet_{kind}", "subnet": str(lease.subnet),
               "public_ip": str(lease.public_ip)}
        if kind == "added":
            out["port"] = self.port
        if table_size is not None:
            out["peers"] = table_size
        return out

    def _name(self, lease, kind: str) -> str:
        if kind == "added":
            return f"{lease.subnet} via {lease.public_ip}"
        return str(lease.subnet)


def _ipv6_way(direct, lease) -> str:
    """The way of the lease's IPv6 part with DirectRouting on, when it has a part to route."""
    part = lease.ipv6_subnet
    if direct.mode(lease.subnet, V6) == DIRECT:
        return f"; its IPv6 part {part} via {lease.attrs.public_ipv6}, a direct route"
    if part is None or direct.ipv6_part(lease) is not None:
        return ""
    why = direct.why_not(lease, V6) or "its lease changed meanwhile"
    return f"; its IPv6 part {part} through flannel0: {why}"
