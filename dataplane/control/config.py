"""The flannel network config (`<prefix>/config` in etcd), parsed and checked exactly as flanneld does.

The reference is flanneld v0.28.9 `pkg/subnet/config.go` (`ParseConfig`, `CheckNetworkConfig`) and the
udp backend's `Port` parsing; see docs/flannel-compat.md#network-config. Error texts are flanneld's own
where it has one, so an operator sees the message they already know.

Go's `encoding/json` semantics are mirrored where they matter:
* object keys match struct fields case-insensitively; unknown keys are ignored; a later duplicate wins;
* a wrong JSON type for a field is an error (`json: cannot unmarshal ...`);
* `Backend` absent -> backend `udp`; `Backend` present -> its `Type` (may be empty -> unknown backend).

What differs from v0.20.2: `Networks` and `IPv6Networks` are no longer fields, so they are unknown keys,
ignored whatever they hold, and a config with `Networks` but no `Network` fails as one with neither
(v0.20.2 required `Network` as well, so no valid config changes meaning). `EnableNFTables`, a bool, is
new; a change of it while the daemon runs needs a restart, as every other key (control/configwatch.py).

This daemon runs only the udp backend, so two extra checks come after flanneld's: a non-udp backend type
and an IPv6-only config are rejected with a message that says so (in etcd mode flannel always takes an
IPv4 subnet: a lease key names one, so an IPv4 Network is always required). With `EnableIPv6` the IPv6
half is checked as flanneld checks it, the lease manager takes a dual-stack lease
(control/lease_manager.py), and the engines forward the pods' IPv6 too, between flannel-udp hosts: over
the IPv6 underlay where both have a PublicIPv6, else over the IPv4 one
(docs/flannel-compat.md#network-config, docs/operating.md#dual-stack).
"""
from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any, NamedTuple, Optional

DEFAULT_UDP_PORT = 8285
SUPPORTED_BACKENDS = ("udp",)


class ConfigError(ValueError):
    """The network config is missing, malformed or rejected; str() is the operator-facing message."""


@dataclass(frozen=True)
class NetworkConfig:
    network: Optional[IPv4Network]
    subnet_len: int
    subnet_min: Optional[IPv4Address]
    subnet_max: Optional[IPv4Address]
    backend_type: str = "udp"
    backend_port: int = DEFAULT_UDP_PORT
    enable_ipv4: bool = True
    enable_ipv6: bool = False
    ipv6_network: Optional[IPv6Network] = None
    ipv6_subnet_len: int = 0
    ipv6_subnet_min: Optional[IPv6Address] = None
    ipv6_subnet_max: Optional[IPv6Address] = None
    backend: Optional[dict] = None          # the raw Backend object, for logging
    # Backend.DirectRouting (flanneld's vxlan backend's option; its udp backend ignores it):
    # peers on this host's link that have it too get a plain kernel route (control/direct.py)
    direct_routing: bool = False
    # EnableNFTables (flanneld v0.28): the masquerade and forward rules go into nftables even
    # where iptables exists (host/firewall.py)
    enable_nftables: bool = False
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def subnet_size(self) -> int:
        return 1 << (32 - self.subnet_len)

    def subnet_compatible(self, subnet: IPv4Network) -> bool:
        """flanneld's `isSubnetConfigCompat`: inside [SubnetMin, SubnetMax] with the configured length."""
        if self.network is None or self.subnet_min is None or self.subnet_max is None:
            return False
        return (subnet.prefixlen == self.subnet_len
                and self.subnet_min <= subnet.network_address <= self.subnet_max)

    def ipv6_subnet_compatible(self, subnet: Optional[IPv6Network]) -> bool:
        """flanneld's `isIPv6SubnetConfigCompat`: none without EnableIPv6; with it, one of
        IPv6SubnetLen inside [IPv6SubnetMin, IPv6SubnetMax]."""
        if not self.enable_ipv6:
            return subnet is None
        if subnet is None or self.ipv6_subnet_min is None or self.ipv6_subnet_max is None:
            return False
        return (subnet.prefixlen == self.ipv6_subnet_len
                and self.ipv6_subnet_min <= subnet.network_address <= self.ipv6_subnet_max)


# Go field name -> (kind). Matching is case-insensitive, as encoding/json does.
_FIELDS = {
    "EnableIPv4": "bool", "EnableIPv6": "bool", "EnableNFTables": "bool",
    "Network": "cidr4", "IPv6Network": "cidr6",
    "SubnetMin": "ip4", "SubnetMax": "ip4",
    "IPv6SubnetMin": "ip6", "IPv6SubnetMax": "ip6",
    "SubnetLen": "uint", "IPv6SubnetLen": "uint",
    "Backend": "raw",
}
_FIELDS_LOWER = {k.lower(): k for k in _FIELDS}

