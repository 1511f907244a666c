"""Telling systemd (Type=notify) how the daemon is doing, as flanneld's SdNotify does; with ``fds``,
handing it file descriptors too (its fd store, daemon/fdstore.py); whether its watchdog waits for
WATCHDOG=1 from us (:func:`watchdog_usec`; daemon/liveness.py sends it)."""
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


def watchdog_usec() -> int:
    """$WATCHDOG_USEC when systemd's watchdog waits for WATCHDOG=1 from this process, else 0
    (sd_watchdog_enabled(3)). $WATCHDOG_PID names the process it watches: ours, or our parent's
    for the daemon a handover starts (it inherits the environment and becomes the main process,
    MAINPID=). When it is on, $WATCHDOG_PID becomes ours, so that our own successor sees it so."""
    env = os.environ
    try:
        usec = int(env.get("WATCHDOG_USEC", "0"))
        pid = int(env.get("WATCHDOG_PID", "0") or "0")
    except ValueError:
        return 0
    if usec <= 0 or not env.get("NOTIFY_SOCKET") or (pid and pid not in (os.getpid(),
                                                                         os.getppid())):
        return 0
    env["WATCHDOG_PID"] = str(os.getpid())
    return usec
