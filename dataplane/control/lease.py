"""Subnet leases as flanneld stores them in etcd: key names and the JSON value.

* Key: `<prefix>/subnets/<a.b.c.d>-<len>`, with dual stack `<a.b.c.d>-<len>&<v6>-<len6>` (`MakeSubnetKey`,
  `ParseSubnetKey` in flannel `subnet/subnet.go`).
* Value (`LeaseAttrs`): the udp backend writes exactly `{"PublicIP":"1.2.3.4","PublicIPv6":null}` (Go's
  `json.Marshal`, no spaces, `PublicIPv6` without omitempty). Other backends add `BackendType`,
  `BackendData`, `BackendV6Data`; reading tolerates them (and Go's case-insensitive key matching).
"""
from __future__ import annotations

import json
import re
from socket import AF_INET, inet_pton
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from typing import Any, Optional

from ..engine.ipobjects import address4 as _address4, network4 as _network4

# flanneld's ParseSubnetKey, with the dots escaped and the match anchored to the whole name.
_KEY_RE = re.compile(r"^(\d+\.\d+\.\d+\.\d+)-(\d+)(?:&([a-fA-F\d:]+)-(\d+))?$")
# The value flanneld's udp backend writes, byte for byte (LeaseAttrs.to_json): read without
# json or a dict; any other value takes the general way.
_UDP_VALUE_RE = re.compile(rb'\{"PublicIP":"([\d.]{7,15})","PublicIPv6":null\}\Z')


# flanneld's udp backend writes ~40 bytes, other backends' values (BackendData) a few hundred: a
# value past this is no lease of any flannel, and reading it would cost every host its size.
MAX_VALUE_BYTES = 16 * 1024


class LeaseFormatError(ValueError):
    """A lease key or value that cannot be parsed."""


def clip(raw: "bytes | str", limit: int = 80) -> str:
    """A value for a message: its repr, cut at `limit` characters (values in etcd can be megabytes)."""
    text = repr(raw)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(raw)} {'bytes' if isinstance(raw, bytes) else 'characters'})"


@dataclass(frozen=True, slots=True)
class LeaseAttrs:
    public_ip: IPv4Address
    public_ipv6: Optional[IPv6Address] = None
    backend_type: Optional[str] = None
    backend_data: Any = None           # decoded JSON, kept only to be tolerant and for logs
    backend_v6_data: Any = None
    # "DirectRouting": true, written by a flannel-udp host whose network config turns it on:
    # peers route to it directly only when it says so (control/direct.py). flanneld reads past
    # the field, and rewrites the value without it when it takes the lease over.
    direct_routing: bool = False
    # "ForwardsIPv6": true, written by a flannel-udp host that forwards inner IPv6 (a dual-stack
    # config): peers route the IPv6 part of its lease only when it says so (control/routes.py).
    # flanneld's udp backend takes dual-stack keys too but routes no IPv6; what was sent to it
    # would vanish. flanneld reads past the field, and drops it when it takes the lease over.
    forwards_ipv6: bool = False

    def to_json(self) -> bytes:
        """Bytes exactly as flanneld's udp backend writes them (field order and spacing of Go's encoder)."""
        doc: dict = {"PublicIP": str(self.public_ip),
                     "PublicIPv6": str(self.public_ipv6) if self.public_ipv6 is not None else None}
        if self.backend_type:
            doc["BackendType"] = self.backend_type
        if self.backend_data is not None:
            doc["BackendData"] = self.backend_data
        if self.backend_v6_data is not None:
            doc["BackendV6Data"] = self.backend_v6_data
        if self.direct_routing:
            doc["DirectRouting"] = True
        if self.forwards_ipv6:
            doc["ForwardsIPv6"] = True
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: "bytes | str") -> "LeaseAttrs":
        # A listing reads thousands of these at a start: the udp backend's own value without
        # json, ipaddress's text parser or a dict (perf/README.md#listing-parse).
        m = _UDP_VALUE_RE.match(raw) if isinstance(raw, bytes) else None
        if m is not None:
            packed = _packed4(m.group(1).decode())
            if packed is not None:
                return cls(_address4(int.from_bytes(packed, "big")))
        if len(raw) > MAX_VALUE_BYTES:
            raise LeaseFormatError(f"lease value is oversized ({len(raw)} bytes, at most "
                                   f"{MAX_VALUE_BYTES}): {clip(raw)}")
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise LeaseFormatError(f"lease value is not JSON: {exc}: {clip(raw)}") from None
        except RecursionError:
            raise LeaseFormatError(f"lease value is nested too deeply to read: {clip(raw)}") from None
        if not isinstance(doc, dict):
            raise LeaseFormatError(f"lease value is not a JSON object: {clip(raw)}")
        fields: dict = {}
        for key, value in doc.items():          # Go matches field names case-insensitively
            fields[key.lower()] = value
        pub = fields.get("publicip")
        if not isinstance(pub, str):
            raise LeaseFormatError(f"lease value has no PublicIP string: {clip(raw)}")
        try:
            public_ip = IPv4Address(pub)
        except ValueError:
            raise LeaseFormatError(f"lease PublicIP is not an IPv4 address: {clip(pub)}") from None
        pub6 = fields.get("publicipv6")
        public_ipv6 = None
        if isinstance(pub6, str) and pub6:
            try:
                public_ipv6 = IPv6Address(pub6)
            except ValueError:
                raise LeaseFormatError(f"lease PublicIPv6 is not an IPv6 address: {clip(pub6)}") from None
        btype = fields.get("backendtype")
        return cls(public_ip=public_ip, public_ipv6=public_ipv6,
                   backend_type=btype if isinstance(btype, str) and btype else None,
                   backend_data=fields.get("backenddata"),
                   backend_v6_data=fields.get("backendv6data"),
                   direct_routing=fields.get("directrouting") is True,
                   forwards_ipv6=fields.get("forwardsipv6") is True)


