"""A daemon between two processes: whether it keeps the fds the previous daemon handed it (the
checks of daemon/inherited.py, the lease decided on the way), and what it leaves to the next one:
the state file, with flannel0's queues and the UDP sockets, in systemd's fd store
(daemon/fdstore.py), so that `systemctl restart` keeps flannel0.

The daemon (daemon/main.py) calls these at start, and saves the state whenever its lease or its
peers change (the peers once a tick) and once more as it stops.
"""
from __future__ import annotations

import logging

from ..host.family import V4, V6
from . import fdstore, inherited
from .timefmt import when

log = logging.getLogger(__name__)


def check(inh, *, ext, config, lease_manager, acquire, queues: int, vnet: bool):
    """(``inh`` when its fds are what this daemon would set up, else None after letting them go;
    the lease, the one handed over when it is kept, else ``acquire()``'s, after the fds were
    let go when they are not kept whatever the lease)."""
    state = inh.state
    lease, why = (inherited.kept_lease(state, ext, config) if state
                  else (None, "no state came with them"))
    obs = inherited.observe(inh.tun_fds, inh.sockets.get(V4, []))

    def mismatch(lease):
        return inherited.mismatch(state, obs, ext=ext, config=config, lease=lease,
                                  queues=queues, vnet=vnet) if state else why
    if lease is not None:
        lease_manager.adopt(lease)
        log.info("Lease kept: %s (PublicIP %s), expires %s; nothing written to etcd",
                 lease.subnet, lease.public_ip, when(lease.expiration))
    else:
        log.info("Not keeping the lease handed over: %s; acquiring one", why)
        # The fds not kept whatever the lease: the old daemon goes before we write to etcd,
        # or its lease watch takes back the key we replace (a dual key without EnableIPv6)
        early = mismatch(None)
        if early is not None:
            _afresh(inh, early)
            return None, acquire()
        lease = acquire()
    why = mismatch(lease)
    if why is not None:
        _afresh(inh, why)
        return None, lease
    return inh, lease


def _afresh(inh, why: str) -> None:
    log.warning("Not taking over flannel0 and the UDP sockets from %s: %s; starting afresh "
                "(flannel0 is made again: traffic stops until this daemon forwards)",
                inh.way, why)
    inh.release()


def underlay6(inh, wanted, ext, port: int):
    """The IPv6 underlay of a daemon handed ``inh``: ``wanted`` (daemon/startup.py
    ipv6_underlay) when ``inh`` carries its sockets, one per queue on the address it would bind,
    or when it carries none and they can be opened now (the previous daemon had none: the port
    is free); anything else is let go, and the daemon runs without it (said), as it does when
    it wants none."""
    from ..host.udpsock import endpoint
    from .startup import StartupError, open_sockets
    handed = inh.sockets.pop(V6, [])
    if wanted is None:
        for s in handed:
            s.close()
        return None
    bind6 = str(wanted[1])
    if handed:
        got = {s.getsockname()[:2] for s in handed}
        if len(handed) == inh.queues and got == {(bind6, port)}:
            inh.sockets[V6] = handed
            return wanted
        for s in handed:
            s.close()
        log.warning("No IPv6 underlay until the next fresh start: the %d IPv6 socket(s) handed "
                    "over (%s) are not this daemon's %d on %s", len(handed),
                    ", ".join(endpoint(*g) for g in sorted(got)), inh.queues,
                    endpoint(bind6, port))
        return None
    try:
        inh.sockets[V6] = open_sockets(ext, port, inh.queues, ip=bind6)
    except StartupError as e:
        log.warning("No IPv6 underlay until the next fresh start: %s", e)
        return None
    return wanted


def save(state_file, state_of) -> None:
    """``state_of()`` (inherited.state_of) into the state file, when there is one."""
    if state_file is None:
        return
    try:
        state_file.write(state_of())
    except Exception as e:          # a restart then starts afresh: worth a line, not a stop
        log.warning("could not save the state for the next process: %s", e)


def keep_for_restart(state_file, dataplane, state_of):
    """Under systemd with an fd store: the fds of ``dataplane`` (host/assembly.py) and the state
    go there, once (a restart passes them back, with the state file). Returns the state file to
    keep saving into: ``state_file`` when one came with the fds, else the one stored now, or
    None."""
    capacity = fdstore.capacity()
    if not capacity:
        return state_file
    if state_file is not None:
        save(state_file, state_of)
        return state_file
    named = ([(inherited.tun_fd_name(i), fd) for i, fd in enumerate(dataplane.tun_fds)]
             + [(inherited.udp_fd_name(family, i), s.fileno())
                for family, socks in dataplane.sockets.items() for i, s in enumerate(socks)])
    if capacity < len(named) + 1:
        log.warning("systemd keeps %d fds (FileDescriptorStoreMax=, $FDSTORE), %d are needed: "
                    "a restart will make flannel0 again", capacity, len(named) + 1)
        return None
    state_file = inherited.StateFile.create()
    save(state_file, state_of)
    if fdstore.store(named + [(inherited.STATE_NAME, state_file.fd)]):
        log.info("flannel0's queues, the UDP sockets and the state are in systemd's fd store: "
                 "systemctl restart keeps them")
    return state_file
