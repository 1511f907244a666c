"""subnet.env, written and read back exactly as flanneld does (docs/flannel-compat.md#subnet-env).

    FLANNEL_NETWORK=10.5.0.0/16
    FLANNEL_SUBNET=10.5.84.1/24      (lease network address + 1, lease prefix length)
    FLANNEL_IPV6_NETWORK=fc00:5::/48        (with EnableIPv6 only: IPv6Network)
    FLANNEL_IPV6_SUBNET=fc00:5:0:54::1/64   (with EnableIPv6 only: as FLANNEL_SUBNET, the IPv6 part)
    FLANNEL_MTU=1472
    FLANNEL_IPMASQ=false

Written with dataplane.host.atomicfile (a fresh temporary name in the same directory, renamed over it) so
that a reader never sees half a file and a link planted in the directory is never followed.
At start the file is read back to prefer the previous subnet; a truncated or garbage file is ignored
with a warning (a wrong previous subnet would only cost us the preference, never correctness). The two
IPv6 lines are read each on its own, as flanneld reads them: a bad one is dropped with a warning and
costs only the IPv6 half of the preference.
"""
from __future__ import annotations

import logging
import os
from ipaddress import IPv4Interface, IPv4Network, IPv6Network, ip_interface, ip_network
from typing import Optional

from ..host.atomicfile import write_atomic

log = logging.getLogger(__name__)


def _first_address(subnet) -> str:
    """flanneld writes the subnet's first address after the network's, with the subnet's length."""
    return f"{subnet.network_address + 1}/{subnet.prefixlen}"


def format_subnet_env(parts, mtu: int, ipmasq: bool) -> str:
    """The file's text for ``parts`` (host/family.py Part: the overlay's network and the
    lease's subnet in it, per family, IPv4 first); the IPv6 lines only when the IPv6 part has
    a subnet (EnableIPv6 and a lease with an IPv6 part)."""
    by = {p.family.version: p for p in parts}
    v4, six = by[4], by.get(6)
    v6 = ""
    if six is not None and six.subnet is not None:
        if six.network is None:
            raise ValueError("the IPv6 lines need both the IPv6 network and the IPv6 subnet")
        v6 = (f"FLANNEL_IPV6_NETWORK={six.network}\n"
              f"FLANNEL_IPV6_SUBNET={_first_address(six.subnet)}\n")
    return (f"FLANNEL_NETWORK={v4.network}\n"
            f"FLANNEL_SUBNET={IPv4Interface(_first_address(v4.subnet))}\n"
            f"{v6}"
            f"FLANNEL_MTU={int(mtu)}\n"
            f"FLANNEL_IPMASQ={'true' if ipmasq else 'false'}\n")


