"""The testbed's router: a namespace between the hosts' link and a link of its own behind it.

It has a leg on the hosts' bridge (:data:`ROUTER_HOST`, .253) and a bridge of its own for the
link behind it (:data:`BEHIND_ROUTER`), and forwards between the two; the switch, every host's
default gateway, routes that link via the router, as a LAN's gateway knows the LAN's other
routers. Its IPv6 legs (:meth:`Router.ipv6`) come with the first host behind it that has an IPv6
underlay. hosts.py makes it for the first ``add_host(behind_router=True)``; narrow.py narrows its
own link.
"""
from __future__ import annotations

import ipaddress

from . import netns as ns

SWITCH_HOST = 254  # the switch namespace's address on a link: .254
# the router's address on the underlay (.253), and the link behind it
ROUTER_HOST = 253
BEHIND_ROUTER = "192.168.79.0/24"
# the IPv6 underlay: a unique local prefix on the hosts' link, and one on the link behind the
# router (as BEHIND_ROUTER); the router's addresses end as its IPv4 ones
DEFAULT_UNDERLAY6 = "fd00:99::/64"
BEHIND_ROUTER6 = "fd00:79::/64"


class Router:
    """The router namespace ``netns`` of the testbed whose switch is ``switch`` (its bridge
    ``switch_bridge`` on ``underlay``, at ``switch_ip``); ``tag`` names the links, ``mac`` is
    the fixed address of its bridge (``bridge``)."""

    def __init__(self, netns: str, *, tag: str, switch: str, switch_bridge: str,
                 switch_ip: str, underlay: ipaddress.IPv4Network, mtu: int, mac: str):
        self.netns = netns
        self.bridge = f"{ns.PREFIX}{tag}rb"
        self.leg = f"{ns.PREFIX}{tag}ru"
        self._switch_leg = f"{ns.PREFIX}{tag}sr"
        self._switch, self._switch_bridge, self._switch_ip = switch, switch_bridge, switch_ip
        self._underlay, self._mtu, self._mac = underlay, mtu, mac

    def wire(self) -> None:
        """Its legs, its bridge and its forwarding, in the namespace made for it."""
        behind = ipaddress.IPv4Network(BEHIND_ROUTER)
        leg = str(self._underlay.network_address + ROUTER_HOST)
        ns.add_veth(self._switch, self._switch_leg, self.netns, self.leg, mtu=self._mtu,
                    master=self._switch_bridge,
                    peer_cidr=f"{leg}/{self._underlay.prefixlen}", gateway=self._switch_ip)
        ns.run_ip(["-batch", "-"], netns=self.netns, input=(
            f"link add {self.bridge} type bridge stp_state 0 forward_delay 0\n"
            f"link set {self.bridge} address {self._mac}\n"
            f"link set {self.bridge} mtu {self._mtu} up\n"
            f"addr add {behind.network_address + SWITCH_HOST}/{behind.prefixlen} "
            f"dev {self.bridge}\n"))
        ns.run_ip(["route", "add", str(behind), "via", leg], netns=self._switch)
        ns.write_sysctl(self.netns, "net/ipv4/ip_forward", "1")

    def ipv6(self) -> ipaddress.IPv6Address:
        """Its IPv6 legs (once): DEFAULT_UNDERLAY6's .253 and BEHIND_ROUTER6's .254 (the
        gateway of the hosts behind it, returned), forwarding between the two."""
        behind = ipaddress.IPv6Network(BEHIND_ROUTER6)
        gateway = behind.network_address + SWITCH_HOST
        have = ns.run_ip(["-6", "-o", "addr", "show", "dev", self.bridge],
                         netns=self.netns).stdout
        if f" {gateway}/" in have:
            return gateway
        for dev in (self.leg, self.bridge):      # as Testbed.add_underlay6, without DAD
            ns.write_sysctl(self.netns, f"net/ipv6/conf/{dev}/accept_dad", "0")
            for off in ("1", "0"):
                ns.write_sysctl(self.netns, f"net/ipv6/conf/{dev}/disable_ipv6", off)
        ns.write_sysctl(self.netns, "net/ipv6/conf/all/forwarding", "1")
        on_link = ipaddress.IPv6Network(DEFAULT_UNDERLAY6)
        ns.run_ip(["-batch", "-"], netns=self.netns, input=(
            f"addr add {on_link.network_address + ROUTER_HOST}/{on_link.prefixlen} "
            f"dev {self.leg} nodad\n"
            f"addr add {gateway}/{behind.prefixlen} dev {self.bridge} nodad\n"))
        return gateway