@dataclass(frozen=True, slots=True)
class Lease:
    subnet: IPv4Network
    attrs: LeaseAttrs
    ipv6_subnet: Optional[IPv6Network] = None
    expiration: Optional[float] = None       # unix time; None if unknown (not looked up)
    lease_id: int = 0                        # the etcd lease the key is attached to, 0 if none
    mod_revision: int = 0
    key: str = field(default="", compare=False)
    create_revision: int = field(default=0, compare=False)   # 0: not known

    @property
    def public_ip(self) -> IPv4Address:
        return self.attrs.public_ip

    @property
    def subnets(self) -> tuple:
        """The parts the key names, IPv4 first: what the key and log functions take."""
        return (self.subnet,) if self.ipv6_subnet is None else (self.subnet, self.ipv6_subnet)

    def __reduce__(self):
        # Pickled as numbers: ipaddress objects pickle as strings and parse again, and the peer
        # watch process (control/peer_process.py) hands the daemon 10,000 leases at once
        # (perf/README.md#lease-pickling).
        # Each family's part and address as bytes, whose length says the family.
        a = self.attrs
        parts = tuple((net.network_address.packed, net.prefixlen)
                      for net in (self.subnet, self.ipv6_subnet) if net is not None)
        public = tuple(ip.packed for ip in (a.public_ip, a.public_ipv6) if ip is not None)
        return (_lease_of_parts, (parts, public, a.backend_type, a.backend_data,
                                  a.backend_v6_data, self.expiration, self.lease_id,
                                  self.mod_revision, self.key, self.create_revision,
                                  a.direct_routing, a.forwards_ipv6))

    @property
    def reservation(self) -> bool:
        """A key with no etcd lease attached never expires: flannel's reservations are written that
        way by an operator, and the host they name keeps them so (no TTL, never renewed)."""
        return self.lease_id == 0


_NETWORK = {4: IPv4Network, 16: IPv6Network}      # by the length of its packed address
_ADDRESS = {4: IPv4Address, 16: IPv6Address}


