"""When a daemon's route table reaches a size: its /metrics peer count, watched from inside its host.

The daemon's /metrics listens in the host's namespace, out of the caller's reach, and a process per
look would be both slow and coarse; so :class:`PeerCount` runs one small child in the host that
polls ``flannel_udp_peers`` every ``period`` seconds and prints ``<time.time()> <count>`` each time
the count changes, until it reaches the target (``>=`` for puts, ``<=`` for deletes) or
``timeout`` passes. The child is started through the testbed (tracked by PID, removed with it).
"""
from __future__ import annotations

import sys
import threading
import time

PERIOD_S = 0.05

_CHILD = r"""
import re, sys, time, urllib.request
url, cmp, target, deadline = sys.argv[1], sys.argv[2], int(sys.argv[3]), time.time() + float(sys.argv[4])
period, last = float(sys.argv[5]), None
while time.time() < deadline:
    try:
        body = urllib.request.urlopen(url, timeout=2).read().decode()
        n = int(float(re.search(r"^flannel_udp_peers (\S+)$", body, re.M).group(1)))
    except Exception:
        n = None
    if n is not None and n != last:
        last = n
        print(time.time(), n, flush=True)
        if (n >= target) if cmp == "ge" else (n <= target):
            break
    time.sleep(period)
"""


class PeerCount:
    """Watches the daemon of ``host`` on an :class:`~dataplane.testbed.overlay.Overlay` until its
    peer count is ``>= target`` (``cmp="ge"``) or ``<= target`` (``"le"``)."""

    def __init__(self, overlay, host, cmp: str, target: int, timeout: float, period: float = PERIOD_S):
        if cmp not in ("ge", "le"):
            raise ValueError(f"cmp must be 'ge' or 'le', not {cmp!r}")
        self.cmp, self.target = cmp, int(target)
        self.seen: list[tuple[float, int]] = []       # (wall-clock time, count) at each change
        self._cond = threading.Condition()
        self._done = False
        url = f"http://127.0.0.1:{overlay.healthz_port}/metrics"
        self._tb = overlay.tb
        self.proc = overlay.tb.popen(host, [sys.executable, "-c", _CHILD, url, cmp, str(self.target),
                                            str(timeout), str(period)])
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            t, n = line.split()
            with self._cond:
                self.seen.append((float(t), int(n)))
                self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def _hit(self):
        for t, n in self.seen:
            if (n >= self.target) if self.cmp == "ge" else (n <= self.target):
                return t
        return None

    def wait_first(self, timeout: float = 10.0) -> bool:
        """True once the child has reported the count as it is now (call before changing it)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.seen or self._done, timeout) and bool(self.seen)

    def reached(self, timeout: float):
        """The wall-clock time the count reached the target, or None (not within ``timeout``,
        or the child gave up)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._hit() is None and not self._done:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._hit()

    def close(self) -> None:
        """Stop watching (the child is killed by PID)."""
        self._tb.kill(self.proc)
