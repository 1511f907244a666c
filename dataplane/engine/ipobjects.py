"""IPv4 addresses and networks of ipaddress from ints already checked, without its constructors.

A start reads 16,000 leases (control/lease.py) and a restart beside the kernel path's pins
16,000 routes back from its maps (bpf_path.py): each an address or a network whose numbers were
checked where they were read. ipaddress's constructors check and convert them again (2.7 us a
network, 1.1 us an address, here); these make the same objects, attribute for attribute.
"""
from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

# Checked once against the constructors below (a Python whose ipaddress keeps other
# attributes gets the constructors).
_new = object.__new__


def _address4_made(value: int) -> IPv4Address:
    """IPv4Address(value), ``value`` an int in 0..2**32-1."""
    address = _new(IPv4Address)
    address._ip = value
    return address


def _network4_made(net: int, prefixlen: int) -> IPv4Network:
    """IPv4Network((net, prefixlen)), ``net`` with no host bits, ``prefixlen`` in 0..32."""
    if prefixlen >= 31:                 # its __init__ gives these a hosts() of their own
        return IPv4Network((net, prefixlen))
    network = _new(IPv4Network)
    network.network_address = _address4_made(net)
    network.netmask, network._prefixlen = IPv4Network._make_netmask(prefixlen)
    return network


def _same_as_constructors() -> bool:
    try:
        for net, prefixlen in ((0x0A050000, 24), (0, 0), (0xC0A80000, 30)):
            made, built = _network4_made(net, prefixlen), IPv4Network((net, prefixlen))
            if list(vars(made).items()) != list(vars(built).items()) or made != built \
                    or hash(made) != hash(built) or str(made) != str(built):
                return False
        made, built = _address4_made(0x0A050001), IPv4Address(0x0A050001)
        return made == built and hash(made) == hash(built) and str(made) == str(built)
    except Exception:               # noqa: BLE001 (another ipaddress: its constructors then)
        return False


if _same_as_constructors():
    address4, network4 = _address4_made, _network4_made
else:                                                                   # pragma: no cover
    address4, network4 = IPv4Address, lambda net, prefixlen: IPv4Network((net, prefixlen))