def _lease_of_parts(parts, public, backend_type, backend_data, backend_v6_data, expiration,
                    lease_id, mod_revision, key, create_revision=0, direct_routing=False,
                    forwards_ipv6=False) -> Lease:
    """``parts``: (packed network address, prefix length) per family the key names, IPv4
    first; ``public``: the packed PublicIP and PublicIPv6 the value names, IPv4 first."""
    nets = [_NETWORK[len(net)]((net, prefixlen)) for net, prefixlen in parts] + [None]
    ips = [_ADDRESS[len(ip)](ip) for ip in public] + [None]
    return Lease(nets[0],
                 LeaseAttrs(ips[0], ips[1], backend_type, backend_data, backend_v6_data,
                            direct_routing, forwards_ipv6),
                 nets[1], expiration, lease_id, mod_revision, key, create_revision)


def by_version(values) -> dict:
    """Addresses or networks by their version (4, 6): ``values`` is one, or several of
    different families (None and "" skipped; a string is parsed). ValueError for two of a
    family."""
    if values is None or isinstance(values, (str, IPv4Address, IPv6Address, IPv4Network,
                                             IPv6Network)):
        values = (values,)
    found: dict = {}
    for value in values:
        if value is None or value == "":
            continue
        if isinstance(value, str):
            value = ip_network(value) if "/" in value else ip_address(value)
        if found.setdefault(value.version, value) != value:
            raise ValueError(f"two of IPv{value.version}: {found[value.version]} and {value}")
    return found


def with_ipv6_of_key(lease: Lease) -> Lease:
    """``lease`` with the IPv6 part its key names, when it carries the key but not the part."""
    if lease.ipv6_subnet is not None or not lease.key:
        return lease
    try:
        return replace(lease, ipv6_subnet=parse_subnet_key(lease.key)[1])
    except LeaseFormatError:
        return lease


def split_parts(subnets) -> tuple:
    """``subnets`` (a subnet, or a lease's parts: at most one per family, None skipped) as
    (IPv4 subnet, IPv6 part or None)."""
    found = by_version(subnets)
    return found.get(4), found.get(6)


def subnet_key_name(subnets) -> str:
    """`MakeSubnetKey`: the last component of the lease key of ``subnets`` (a subnet, or the
    lease's parts, IPv4 first), e.g. `10.5.84.0-24`, `10.5.84.0-24&fc00::-64`."""
    subnet, ipv6_subnet = split_parts(subnets)
    name = f"{subnet.network_address}-{subnet.prefixlen}"
    if ipv6_subnet is not None:
        name += f"&{ipv6_subnet.network_address}-{ipv6_subnet.prefixlen}"
    return name


def parse_subnet_key(name: str) -> tuple[IPv4Network, Optional[IPv6Network]]:
    """Inverse of subnet_key_name; accepts a full key path too. Raises LeaseFormatError."""
    base = name.rsplit("/", 1)[-1]
    m = _KEY_RE.match(base)
    if not m:
        raise LeaseFormatError(f"not a subnet key: {clip(name)}")
    if m.group(3) is None:              # the common key, read without ipaddress's text parser
        packed, prefixlen = _packed4(m.group(1)), int(m.group(2))
        if packed is not None and prefixlen <= 32:
            net = int.from_bytes(packed, "big")
            if not net & (0xFFFFFFFF >> prefixlen):
                return _network4(net, prefixlen), None
    try:
        subnet = IPv4Network(f"{m.group(1)}/{int(m.group(2))}", strict=False)
        v6 = None
        if m.group(3):
            v6 = IPv6Network(f"{m.group(3)}/{int(m.group(4))}", strict=False)
    except ValueError as exc:
        raise LeaseFormatError(f"not a subnet key: {clip(name)}: {exc}") from None
    # MakeSubnetKey writes the network address. Read leniently, `10.5.3.7-24` would be 10.5.3.0/24:
    # a stray key could replace (and its deletion remove) the route of the node that holds 10.5.3.0/24.
    if str(subnet.network_address) != m.group(1):
        raise LeaseFormatError(f"not a subnet key: {clip(name)}: host bits set (the subnet is {subnet})")
    return subnet, v6


