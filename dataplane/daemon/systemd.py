"""Telling systemd (Type=notify) how the daemon is doing, as flanneld's SdNotify does."""
from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def sd_notify(state: str) -> bool:
    """Send ``state`` (e.g. ``READY=1``) to $NOTIFY_SOCKET; False when there is none or it fails."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(path)
            s.sendall(state.encode())
        return True
    except OSError as e:
        log.warning("could not notify systemd (%s): %s", path, e)
        return False
