"""Moving to another lease while running: what changes on the host, in which order.

Our lease can change under a running daemon: SIGHUP asks for it again, and the lease manager gets
a new one when etcd lost ours (expired, deleted, taken). The same subnet changes nothing here.
Another subnet moves flannel0's address, the iptables rules and subnet.env, and replaces the
engines on the same fds (their ICMP errors come from <lease net>); the peers' leases are kept,
and the route table is built once, from the peer watcher's snapshot for the new subnet.
Runs in the daemon's main thread, never holding the daemon's lock while it calls the watcher
(whose reports take that lock).
"""
from __future__ import annotations

import logging

from . import startup

log = logging.getLogger(__name__)


def reacquire(daemon) -> None:
    """SIGHUP: acquire again (the same lease if etcd still holds it for our PublicIP)."""
    current = daemon.current_lease()
    try:
        daemon.subnets.stop()
    except Exception as e:
        log.debug("stopping the lease manager: %s", e)
    daemon.subnets = startup.make_lease_manager(daemon.opts, daemon.registry, daemon.ext,
                                                daemon.config, daemon.on_lease_change,
                                                prev=current.subnet)
    new = startup.acquire_lease(daemon.subnets, daemon.registry, daemon.wait)
    daemon.subnets.start()
    adopt(daemon, new)


def adopt(daemon, new) -> None:
    """Make ``new`` our lease; move the host to its subnet if that is another one."""
    with daemon.lock:
        old = daemon.lease
        daemon.lease = new
    if new.subnet == old.subnet:
        return
    log.warning("The new lease has another subnet (%s, was %s): moving flannel0 and the "
                "iptables rules; local workloads must use the new subnet (see %s)",
                new.subnet, old.subnet, daemon.opts.subnet_file)
    _move_flannel0(daemon, old.subnet, new.subnet)
    if daemon.rules is not None:
        daemon.rules.update_subnet(new.subnet)
    with daemon.lock:
        daemon.engine.close()
        daemon.engine = startup.new_engine(daemon.engine_cls, daemon.opts, daemon.tun_fds,
                                           daemon.socks, new.subnet, daemon.ext.tun_mtu,
                                           daemon.offload_flags, daemon.own_sources)
    # The one route rebuild of the move: the watcher hands the snapshot for the new subnet to
    # the daemon's on_peers, which gives the new engine its table before it starts.
    daemon.peer_watcher.set_own_subnet(new.subnet)
    with daemon.lock:
        daemon.engine.start()
    startup.write_subnet_env(daemon.opts, daemon.config.network, new.subnet, daemon.ext.tun_mtu)


def _move_flannel0(daemon, old_subnet, new_subnet) -> None:
    """The new address first: the kernel flushes every route of a device whose last IPv4
    address goes, <Network> dev flannel0 included (it is put back all the same)."""
    from ..host.netconf import add_network_route, configure_tun, remove_address
    configure_tun(daemon.tun_name, f"{new_subnet.network_address}/32", daemon.ext.tun_mtu)
    try:
        remove_address(daemon.tun_name, f"{old_subnet.network_address}/32")
    except Exception as e:
        log.warning("could not remove the old flannel0 address: %s", e)
    add_network_route(daemon.config.network, daemon.tun_name)
