"""How the lease code's log lines name a lease: flanneld's words for the text, and the fields of
a lease event for json log lines (``--log-format json``)."""
from __future__ import annotations

from ipaddress import IPv6Network
from typing import Optional

from .lease import split_parts


def fields(event: str, subnets, public_ip, **more) -> dict:
    """A lease event's fields for json log lines, as plain strings; ``subnets``: the subnet,
    or the lease's parts (IPv4 first)."""
    subnet, ipv6_subnet = split_parts(subnets)
    six = {} if ipv6_subnet is None else {"ipv6_subnet": str(ipv6_subnet)}
    return {"event": f"lease_{event}", "subnet": str(subnet), "public_ip": str(public_ip), **six,
            **more}


def v6(subnet: Optional[IPv6Network]) -> str:
    """An IPv6 part as flanneld's log lines print it: its empty IP6Net is `::/0`."""
    return "::/0" if subnet is None else str(subnet)
