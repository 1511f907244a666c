"""Pods made by the real CNI plugins, run as a container runtime runs them.

flannel's own CNI plugin reads the host's subnet.env and delegates to the ``bridge`` plugin
with ``host-local`` addresses from the host's lease: one range per family on a dual-stack
config (FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET, each as its network address), a route to each
family's network, the bridge as the pods' gateway, flannel0's MTU, and masquerading by the
bridge only where flanneld does none; the netconf flannel's manifests install adds
``hairpinMode`` and ``isDefaultGateway`` (a default route of each family via the bridge) to
what it delegates (docs/flannel-compat.md#cni-plugin). :func:`flannel_conf` writes that
delegated config; :func:`add` and :func:`delete` run
the plugins by the CNI protocol: the plugin's binary from ``CNI_PATH``, run in the host's
namespace, ``CNI_COMMAND``, ``CNI_CONTAINERID``, ``CNI_NETNS``, ``CNI_IFNAME`` and
``CNI_PATH`` in its environment, the config on stdin, the result (or the error) on stdout.
Debian ships the plugins in ``containernetworking-plugins``.

The addresses the plugins hand out are kept in a directory the caller names (host-local's
``dataDir``, in the testbed's workdir), never in the machine's /var/lib/cni.
"""
from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass, field

from . import netns as ns

CNI_PATH = "/usr/lib/cni"
CNI_VERSION = "1.0.0"
BRIDGE = "cni0"             # flannel's bridge name


class CniError(RuntimeError):
    """A plugin failed; the message holds its command and the error it printed."""


def plugins_present(path: str = CNI_PATH) -> bool:
    return all(os.access(os.path.join(path, p), os.X_OK) for p in ("bridge", "host-local"))


def flannel_conf(env: dict, data_dir: str, name: str = "cbr0") -> dict:
    """The config flannel's CNI plugin hands to ``bridge`` for a host whose subnet.env is
    ``env`` (as :meth:`Overlay.subnet_env` reads it). host-local wants each range's network
    address, subnet.env has the gateway's."""
    ranges = [[{"subnet": str(ipaddress.ip_interface(env["FLANNEL_SUBNET"]).network)}]]
    routes = [{"dst": env["FLANNEL_NETWORK"]}]
    if "FLANNEL_IPV6_SUBNET" in env:
        ranges.append([{"subnet": str(ipaddress.ip_interface(env["FLANNEL_IPV6_SUBNET"]).network)}])
        routes.append({"dst": env["FLANNEL_IPV6_NETWORK"]})
    return {"cniVersion": CNI_VERSION, "name": name, "type": "bridge", "bridge": BRIDGE,
            "isGateway": True, "isDefaultGateway": True, "hairpinMode": True,
            "mtu": int(env["FLANNEL_MTU"]),
            "ipMasq": env.get("FLANNEL_IPMASQ") != "true",
            "ipam": {"type": "host-local", "ranges": ranges, "routes": routes,
                     "dataDir": data_dir}}


@dataclass
class Pod:
    """A pod the plugins made: its namespace (the testbed's) and the plugins' result."""
    host: object
    netns: str
    container_id: str
    conf: dict = field(repr=False)
    result: dict = field(repr=False)
    ifname: str = "eth0"

    def ip(self, version: int) -> str:
        """The pod's address of one family, as the plugins gave it."""
        found = [ipaddress.ip_interface(a["address"]).ip for a in self.result.get("ips", ())]
        return str(next(a for a in found if a.version == version))


def _run(tb, host, command: str, conf: dict, netns: str, container_id: str, ifname: str,
         cni_path: str) -> str:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id,
           "CNI_NETNS": os.path.join(ns.NETNS_DIR, netns), "CNI_IFNAME": ifname,
           "CNI_PATH": cni_path, "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
    r = tb.exec(host, [os.path.join(cni_path, conf["type"])], input=json.dumps(conf), env=env,
                timeout=60)
    if r.returncode != 0:
        raise CniError(f"{conf['type']} {command} for {container_id} in {netns} failed "
                       f"({r.returncode}): {r.stdout.strip()} {r.stderr.strip()}")
    return r.stdout


def add(tb, host, name: str, conf: dict, *, ifname: str = "eth0",
        cni_path: str = CNI_PATH) -> Pod:
    """A new namespace for pod ``name`` of ``host`` (the testbed's, deleted with it) and the
    plugins' ADD into it."""
    netns = tb.add_netns(host, name)
    container_id = f"{netns}-{ifname}"
    out = _run(tb, host, "ADD", conf, netns, container_id, ifname, cni_path)
    return Pod(tb.host(host), netns, container_id, conf, json.loads(out), ifname)


def delete(tb, pod: Pod, *, cni_path: str = CNI_PATH) -> None:
    """The plugins' DEL: the pod's interface gone and its addresses given back to host-local."""
    _run(tb, pod.host, "DEL", pod.conf, pod.netns, pod.container_id, pod.ifname, cni_path)


def leased(conf: dict) -> list[str]:
    """The addresses host-local holds for ``conf``'s network: a file per address in its
    dataDir (beside its lock and its last handed-out address per range)."""
    where = os.path.join(conf["ipam"]["dataDir"], conf["name"])
    try:
        names = os.listdir(where)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n != "lock" and not n.startswith("last_reserved_ip"))
