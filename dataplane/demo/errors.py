"""The demo's error: the overlay did not give a step what it needs to be shown.

Raised where the demo starts things and measures them (``bringup.py``, ``probes.py``,
``story.py``); ``flannel-udp demo`` prints its message without a traceback, after
everything the demo started has been removed.
"""
from __future__ import annotations


class DemoError(RuntimeError):
    """A probe got no answer, a trace lacks the packet, an engine cannot run, ..."""