def _packed4(text: str) -> Optional[bytes]:
    """The 4 bytes of a dotted quad in the one form ipaddress reads and writes (inet_pton
    refuses leading zeros and short forms), or None: the caller's general way then says why."""
    try:
        return inet_pton(AF_INET, text)
    except OSError:
        return None


def peer_problem(lease: Lease, network: Optional[IPv4Network]) -> Optional[str]:
    """Why a well-formed lease still cannot be a route in `network`, or None.

    A subnet outside the Network never sees a packet through flannel0 and could only shadow others;
    a PublicIP that is no unicast address of another host (0.0.0.0, loopback, multicast, broadcast)
    or lies inside the overlay itself (each datagram would go back into flannel0, encapsulated again)
    cannot carry the overlay."""
    # Integer tests on ipaddress's own ints (int() and .prefixlen are a Python call each): this
    # runs for every lease of every list, thousands at a time (perf/README.md#peer-table).
    ip, subnet = lease.attrs.public_ip, lease.subnet
    address = ip._ip
    if network is not None:
        mask, net = network.netmask._ip, network.network_address._ip
        if subnet._prefixlen < network._prefixlen or subnet.network_address._ip & mask != net:
            return f"subnet {subnet} is outside the Network {network}"
    first = address >> 24           # 0.0.0.0, loopback 127/8, multicast 224/4, broadcast
    if not address or first == 127 or 224 <= first < 240 or address == 0xFFFFFFFF:
        return f"PublicIP {ip} cannot be a peer's address"
    if network is not None and address & mask == net:
        return f"PublicIP {ip} is inside the Network {network} (it would loop through flannel0)"
    return None


def lease_from_kv(key: str, value: "bytes | str", lease_id: int = 0, mod_revision: int = 0,
                  expiration: Optional[float] = None, create_revision: int = 0) -> Lease:
    """Build a Lease from an etcd key/value; raises LeaseFormatError on a malformed key or value."""
    subnet, v6 = parse_subnet_key(key)
    attrs = LeaseAttrs.from_json(value)
    # by position: a frozen dataclass takes its keywords at twice the cost (16,000 a listing)
    return Lease(subnet, attrs, v6, expiration, lease_id, mod_revision, key, create_revision)


# A listing's common key: its last component `<dotted quad>-<length>`, the quad checked by
# inet_pton (as parse_subnet_key's), the length one of these; and the udp backend's value
# around its PublicIP (LeaseAttrs.to_json). Read with bytes' methods and a dict: two regular
# expressions were a fifth of the loop (perf/README.md#start-ints).
_LENGTHS = {str(n).encode(): n for n in range(33)}
_UDP_HEAD = b'{"PublicIP":"'
# what follows the PublicIP in the values flannel-udp's and flanneld's udp backends write
# (LeaseAttrs.to_json), and the DirectRouting each says; a DirectRouting network's leases
# all say it (control/direct.py)
_UDP_TAILS = {b'","PublicIPv6":null}': False, b'","PublicIPv6":null,"DirectRouting":true}': True}


def _fields_of(cls) -> type:
    """A class of ``cls``'s slots, not frozen. An object of it whose fields are set by plain
    attribute stores (the interpreter's quickest), then given ``cls`` as its class, is what
    ``cls(...)`` makes; a frozen dataclass's __init__ sets each field through
    object.__setattr__, and the slots' own setters cost twice a store: 16,000 leases a
    listing (perf/README.md#start-ints)."""
    return type(f"_{cls.__name__}Fields", (), {"__slots__": cls.__slots__})


_LeaseFields, _AttrsFields = _fields_of(Lease), _fields_of(LeaseAttrs)