_GO_TYPES = {"bool": "bool", "uint": "uint", "cidr4": "ip.IP4Net", "cidr6": "ip.IP6Net",
             "ip4": "ip.IP4", "ip6": "ip.IP6"}


def _json_kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "null"


def _unmarshal_error(name: str, kind: str, v: Any) -> ConfigError:
    shown = _json_kind(v)
    # Go quotes the number it failed to parse as an integer, but not one given for a bool.
    if shown == "number" and kind != "bool":
        shown = f"number {v}"
    return ConfigError(f"json: cannot unmarshal {shown} into Go struct field Config.{name} of type {_GO_TYPES[kind]}")


def _parse_cidr(text: str, family: type):
    """A CIDR of ``family`` (IPv4Network or IPv6Network) with host bits allowed, as Go's ParseCIDR."""
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ConfigError(f"invalid CIDR address: {text}") from None
    if "/" not in text or not isinstance(net, family):
        raise ConfigError(f"invalid CIDR address: {text}")
    return net


def _convert(name: str, kind: str, v: Any) -> Any:
    """Decode one field's JSON value as Go would into flannel's Config struct; null leaves the default."""
    if v is None:
        return None
    if kind == "raw":
        return v
    if kind == "bool":
        if not isinstance(v, bool):
            raise _unmarshal_error(name, kind, v)
        return v
    if kind == "uint":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < 0:
            raise _unmarshal_error(name, kind, v)
        return int(v)
    if not isinstance(v, str):
        raise _unmarshal_error(name, kind, v)
    if kind == "cidr4":
        return _parse_cidr(v, IPv4Network)
    if kind == "cidr6":
        return _parse_cidr(v, IPv6Network)
    try:
        addr = ipaddress.ip_address(v)
    except ValueError:
        raise ConfigError("Invalid IP address format") from None
    if kind == "ip4":
        if not isinstance(addr, IPv4Address):
            raise ConfigError("Invalid IP address format")
        return addr
    if not isinstance(addr, IPv6Address):
        raise ConfigError("Invalid IP address format")
    return addr


def _decode_fields(doc: dict) -> dict:
    out: dict = {}
    for key, value in doc.items():      # dict keeps document order: a later duplicate wins, as in Go
        name = _FIELDS_LOWER.get(key.lower())
        if name is None:
            continue
        converted = _convert(name, _FIELDS[name], value)
        if converted is None and _FIELDS[name] != "raw":
            continue
        out[name] = converted
    return out


def _backend(fields: dict) -> tuple[str, int, Optional[dict], bool]:
    """`parseBackendType` plus the udp backend's own `{"Port": int}` decoding, and
    `DirectRouting` (a bool, as flanneld's vxlan backend decodes it)."""
    if "Backend" not in fields:
        return "udp", DEFAULT_UDP_PORT, None, False
    be = fields["Backend"]
    if be is None:                       # JSON null decodes into an empty struct: Type ""
        return "", DEFAULT_UDP_PORT, None, False
    if not isinstance(be, dict):
        raise ConfigError("error decoding Backend property of config: json: cannot unmarshal "
                          f"{_json_kind(be)} into Go value of type struct {{ Type string }}")
    btype, port, direct = "", DEFAULT_UDP_PORT, False
    for key, value in be.items():
        low = key.lower()
        if low == "type":
            if value is not None and not isinstance(value, str):
                raise ConfigError("error decoding Backend property of config: json: cannot unmarshal "
                                  f"{_json_kind(value)} into Go struct field .Type of type string")
            btype = value or ""
        elif low == "port":
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
                raise ConfigError("error decoding UDP backend config: json: cannot unmarshal "
                                  f"{_json_kind(value)} into Go struct field .Port of type int")
            port = int(value)
        elif low == "directrouting":
            if value is None:
                continue
            if not isinstance(value, bool):
                raise ConfigError("error decoding UDP backend config: json: cannot unmarshal "
                                  f"{_json_kind(value)} into Go struct field .DirectRouting of "
                                  "type bool")
            direct = value
    return btype, port, be, direct


class _Family(NamedTuple):
    """What flanneld's `CheckNetworkConfig` varies between its IPv4 and IPv6 halves."""
    bits: int
    address: type
    name: str            # "" or "IPv6": prefixes the config keys in messages
    longest_subnet: int  # SubnetLen must be below this + 1
    longest_network: int  # the smallest useful network's prefix length
    default_len: int     # SubnetLen when unset, for networks of default_len - 2 or shorter
    too_small_word: str  # how flanneld names the network in its "too small" message


_IPV4 = _Family(32, IPv4Address, "", 30, 28, 24, "network")
_IPV6 = _Family(128, IPv6Address, "IPv6", 126, 124, 64, "IPv6Network")


