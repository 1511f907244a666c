"""The firewall rules of both families as the daemon holds them: the IPv4 Network's, and with
``"EnableIPv6": true`` the IPv6Network's (host/firewall.py has the rules and their lifetime).

The IPv6 rules go in first: in iptables mode the IPv4 rules' first install deletes every
flannel nftables table, ``ip6 flannel-ipv6`` included, and by then the ip6tables rules that
take its place must be in. A family whose forward rules alone cannot go in (no tool, the tool
refused) is left out with a warning, as flanneld leaves them out; one whose masquerade cannot
fails the start (:class:`~dataplane.host.firewall.MasqError`).
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

    @property
    def members(self) -> list:
        return [r for r in (self.v6, self.v4) if r is not None]

    def install(self) -> None:
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
