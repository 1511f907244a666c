"""Telling systemd (Type=notify) how the daemon is doing, as flanneld's SdNotify does; with ``fds``,
handing it file descriptors too (its fd store, daemon/fdstore.py)."""
from __future__ import annotations

import array
import logging
import os
import socket

log = logging.getLogger(__name__)


def sd_notify(state: str, fds=()) -> bool:
    """Send ``state`` (e.g. ``READY=1``) to $NOTIFY_SOCKET, with ``fds`` attached (SCM_RIGHTS) when
    given; False when there is none or it fails."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(path)
            if fds:
                s.sendmsg([state.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                              array.array("i", fds))])
            else:
                s.sendall(state.encode())
        return True
    except OSError as e:
        log.warning("could not notify systemd (%s): %s", path, e)
        return False
