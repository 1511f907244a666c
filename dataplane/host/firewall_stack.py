"""The firewall rules of every family the config enables, as the daemon holds them: the IPv4
Network's, and with ``"EnableIPv6": true`` the IPv6Network's (host/firewall.py has the rules of
one family and their lifetime).

The IPv6 rules go in first: in iptables mode the IPv4 rules' first install deletes every
flannel nftables table, ``ip6 flannel-ipv6`` included, and by then the ip6tables rules that
take its place must be in. A family whose forward rules alone cannot go in (no tool, the tool
refused) is left out with a warning, as flanneld leaves them out; one whose masquerade cannot
fails the start (:class:`~dataplane.host.firewall.MasqError`).

Without EnableIPv6 the first install removes the IPv6 rules a run with it left (ip6tables'
FLANNEL-POSTRTG and FLANNEL-FWD with their jumps, the table ``ip6 flannel-ipv6``), said once.
They carry flanneld's names, so they may be a flanneld's; but a host runs one of the two (they
share the subnet file, the lease and, for udp, the port, and our IPv4 install already takes over
the same names), so a flanneld's rules here are those of the flanneld this daemon replaced, as
stale as our own. Nothing else of ip6tables is touched, and a daemon asked for no rules (neither
``--ip-masq`` nor ``--iptables-forward-rules``) touches none.
"""
from __future__ import annotations

import logging
from typing import Mapping

from . import firewall, firewall_tools
from .family import V4, V6, Part, family_of
from .firewall_rules import Previous
from .firewall_tools import MasqError

log = logging.getLogger(__name__)


class Stack:
    """One :class:`~dataplane.host.firewall.Rules` per family, installed, resynced, moved and
    stopped together. ``parts``: the families the config enables (host/family.py Part), a part
    whose lease subnet is None gets no rules; ``previous``: what subnet.env said, per family."""

    def __init__(self, parts: list[Part], masq: bool, forward: bool, *,
                 previous: Mapping = {}, random_fully: bool = True,
                 enable_nftables: bool = False):
        kw = dict(masq=masq, forward=forward, random_fully=random_fully,
                  enable_nftables=enable_nftables)
        # IPv6 first (the module docstring)
        ordered = sorted((p for p in parts if p.subnet is not None),
                         key=lambda p: -p.family.version)
        self.members: list = [firewall.Rules(p.network, p.subnet,
                                             previous=previous.get(p.family, Previous()), **kw)
                              for p in ordered]
        # EnableIPv6 off: a run with it may have left rules
        self._clear6 = V6 not in {p.family for p in parts}

    def _remove_ipv6_leftovers(self) -> None:
        try:
            done = firewall_tools.remove_family(V6)
        except MasqError as e:      # ours are unaffected; `flannel-udp cleanup` removes them
            log.warning("EnableIPv6 is off, but the IPv6 firewall rules a run with it left could "
                        "not be removed (flannel-udp cleanup removes them): %s", e)
            return
        if done:
            log.info("EnableIPv6 is off: removed the IPv6 firewall rules a run with it left: %s",
                     "; ".join(done))

    def of(self, family):
        """The rules of ``family`` (host/family.py), None when it has none."""
        return next((r for r in self.members if family_of(r.network) is family), None)

    def install(self) -> None:
        if self._clear6:
            self._clear6 = False
            self._remove_ipv6_leftovers()
        for rules in list(self.members):
            try:
                rules.install()
            except MasqError as e:
                if rules.masq:
                    raise
                log.warning("forward rules for %s not installed: %s", rules.network, e)
                if family_of(rules.network) is V4:
                    raise           # the IPv4 ones: the caller decides (daemon/startup.py)
                self.members.remove(rules)

    def start_resync(self, period_s: float) -> None:
        for rules in self.members:
            rules.start_resync(period_s)

    def update_subnet(self, subnets) -> None:
        """The lease moved: each family's rules follow its part of ``subnets`` (a part gone
        leaves that family's rules as they are: with EnableIPv6 every lease has one)."""
        by_family = {family_of(s): s for s in subnets if s is not None}
        for rules in self.members:
            subnet = by_family.get(family_of(rules.network))
            if subnet is not None:
                rules.update_subnet(subnet)

    def remove(self) -> None:
        for rules in self.members:
            rules.remove()

    def stop(self) -> None:
        for rules in self.members:
            rules.stop()
