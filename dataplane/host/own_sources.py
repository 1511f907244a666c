"""This host's own sources, handed to the engine (csrc/dataplane.h, UDP -> TUN step 4).

Without cryptography the outer source of a datagram proves nothing (docs/threat-model.md), so
the engines drop an inner packet whose source is one of this host's addresses or inside its
lease subnet (both parts of a dual-stack lease). flannel0 keeps accept_local (host/netconf.py:
set_accept_local) and only this check keeps a forged datagram from using it. The addresses are every
IPv4 and IPv6 address (link-local ones aside: the engines drop those sources anyway) of every
interface in the daemon's network namespace, read over netlink when an engine is made and again on each
monitor tick; the engine hears of them only when they changed, so an address added after start
(a container bridge, a DHCP lease) is covered within a tick.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class OwnSources:
    """What the engine was last told; ``collect()`` lists the host's addresses."""

    def __init__(self, collect=None):
        if collect is None:
            from .netconf import AddressReader
            collect = AddressReader()
        self._collect = collect
        self._engine = None
        self._told = None             # (subnets, addresses) the engine has
        self._addrs: list = []        # the last list netlink gave
        self._failing = False

    def _read(self) -> list:
        """The host's addresses; the last ones known while netlink fails (logged once)."""
        try:
            # IPv4 first, then IPv6: the two families do not compare with each other
            self._addrs = sorted(set(self._collect()), key=lambda a: (a.version, a))
            self._failing = False
        except OSError as e:
            if not self._failing:
                log.warning("cannot list this host's addresses over netlink (%s): the last "
                            "ones known (%d) and the lease subnet stay our own sources",
                            e, len(self._addrs))
            self._failing = True
        return self._addrs

    def close(self) -> None:
        """Let go of the netlink socket (when ``collect`` has one)."""
        close = getattr(self._collect, "close", None)
        if close is not None:
            close()

    @property
    def addresses(self) -> list:
        """The addresses the engine was last told."""
        return list(self._told[1]) if self._told else []

    def refresh(self, engine, subnets) -> bool:
        """Tell ``engine`` the lease's subnets (one per family, IPv4 first) and the host's
        addresses unless it has them already; True if it was told."""
        told = (tuple(subnets), self._read())
        if engine is self._engine and told == self._told:
            return False
        engine.set_local(list(told[0]), told[1])
        if engine is self._engine:
            log.info("This host's addresses changed: %d count as our own sources now (%s)",
                     len(told[1]), ", ".join(map(str, told[1])))
        self._engine, self._told = engine, told
        return True