def _same_as_init() -> bool:
    """Whether a Lease made as leases_of_kvs makes it is Lease(...)'s, field for field (a
    Python that refuses the class's change, or a Lease of other slots: the general way then)."""
    try:
        subnet, ip = IPv4Network("10.5.2.0/24"), IPv4Address("192.0.2.7")
        for direct in (False, True):
            built = Lease(subnet, LeaseAttrs(ip, direct_routing=direct), None, None, 5, 6, "k", 7)
            attrs = _AttrsFields()
            attrs.public_ip = ip
            attrs.public_ipv6 = attrs.backend_type = attrs.backend_data = None
            attrs.backend_v6_data = None
            attrs.direct_routing, attrs.forwards_ipv6 = direct, False
            attrs.__class__ = LeaseAttrs
            made = _LeaseFields()
            made.subnet, made.attrs, made.ipv6_subnet, made.expiration = subnet, attrs, None, None
            made.lease_id, made.mod_revision, made.key, made.create_revision = 5, 6, "k", 7
            made.__class__ = Lease
            if not (type(made) is Lease and made == built and hash(made) == hash(built)
                    and all(getattr(made, f) == getattr(built, f) for f in Lease.__slots__)
                    and all(getattr(attrs, f) == getattr(built.attrs, f)
                            for f in LeaseAttrs.__slots__)):
                return False
        return len(Lease.__slots__) == 8 and len(LeaseAttrs.__slots__) == 7
    except Exception:               # noqa: BLE001 (the general way then)
        return False


_LISTED = _same_as_init()


def leases_of_kvs(kvs, general) -> list:
    """lease_from_kv of each etcd KeyValue of a listing, in its order: the common key and value
    (an IPv4 subnet, the udp backend's value, with DirectRouting or without) read in one loop,
    each other one by ``general(kv)`` (its Lease, or what the caller makes of a malformed one).
    The same Leases as lease_from_kv's, field for field (tests/unit/test_lease_listing_parse.py);
    16,000 of them one by one are ~0.17 s of a start's CPU (perf/README.md#listing-ahead), here
    ~35 ms (perf/listing_cost.py)."""
    if not _LISTED:                                                     # pragma: no cover
        return [general(kv) for kv in kvs]
    lengths, head, tails = _LENGTHS, _UDP_HEAD, _UDP_TAILS
    start = len(head)
    network, address, pton, from_bytes = _network4, _address4, inet_pton, int.from_bytes
    lease_fields, attrs_fields, lease_class, attrs_class = _LeaseFields, _AttrsFields, Lease, \
        LeaseAttrs
    out = []
    append = out.append
    for kv in kvs:
        key, value = kv.key, kv.value
        _, slash, name = key.rpartition(b"/")
        quad, _, length = name.rpartition(b"-")
        prefixlen = lengths.get(length)
        end = value.find(b'"', start)
        direct = tails.get(value[end:]) if end > 0 else None
        if prefixlen is not None and slash and direct is not None and value.startswith(head):
            try:
                net = from_bytes(pton(AF_INET, quad.decode()), "big")
                ip = from_bytes(pton(AF_INET, value[start:end].decode()), "big")
            except (OSError, ValueError):       # (a bad quad, NUL, not UTF-8)
                net = None
            if net is not None and not net & (0xFFFFFFFF >> prefixlen):
                # LeaseAttrs(address(ip)), as _same_as_init checks
                attrs = attrs_fields()
                attrs.public_ip = address(ip)
                attrs.public_ipv6 = attrs.backend_type = attrs.backend_data = None
                attrs.backend_v6_data = None
                attrs.direct_routing, attrs.forwards_ipv6 = direct, False
                attrs.__class__ = attrs_class
                # Lease(subnet, attrs, None, None, kv.lease, kv.mod_revision, key,
                # kv.create_revision), the same
                lease = lease_fields()
                lease.subnet = network(net, prefixlen)
                lease.attrs = attrs
                lease.ipv6_subnet = lease.expiration = None
                lease.lease_id = kv.lease
                lease.mod_revision = kv.mod_revision
                lease.key = key.decode()
                lease.create_revision = kv.create_revision
                lease.__class__ = lease_class
                append(lease)
                continue
        append(general(kv))
    return out
