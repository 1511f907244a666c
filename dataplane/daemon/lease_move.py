"""Moving to another lease while running: what changes on the host, in which order, and what a
failure leaves.

Our lease can change under a running daemon: SIGHUP asks for it again, and the lease manager gets
a new one when etcd lost ours (expired, deleted, taken). The same subnet (both parts of a
dual-stack lease) changes nothing here. A lease whose IPv6 part alone changed (a key reshaped:
control/lease_manager.py) moves flannel0's IPv6 address, the engines' own sources, the IPv6
masquerade rules and subnet.env's IPv6 lines; its IPv4 address, the IPv4 rules and the blackhole
route stay. Another subnet moves flannel0's address, the iptables rules (both families': the
IPv6 part moves with it) and subnet.env, and replaces the
engines on the same fds (their ICMP errors come from <lease net>); the peers' leases are kept,
and the route table is built once, from the peer watcher's snapshot for the new subnet. Last, with
--ip-blackhole-route, the old subnet's blackhole route goes (the subnet may be another host's now:
its traffic would be dropped here) and the new one gets one; that step's failures are its own,
retried on the tick (daemon/blackhole_route.py), and never fail the move.
Runs in the daemon's main thread, never holding the daemon's lock while it calls the watcher
(whose reports take that lock).

A step can fail: netlink refuses flannel0's new address or route, the new engines cannot be made
or started. The failure is logged with what to do (once per reason: a retry every second must not
flood the log), counted (``flannel_udp_lease_move_failures_total``) and the move is retried on
the monitor's next tick. Every step can run again, and the daemon takes the new lease only once the
host is on it, so a retry starts from the old subnet and finds what is done already. The running
engines are replaced only by new ones that started: until then the old ones keep forwarding, so
the daemon never keeps a closed engine.

The daemon hands a move what it changes as a :class:`Host` (daemon/main.py ``_move_host``) and
keeps the lease itself: :func:`move` says whether the host is on the new subnet.
"""
from __future__ import annotations

import errno
import logging
from dataclasses import dataclass
from ipaddress import IPv4Network
from typing import Callable, Optional

from ..control.recurring import Recurring
from ..host.family import Part
from .startup import StartupError, subnets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Host:
    """What a move changes on this host, and how a new engine takes the old one's place."""
    tun_name: str                       # flannel0
    mtu: int                            # flannel0's MTU
    network: IPv4Network                # the overlay's Network: its route goes via flannel0
    subnet_file: str                    # named in the log: where workloads read their subnet
    rules: object                       # host/firewall_stack.py Stack, or None
    # the lease's subnets (one per family) -> engines for them on the same fds, not started
    new_engine: Callable
    # engine -> the one it replaced: from then on peer changes (on_peers) reach ``engine``
    swap_engine: Callable
    restore_engine: Callable            # engine -> None: it is back, with the current routes
    own_subnet: Callable                # subnet -> None: the peer watch reports its snapshot
    # (old, new) -> None: the blackhole route follows the host (daemon/blackhole_route.py)
    blackhole: Optional[Callable] = None
    # the overlay's networks of the other families the config enables (IPv6Network with
    # EnableIPv6): their routes go via flannel0 too
    more_networks: tuple = ()

    def more_parts(self, lease) -> list:
        """The lease's parts beyond IPv4, with the network of each (host/family.py Part)."""
        parts = [Part(n) for n in self.more_networks]
        return [Part(p.network, s) for p in parts for s in subnets(lease)[1:]
                if Part(s).family is p.family]


class MoveFailed(RuntimeError):
    """One step of a move failed; the message says what stays as it was and what to do."""


class Failures:
    """Failed move attempts: the total for /metrics; the log once per reason, then a reminder a
    minute (control/recurring.py), and one line when a move succeeds."""

    def __init__(self):
        self._failing = Recurring(log, "Moving to the new lease", level=logging.ERROR)

    @property
    def total(self) -> int:
        return self._failing.total

    def record(self, subnet, reason: str) -> None:
        self._failing.fail(f"{subnet}: {reason}", "retried every second", key=(subnet, reason))

    @property
    def retrying(self) -> bool:
        return self._failing.failing

    def succeeded(self, subnet) -> None:
        self._failing.ok(f"the host is on {subnet}")


