"""systemd's file descriptor store: the fds that carry traffic outlive the process across
``systemctl restart`` (and across a crash that ``Restart=`` restarts).

The protocol (sd_notify(3), sd_listen_fds(3)):

* the daemon sends ``FDSTORE=1`` + ``FDNAME=<name>`` with the fd attached (SCM_RIGHTS) to
  $NOTIFY_SOCKET; systemd keeps a duplicate for as long as the unit is running or about to be
  restarted (``systemctl stop`` closes them);
* the next process of the unit gets them as fds 3, 4, ... with ``LISTEN_PID`` (its pid),
  ``LISTEN_FDS`` (how many) and ``LISTEN_FDNAMES`` (their names, ``:``-separated, in the same
  order, which is not the order they were stored in);
* ``FDSTOREREMOVE=1`` + ``FDNAME=<name>`` drops them from the store again.

The store is used only when the service manager says it keeps fds: $FDSTORE holds how many
(systemd >= 254 sets it from ``FileDescriptorStoreMax=``; the unit in packaging/ sets it for older
systemd). Without it no fd leaves the process, so a supervisor that speaks only READY=1 on
$NOTIFY_SOCKET never holds flannel0 open after the daemon stopped.
"""
from __future__ import annotations

import fcntl
import logging
import os

from .systemd import sd_notify

log = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3


def capacity() -> int:
    """How many fds the service manager keeps for us (0: no fd store)."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return 0
    try:
        return max(0, int(os.environ.get("FDSTORE", "0")))
    except ValueError:
        return 0


def listen_fds() -> list[tuple[str, int]]:
    """The fds systemd passed to this process, as (name, fd), close-on-exec from now on; the
    LISTEN_* variables are removed so that no child takes them for its own."""
    env = os.environ
    try:
        mine = int(env.get("LISTEN_PID", "")) == os.getpid()
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        mine, count = False, 0
    names = env.get("LISTEN_FDNAMES", "").split(":")
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(var, None)
    if not mine or count <= 0:
        return []
    out = []
    for i in range(count):
        fd = SD_LISTEN_FDS_START + i
        try:
            fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.fcntl(fd, fcntl.F_GETFD) | fcntl.FD_CLOEXEC)
        except OSError as e:
            log.warning("fd %d that systemd passed is not open (%s): ignored", fd, e)
            continue
        out.append((names[i] if i < len(names) else "unknown", fd))
    return out


def store(named_fds) -> bool:
    """Put each (name, fd) into the store; False when one was not accepted."""
    ok = True
    for name, fd in named_fds:
        ok = sd_notify(f"FDSTORE=1\nFDNAME={name}", fds=[fd]) and ok
    return ok


def remove(names) -> None:
    """Drop the fds stored under ``names`` (systemd closes its copies)."""
    for name in names:
        sd_notify(f"FDSTOREREMOVE=1\nFDNAME={name}")
