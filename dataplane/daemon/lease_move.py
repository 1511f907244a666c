"""Moving to another lease while running: what changes on the host, in which order, and what a
failure leaves.

Our lease can change under a running daemon: SIGHUP asks for it again, and the lease manager gets
a new one when etcd lost ours (expired, deleted, taken). The same subnet changes nothing here.
Another subnet moves flannel0's address, the iptables rules and subnet.env, and replaces the
engines on the same fds (their ICMP errors come from <lease net>); the peers' leases are kept,
and the route table is built once, from the peer watcher's snapshot for the new subnet.
Runs in the daemon's main thread, never holding the daemon's lock while it calls the watcher
(whose reports take that lock).

A step can fail: netlink refuses flannel0's new address or route, the new engines cannot be made
or started. The failure is logged with what to do (once per reason: a retry every second must not
flood the log), counted (``flannel_udp_lease_move_failures_total``) and the move is retried on
the monitor's next tick. Every step can run again, and ``daemon.lease`` becomes the new lease only
once the host is on it, so a retry starts from the old subnet and finds what is done already. The
running engines are replaced only by new ones that started: until then the old ones keep
forwarding, so the daemon never keeps a closed engine.
"""
from __future__ import annotations

import errno
import logging

from ..control.routes import route_table
from . import startup

log = logging.getLogger(__name__)


class MoveFailed(RuntimeError):
    """One step of a move failed; the message says what stays as it was and what to do."""


class Failures:
    """Failed move attempts: the total for /metrics, the log at most once per reason."""

    def __init__(self):
        self.total = 0
        self._streak = 0
        self._last = None

    def record(self, subnet, reason: str) -> None:
        self.total += 1
        self._streak += 1
        if reason != self._last:
            log.error("Could not move to the new lease %s: %s (retried every second; attempt "
                      "%d)", subnet, reason, self._streak)
            self._last = reason
        else:
            log.debug("Moving to %s failed again (attempt %d): %s", subnet, self._streak, reason)

    @property
    def retrying(self) -> bool:
        return self._streak > 0

    def succeeded(self, subnet) -> None:
        if self._streak:
            log.warning("Moved to the new lease %s after %d failed attempt(s)", subnet,
                        self._streak)
        self._streak, self._last = 0, None


def reacquire(daemon):
    """SIGHUP: acquire again (the same lease if etcd still holds it for our PublicIP); returns
    the lease for the caller to move to."""
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
    return new


def adopt(daemon, new) -> bool:
    """Make ``new`` our lease, moving the host to its subnet if that is another one. True once
    the host is on it; False when a step failed (logged and counted): call again to retry."""
    with daemon.lock:
        old = daemon.lease
    if new.subnet != old.subnet:
        try:
            _move(daemon, old.subnet, new.subnet)
        except MoveFailed as e:
            daemon.move_failures.record(new.subnet, str(e))
            return False
        except Exception as e:          # a bug must not end the daemon with a traceback
            log.debug("moving to %s", new.subnet, exc_info=True)
            daemon.move_failures.record(new.subnet, f"unexpected {type(e).__name__}: {e}; "
                                        "restart the daemon if it persists (the lease is kept)")
            return False
        daemon.move_failures.succeeded(new.subnet)
    with daemon.lock:
        daemon.lease = new
    if new.subnet != old.subnet:
        daemon.subnet_env.want(daemon.config.network, new.subnet, daemon.ext.tun_mtu)
    return True


def _move(daemon, old_subnet, new_subnet) -> None:
    if not daemon.move_failures.retrying:
        log.warning("The new lease has another subnet (%s, was %s): moving flannel0, the "
                    "iptables rules and %s. Workloads that hold addresses in %s are cut off "
                    "until they are restarted (they then get addresses of %s)",
                    new_subnet, old_subnet, daemon.opts.subnet_file, old_subnet, new_subnet)
    _move_flannel0(daemon, old_subnet, new_subnet)
    if daemon.rules is not None:
        daemon.rules.update_subnet(new_subnet)      # its own failures: the resync retries
    _replace_engine(daemon, new_subnet)


def _move_flannel0(daemon, old_subnet, new_subnet) -> None:
    """The new address first: the kernel flushes every route of a device whose last IPv4
    address goes, <Network> dev flannel0 included (it is put back all the same)."""
    from ..host.netconf import add_network_route, configure_tun, remove_address
    name, new_addr = daemon.tun_name, f"{new_subnet.network_address}/32"
    try:
        configure_tun(name, new_addr, daemon.ext.tun_mtu)
    except Exception as e:
        raise MoveFailed(f"netlink could not give {name} the address {new_addr} ({e}); nothing "
                         f"moved, forwarding goes on as {old_subnet}; check that {name} exists "
                         f"(ip addr show {name}) and that the daemon has CAP_NET_ADMIN") from None
    try:
        remove_address(name, f"{old_subnet.network_address}/32")
    except Exception as e:
        if getattr(e, "code", getattr(e, "errno", None)) != errno.EADDRNOTAVAIL:  # gone already
            log.warning("could not remove the old %s address %s/32: %s", name,
                        old_subnet.network_address, e)
    try:
        add_network_route(daemon.config.network, name)
    except Exception as e:
        raise MoveFailed(f"netlink could not add the route {daemon.config.network} dev {name} "
                         f"({e}); the overlay is unreachable from this host until it is there "
                         f"(ip route add {daemon.config.network} dev {name} adds it by hand)") \
            from None


def _replace_engine(daemon, subnet) -> None:
    """New engines for ``subnet`` on the same fds; the old ones stop only once these run."""
    try:
        engine = startup.new_engine(daemon.engine_cls, daemon.opts, daemon.tun_fds, daemon.socks,
                                    subnet, daemon.ext.tun_mtu, daemon.offload_flags,
                                    daemon.own_sources)
    except startup.StartupError as e:
        raise MoveFailed(f"{e}; the old engine keeps forwarding (its ICMP errors still come "
                         "from the old address)") from None
    with daemon.lock:
        old, daemon.engine = daemon.engine, engine
    try:
        # The one route rebuild of the move: the watcher hands the snapshot for the new subnet
        # to the daemon's on_peers, which gives the new engine its table before it starts.
        daemon.peer_watcher.set_own_subnet(subnet)
        engine.start()
    except Exception as e:
        with daemon.lock:
            daemon.engine = old
            old.set_routes(route_table(daemon.peers, daemon.config.backend_port))
        _close(engine, "the engine that did not start")
        raise MoveFailed(f"the new {engine.name} engine did not start ({e}); the old engine keeps "
                         "forwarding; if this persists restart the daemon (the lease is kept)") \
            from None
    _close(old, "the old engine")


def _close(engine, what: str) -> None:
    try:
        engine.close()
    except Exception as e:
        log.warning("could not close %s: %s", what, e)
