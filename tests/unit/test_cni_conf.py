"""The suite's stand-in for flannel's CNI plugin (dataplane/testbed/cni.py) hands ``bridge`` what
the real plugin (v1.1.0, under the netconf flannel's manifests install) hands it from the same
subnet.env: docs/flannel-compat.md#cni-plugin. The expected configs are the real plugin's,
saved by it in its dataDir on an ADD, but for the keys the plugin leaves to ``bridge``'s
defaults or to its netconf (``bridge``, ``cniVersion``) and host-local's dataDir."""
from __future__ import annotations

from dataplane.testbed.cni import flannel_conf

DUAL = {"FLANNEL_NETWORK": "10.66.0.0/16", "FLANNEL_SUBNET": "10.66.21.1/24",
        "FLANNEL_IPV6_NETWORK": "fc00:66::/56", "FLANNEL_IPV6_SUBNET": "fc00:66:0:62::1/64",
        "FLANNEL_MTU": "1472", "FLANNEL_IPMASQ": "false"}
V4_MASQ = {"FLANNEL_NETWORK": "10.5.0.0/16", "FLANNEL_SUBNET": "10.5.84.1/24",
           "FLANNEL_MTU": "1472", "FLANNEL_IPMASQ": "true"}

REAL = {
    "dual": {"hairpinMode": True, "ipMasq": True,
             "ipam": {"ranges": [[{"subnet": "10.66.21.0/24"}], [{"subnet": "fc00:66:0:62::/64"}]],
                      "routes": [{"dst": "10.66.0.0/16"}, {"dst": "fc00:66::/56"}],
                      "type": "host-local"},
             "isDefaultGateway": True, "isGateway": True, "mtu": 1472, "name": "cbr0",
             "type": "bridge"},
    "v4_masq": {"hairpinMode": True, "ipMasq": False,
                "ipam": {"ranges": [[{"subnet": "10.5.84.0/24"}]],
                         "routes": [{"dst": "10.5.0.0/16"}], "type": "host-local"},
                "isDefaultGateway": True, "isGateway": True, "mtu": 1472, "name": "cbr0",
                "type": "bridge"},
}


def _as_real_saves_it(conf: dict) -> dict:
    conf = {k: v for k, v in conf.items() if k not in ("bridge", "cniVersion")}
    conf["ipam"] = {k: v for k, v in conf["ipam"].items() if k != "dataDir"}
    return conf


def test_dual_stack_subnet_env_as_the_real_plugin_delegates_it():
    conf = flannel_conf(DUAL, "/nowhere")
    assert _as_real_saves_it(conf) == REAL["dual"]
    assert conf["bridge"] == "cni0"       # bridge's default, which the real plugin leaves it
    assert conf["ipam"]["dataDir"] == "/nowhere"


def test_ipv4_subnet_env_with_ip_masq_as_the_real_plugin_delegates_it():
    assert _as_real_saves_it(flannel_conf(V4_MASQ, "/nowhere")) == REAL["v4_masq"]