def write_subnet_env(path: str, parts, mtu: int, ipmasq: bool) -> None:
    """Atomically replace `path` (``parts`` as format_subnet_env's), mode 0644; raises OSError
    (flanneld only warns: the caller decides)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o755, exist_ok=True)
    write_atomic(path, format_subnet_env(parts, mtu, ipmasq), mode=0o644)


def _parse_lines(text: str) -> dict:
    """A small godotenv: KEY=VALUE lines, `#` comments, optional `export ` and quotes."""
    out = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key or not key.replace("_", "").isalnum():
            raise ValueError(f"line {lineno} is not KEY=VALUE: {line[:60]!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[key] = value
    return out


def _validate(env: dict) -> None:
    if "FLANNEL_SUBNET" not in env:
        raise ValueError("no FLANNEL_SUBNET")
    iface = ip_interface(env["FLANNEL_SUBNET"])
    if iface.version != 4 or "/" not in env["FLANNEL_SUBNET"]:
        raise ValueError(f"FLANNEL_SUBNET is not an IPv4 address/prefix: {env['FLANNEL_SUBNET']!r}")
    if "FLANNEL_NETWORK" in env:
        net = ip_network(env["FLANNEL_NETWORK"], strict=False)
        if net.version != 4:
            raise ValueError(f"FLANNEL_NETWORK is not IPv4: {env['FLANNEL_NETWORK']!r}")
    if "FLANNEL_MTU" in env:
        int(env["FLANNEL_MTU"])
    if "FLANNEL_IPMASQ" in env and env["FLANNEL_IPMASQ"].lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"FLANNEL_IPMASQ is not a boolean: {env['FLANNEL_IPMASQ']!r}")


def _ipv6_value(name: str, value: str):
    """FLANNEL_IPV6_NETWORK or FLANNEL_IPV6_SUBNET parsed; ValueError if it is no IPv6 prefix."""
    if "/" not in value:
        raise ValueError("no prefix length")
    parsed = ip_network(value, strict=False) if name == "FLANNEL_IPV6_NETWORK" else ip_interface(value)
    if parsed.version != 6:
        raise ValueError("not IPv6")
    return parsed


def _drop_bad_ipv6(env: dict, path: str) -> None:
    for name in ("FLANNEL_IPV6_NETWORK", "FLANNEL_IPV6_SUBNET"):
        if name not in env:
            continue
        try:
            _ipv6_value(name, env[name])
        except ValueError as exc:
            log.warning("ignoring %s=%.60r in subnet file %s: %s (not an IPv6 address/prefix)",
                        name, env.pop(name), path, exc)


def read_subnet_env(path: str) -> Optional[dict]:
    """Return the file's variables as strings, or None if it is absent or unusable (warned)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(64 * 1024)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("ignoring subnet file %s: %s", path, exc)
        return None
    try:
        env = _parse_lines(raw.decode("utf-8"))
        _validate(env)
    except (ValueError, UnicodeDecodeError) as exc:
        log.warning("ignoring truncated or malformed subnet file %s: %s", path, exc)
        return None
    _drop_bad_ipv6(env, path)
    return env


def previous_subnet(env: Optional[dict]) -> Optional[IPv4Network]:
    """FLANNEL_SUBNET parsed back to the lease: `10.5.84.1/24` -> 10.5.84.0/24."""
    if not env or "FLANNEL_SUBNET" not in env:
        return None
    try:
        iface = ip_interface(env["FLANNEL_SUBNET"])
    except ValueError:
        return None
    return iface.network if iface.version == 4 else None


def previous_ipv6_subnet(env: Optional[dict]) -> Optional[IPv6Network]:
    """FLANNEL_IPV6_SUBNET parsed back to the lease's IPv6 part: `fc00:5:0:54::1/64` -> fc00:5:0:54::/64."""
    try:
        return _ipv6_value("FLANNEL_IPV6_SUBNET", env["FLANNEL_IPV6_SUBNET"]).network if env else None
    except (KeyError, ValueError):
        return None


def read_previous_subnet(path: str) -> Optional[IPv4Network]:
    return previous_subnet(read_subnet_env(path))


def previous_network(env: Optional[dict]) -> Optional[IPv4Network]:
    """FLANNEL_NETWORK as written last time (the iptables recycling compares it)."""
    try:
        net = ip_network(env["FLANNEL_NETWORK"], strict=False) if env else None
    except (KeyError, ValueError):
        return None
    return net if net is not None and net.version == 4 else None


def previous_ipv6_network(env: Optional[dict]) -> Optional[IPv6Network]:
    """FLANNEL_IPV6_NETWORK as written last time (the ip6tables recycling compares it)."""
    try:
        return _ipv6_value("FLANNEL_IPV6_NETWORK", env["FLANNEL_IPV6_NETWORK"]) if env else None
    except (KeyError, ValueError):
        return None


def _previous_masq(env: Optional[dict]) -> Optional[bool]:
    masq = (env or {}).get("FLANNEL_IPMASQ", "").lower()
    return True if masq in ("true", "1") else False if masq in ("false", "0") else None


def read_previous_rules(path: str):
    """(network, subnet, ipmasq) of the last run, each None when unknown."""
    env = read_subnet_env(path)
    return previous_network(env), previous_subnet(env), _previous_masq(env)


def read_previous_rules6(path: str):
    """(IPv6 network, IPv6 subnet, ipmasq) of the last run, each None when unknown."""
    env = read_subnet_env(path)
    return previous_ipv6_network(env), previous_ipv6_subnet(env), _previous_masq(env)