def move(old, new, host: Host, failures: Failures) -> bool:
    """Move the host from the lease ``old`` to the lease ``new`` (nothing to do when both
    parts are the same). True once the host is on it; False when a step failed (logged and
    counted in ``failures``): call again to retry."""
    old_subnet, new_subnet = old.subnet, new.subnet
    if (new_subnet, new.ipv6_subnet) == (old_subnet, old.ipv6_subnet):
        return True
    try:
        if new_subnet == old_subnet:
            _move_ipv6(host, old, new)
        else:
            _move(host, old_subnet, new, failures.retrying)
    except MoveFailed as e:
        failures.record(new_subnet, str(e))
        return False
    except Exception as e:          # a bug must not end the daemon with a traceback
        log.debug("moving to %s", new_subnet, exc_info=True)
        failures.record(new_subnet, f"unexpected {type(e).__name__}: {e}; "
                        "restart the daemon if it persists (the lease is kept)")
        return False
    failures.succeeded(new_subnet)
    return True


def _move_ipv6(host: Host, old, new) -> None:
    """Only the IPv6 part changed: flannel0's IPv6 address and the IPv6 masquerade rules follow
    it, and new engines know the new part as their own sources (they are the way the engines
    hear of it)."""
    log.warning("The new lease has another IPv6 part (%s, was %s) for the same subnet %s: "
                "moving flannel0's IPv6 address, the IPv6 firewall rules and %s's IPv6 lines. "
                "Workloads that hold IPv6 addresses in %s are cut off until they are "
                "restarted", new.ipv6_subnet or "none",
                old.ipv6_subnet or "none", new.subnet, host.subnet_file, old.ipv6_subnet or "none")
    _move_flannel0_more(host, new)
    if host.rules is not None:
        host.rules.update_subnet(subnets(new))   # failures: the resync retries
    _replace_engine(host, subnets(new))


def _move_flannel0_more(host: Host, lease) -> None:
    """flannel0's addresses and routes in the lease's families beyond IPv4."""
    from .startup import ensure_ipv6
    for part in host.more_parts(lease):
        try:
            ensure_ipv6(host.tun_name, part)
        except Exception as e:
            raise MoveFailed(f"netlink could not give {host.tun_name} the {part.family.name} "
                             f"address {part.tun_addr} or the route {part.network} ({e}); "
                             f"{part.family.name} forwarding goes on as before; check that "
                             f"{host.tun_name} exists and that the daemon has CAP_NET_ADMIN") \
                from None


def _move(host: Host, old_subnet, new, retrying: bool) -> None:
    new_subnet = new.subnet
    if not retrying:
        log.warning("The new lease has another subnet (%s, was %s): moving flannel0, the "
                    "iptables rules and %s. Workloads that hold addresses in %s are cut off "
                    "until they are restarted (they then get addresses of %s)",
                    new_subnet, old_subnet, host.subnet_file, old_subnet, new_subnet)
    _move_flannel0(host, old_subnet, new_subnet)
    _move_flannel0_more(host, new)
    if host.rules is not None:
        host.rules.update_subnet(subnets(new))     # its own failures: the resync retries
    _replace_engine(host, subnets(new))
    if host.blackhole is not None:
        try:
            host.blackhole(old_subnet, new_subnet)
        except Exception as e:      # the host is on the new subnet: moving again would not help
            log.warning("could not move the blackhole route from %s to %s: %s", old_subnet,
                        new_subnet, e)


def _move_flannel0(host: Host, old_subnet, new_subnet) -> None:
    """The new address first: the kernel flushes every route of a device whose last IPv4
    address goes, <Network> dev flannel0 included (it is put back all the same)."""
    from ..host.netconf import add_network_route, configure_tun, remove_address
    name, new_addr = host.tun_name, f"{new_subnet.network_address}/32"
    try:
        configure_tun(name, new_addr, host.mtu)
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
        add_network_route(host.network, name)
    except Exception as e:
        raise MoveFailed(f"netlink could not add the route {host.network} dev {name} "
                         f"({e}); the overlay is unreachable from this host until it is there "
                         f"(ip route add {host.network} dev {name} adds it by hand)") \
            from None


def _replace_engine(host: Host, subnets) -> None:
    """New engines for the lease's ``subnets`` (one per family, IPv4 first) on the same fds;
    the old ones stop only once these run."""
    subnet = subnets[0]
    try:
        engine = host.new_engine(subnets)
    except StartupError as e:
        raise MoveFailed(f"{e}; the old engine keeps forwarding (its ICMP errors still come "
                         "from the old address)") from None
    old = host.swap_engine(engine)
    try:
        # The one route rebuild of the move: the watcher hands the snapshot for the new subnet
        # to the daemon's on_peers, which gives the new engine its table before it starts.
        host.own_subnet(subnet)
        engine.start()
    except Exception as e:
        host.restore_engine(old)
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
