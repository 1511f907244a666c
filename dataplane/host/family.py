"""An address family as one value: what the IPv4 and the IPv6 halves of the dataplane differ in.

Every layer that handles both families (the assembly, the firewall, the daemon's start steps)
takes the families a config enables as a list of these and runs one piece of code for each,
rather than keeping a second set of names for IPv6. What is here is what is fixed for a family:
its version and name, the width of its addresses, the ipaddress classes, and the firewall's
words for it (its iptables binary, nftables' family and flanneld's table name, the multicast
range masquerade leaves alone: docs/operating.md#firewall).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    version: int                # 4 or 6
    name: str                   # "IPv4" / "IPv6", as the logs say it
    width: int                  # address bits: a host's own address is a /width
    network: type               # ipaddress.IPv4Network / IPv6Network
    interface: type             # ipaddress.IPv4Interface / IPv6Interface
    iptables: str               # the binary; its -save and -restore sit beside it
    nft_family: str             # nftables' family, also its address match ("ip6 saddr")
    nft_table: str              # flanneld v0.28.9's table name
    multicast: str              # never masqueraded

    @property
    def save(self) -> str:
        return f"{self.iptables}-save"

    @property
    def restore(self) -> str:
        return f"{self.iptables}-restore"

    def host(self, address) -> str:
        """``address`` as a host prefix (``10.5.84.0/32``, ``fc00::/128``): flannel0's own."""
        return f"{address}/{self.width}"


V4 = Family(4, "IPv4", 32, ipaddress.IPv4Network, ipaddress.IPv4Interface, "iptables", "ip",
            "flannel-ipv4", "224.0.0.0/4")
V6 = Family(6, "IPv6", 128, ipaddress.IPv6Network, ipaddress.IPv6Interface, "ip6tables", "ip6",
            "flannel-ipv6", "ff00::/8")
FAMILIES = (V4, V6)


def family_of(value) -> Family:
    """The family of a network, an interface or an address (or their text)."""
    version = getattr(value, "version", None)
    if version is None:
        version = ipaddress.ip_interface(str(value)).version
    return V6 if version == 6 else V4


@dataclass(frozen=True)
class Part:
    """One family of the overlay as this host carries it: the overlay's network of that family
    (Network, IPv6Network; its route goes via flannel0, none when None) and the lease's subnet
    in it, None while the lease has none (a dual-stack config's lease without an IPv6 part).
    The daemon hands the host layer a list of these, one per family the config enables, IPv4
    first. ``address``: flannel0's address in it when it is not the lease's (`flannel-udp
    forward` takes it as given)."""
    network: object = None
    subnet: object = None
    address: object = None

    @property
    def family(self) -> Family:
        return family_of(next(v for v in (self.network, self.subnet, self.address)
                              if v is not None))

    @property
    def tun_addr(self) -> str | None:
        """flannel0's address in this family: ``address``, else the lease subnet's network
        address as a host prefix (docs/flannel-compat.md#tun-device)."""
        if self.address is not None:
            return str(self.address)
        return None if self.subnet is None else self.family.host(self.subnet.network_address)


def subnets(parts) -> list:
    """The lease's subnets of ``parts`` (those it has)."""
    return [p.subnet for p in parts if p.subnet is not None]


__all__ = ["FAMILIES", "Family", "Part", "V4", "V6", "family_of", "subnets"]