def _check_range(fam: _Family, network, subnet_len: int, smin, smax):
    """flanneld's `CheckNetworkConfig` for one family. Returns (subnet_len, subnet_min, subnet_max)."""
    p = fam.name
    if network is None:
        raise ConfigError(f"please define a correct {p}Network parameter in the flannel config")
    plen = network.prefixlen
    if subnet_len > 0:
        if subnet_len > fam.longest_subnet:
            raise ConfigError(f"SubnetLen must be less than /{fam.longest_subnet + 1}")
        if subnet_len < plen + 2:
            raise ConfigError("network must be able to accommodate at least four subnets")
    else:
        if plen > fam.longest_network:
            raise ConfigError(f"{fam.too_small_word} is too small. Minimum useful network prefix "
                              f"is /{fam.longest_network}")
        subnet_len = fam.default_len if plen <= fam.default_len - 2 else plen + 2
    size = 1 << (fam.bits - subnet_len)
    net_ip = int(network.network_address)
    # An explicit all-zero address counts as unset (Go compares against the zero IP).
    if smin is None or int(smin) == 0:
        smin = fam.address(net_ip + size)
    elif smin not in network:
        raise ConfigError(f"{p}SubnetMin is not in the range of the {p}Network")
    if smax is None or int(smax) == 0:
        smax = fam.address(net_ip + network.num_addresses - size)
    elif smax not in network:
        raise ConfigError(f"{p}SubnetMax is not in the range of the {p}Network")
    mask = ((1 << fam.bits) - 1) ^ (size - 1)
    if int(smin) & mask != int(smin):
        raise ConfigError(f"{p}SubnetMin is not on a SubnetLen boundary: {smin}")
    if int(smax) & mask != int(smax):
        raise ConfigError(f"{p}SubnetMax is not on a SubnetLen boundary: {smax}")
    return subnet_len, smin, smax


MAX_MESSAGE = 300      # a config value can be megabytes: messages quote at most this much


def parse_config(text: "str | bytes") -> NetworkConfig:
    """Parse and check a flannel network config; raise ConfigError with flanneld's message on failure.

    Anything in etcd is input: whatever its size, type or nesting, the outcome is a NetworkConfig or a
    ConfigError whose message stays short enough for one log line."""
    try:
        return _parse_config(text)
    except ConfigError as exc:
        msg = str(exc)
        if len(msg) <= MAX_MESSAGE:
            raise
        raise ConfigError(f"{msg[:MAX_MESSAGE]}... ({len(msg)} characters)") from None


def _parse_config(text: "str | bytes") -> NetworkConfig:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"invalid JSON in network config: {exc}") from None
    except RecursionError:
        raise ConfigError("invalid JSON in network config: nested too deeply to read") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"json: cannot unmarshal {_json_kind(doc)} into Go value of type subnet.Config")
    f = _decode_fields(doc)
    btype, port, be, direct = _backend(f)
    enable4 = f.get("EnableIPv4", True)
    enable6 = f.get("EnableIPv6", False)
    nftables = f.get("EnableNFTables", False)

    network = f.get("Network")
    net6 = f.get("IPv6Network")

    subnet_len, smin, smax = f.get("SubnetLen", 0), f.get("SubnetMin"), f.get("SubnetMax")
    if enable4:
        subnet_len, smin, smax = _check_range(_IPV4, network, subnet_len, smin, smax)
    len6, min6, max6 = f.get("IPv6SubnetLen", 0), f.get("IPv6SubnetMin"), f.get("IPv6SubnetMax")
    if enable6:
        len6, min6, max6 = _check_range(_IPV6, net6, len6, min6, max6)

    # Checks of this daemon, after flanneld's own.
    if not enable4 and not enable6:
        raise ConfigError("none defined stack: the config enables neither IPv4 nor IPv6")
    if not enable4:
        raise ConfigError("IPv6-only network config is not supported: in etcd mode flannel always takes "
                          "an IPv4 subnet (a lease key names one), so an IPv4 Network is required: "
                          "set EnableIPv4 (true by default) and Network beside EnableIPv6 and "
                          "IPv6Network, a dual-stack config whose pods' IPv6 this daemon forwards")
    if btype.lower() not in SUPPORTED_BACKENDS:
        raise ConfigError(f"unknown backend type: {btype} (this daemon runs only the "
                          f"{', '.join(SUPPORTED_BACKENDS)} backend)")
    if not 1 <= port <= 65535:
        raise ConfigError(f"error decoding UDP backend config: Port {port} is not in 1..65535")

    return NetworkConfig(
        network=network, subnet_len=subnet_len, subnet_min=smin, subnet_max=smax,
        backend_type=btype, backend_port=port, enable_ipv4=enable4, enable_ipv6=enable6,
        ipv6_network=net6, ipv6_subnet_len=len6, ipv6_subnet_min=min6, ipv6_subnet_max=max6,
        backend=be, direct_routing=direct, enable_nftables=nftables, raw=doc,
    )
