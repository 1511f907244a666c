"""The firewall rules of both families as the daemon holds them: the IPv4 Network's, and with
``"EnableIPv6": true`` the IPv6Network's (host/firewall.py has the rules and their lifetime).

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
from typing import Optional

from . import firewall
from .firewall import MasqError, Previous

log = logging.getLogger(__name__)


class Stack:
    """One :class:`~dataplane.host.firewall.Rules` per family, installed, resynced, moved and
    stopped together."""

    def __init__(self, network, subnet, masq: bool, forward: bool, *,
                 network6=None, subnet6=None, previous: Previous = Previous(),
                 previous6: Previous = Previous(), random_fully: bool = True,
                 enable_nftables: bool = False):
        kw = dict(masq=masq, forward=forward, random_fully=random_fully,
                  enable_nftables=enable_nftables)
        self.v6: Optional[firewall.Rules] = None
        if network6 is not None and subnet6 is not None:
            self.v6 = firewall.Rules(network6, subnet6, previous=previous6, **kw)
        self.v4 = firewall.Rules(network, subnet, previous=previous, **kw)
        self._clear6 = network6 is None     # EnableIPv6 off: a run with it may have left rules

    def _remove_ipv6_leftovers(self) -> None:
        try:
            done = firewall.remove_family(firewall.V6)
        except MasqError as e:      # ours are unaffected; `flannel-udp cleanup` removes them
            log.warning("EnableIPv6 is off, but the IPv6 firewall rules a run with it left could "
                        "not be removed (flannel-udp cleanup removes them): %s", e)
            return
        if done:
            log.info("EnableIPv6 is off: removed the IPv6 firewall rules a run with it left: %s",
                     "; ".join(done))

    @property
    def members(self) -> list:
        return [r for r in (self.v6, self.v4) if r is not None]

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
                if rules is self.v6:
                    self.v6 = None
                else:
                    raise           # the IPv4 ones: the caller decides (daemon/startup.py)

    def start_resync(self, period_s: float) -> None:
        for rules in self.members:
            rules.start_resync(period_s)

    def update_subnet(self, subnet, subnet6=None) -> None:
        """The lease moved: each family's rules follow its part (an IPv6 part gone leaves the
        IPv6 rules as they are: with EnableIPv6 every lease has one)."""
        self.v4.update_subnet(subnet)
        if self.v6 is not None and subnet6 is not None:
            self.v6.update_subnet(subnet6)

    def remove(self) -> None:
        for rules in self.members:
            rules.remove()

    def stop(self) -> None:
        for rules in self.members:
            rules.stop()
