"""How the daemon writes a moment in its log and in /readyz: a lease's expiry, in UTC."""
from __future__ import annotations

import time


def when(ts) -> str:
    if not ts:
        return "never (no TTL)"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
