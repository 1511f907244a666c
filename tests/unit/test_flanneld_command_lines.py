"""Command lines and FLANNELD_* environments that flanneld v0.20.2 accepts, taken from its
documentation, common systemd units, distribution wrappers and Helm charts: each row is
argv + environment -> the options flannel-udp resolves, or its exit code and message."""
from __future__ import annotations

import os

import pytest

from dataplane import cli
from dataplane.cli import flanneld_flags


def resolve(argv, env):
    return flanneld_flags.resolve(cli.build_parser().parse_args(["run", *argv]), env)


# (argv, env, expected Options attributes; "warns": a text some warning must contain)
ACCEPTED = [
    pytest.param(["-etcd-endpoints=http://10.0.0.1:2379", "-iface=eth1", "-ip-masq"], {},
                 {"etcd_endpoints": ["http://10.0.0.1:2379"], "iface": ["eth1"], "ip_masq": True},
                 id="flanneld-docs"),
    pytest.param(["--etcd-endpoints=10.0.0.1:2379"], {},
                 {"etcd_endpoints": ["10.0.0.1:2379"]}, id="endpoint-without-scheme"),
    pytest.param(["-etcd-endpoints", "10.0.0.1:2379,10.0.0.2:2379"], {},
                 {"etcd_endpoints": ["10.0.0.1:2379", "10.0.0.2:2379"]}, id="endpoints-space"),
    pytest.param(["--etcd-endpoints=unix://localhost:2379"], {},
                 {"etcd_endpoints": ["unix://localhost:2379"]}, id="unix-endpoint-relative"),
    pytest.param(["--etcd-endpoints=unix:///run/etcd/etcd.sock,http://10.0.0.1:2379"], {},
                 {"etcd_endpoints": ["unix:///run/etcd/etcd.sock", "http://10.0.0.1:2379"]},
                 id="unix-endpoint-absolute"),
    pytest.param(["-v=2"], {}, {"v": 2}, id="v=2"),
    pytest.param(["--v=2"], {}, {"v": 2}, id="--v=2"),
    pytest.param(["-v", "2"], {}, {"v": 2}, id="v-space-2"),
    pytest.param(["--v", "3", "-ip-masq"], {}, {"v": 3, "ip_masq": True}, id="--v-space-3"),
    pytest.param(["-v=010"], {}, {"v": 10}, id="klog-v-is-base-10"),
    pytest.param(["--kube-subnet-mgr=false", "--kube-annotation-prefix=flannel.alpha.coreos.com"],
                 {}, {"etcd_prefix": "/coreos.com/network"}, id="kube-defaults-some"),
    pytest.param(["--kube-subnet-mgr=false", "--kube-api-url=", "--kubeconfig-file=",
                  "--kube-annotation-prefix=flannel.alpha.coreos.com",
                  "--net-config-path=/etc/kube-flannel/net-conf.json",
                  "--set-node-network-unavailable=true", "--ip-masq"], {},
                 {"ip_masq": True}, id="kube-defaults-all"),
    pytest.param(["-ip-masq=false"], {}, {"ip_masq": False}, id="bool=false"),
    pytest.param(["--iptables-resync=5"], {}, {"iptables_resync": 5}, id="iptables-resync"),
    pytest.param(["-iptables-resync", "10", "--iptables-forward-rules=false"], {},
                 {"iptables_resync": 10, "iptables_forward_rules": False}, id="resync-space"),
    pytest.param(["-subnet-lease-renew-margin=010"], {}, {"subnet_lease_renew_margin": 8},
                 id="go-int-leading-0-is-octal"),
    # RHEL/CentOS flanneld-start: the sysconfig values, then $FLANNEL_OPTIONS
    pytest.param(["-etcd-endpoints=http://127.0.0.1:2379", "-etcd-prefix=/atomic.io/network",
                  "-iface", "eth0"], {},
                 {"etcd_prefix": "/atomic.io/network", "iface": ["eth0"]}, id="rhel-flanneld-start"),
    # a hand-made unit with TLS to etcd and a dual-stack health port
    pytest.param(["--etcd-endpoints=https://10.0.0.1:2379,https://10.0.0.2:2379",
                  "--etcd-cafile=/etc/kubernetes/ssl/ca.pem",
                  "--etcd-certfile=/etc/kubernetes/ssl/flanneld.pem",
                  "--etcd-keyfile=/etc/kubernetes/ssl/flanneld-key.pem",
                  "--etcd-prefix=/kube-centos/network", "--iface=ens33", "--ip-masq",
                  "--healthz-ip=::", "--healthz-port=10254"], {},
                 {"etcd_prefix": "/kube-centos/network", "etcd_cafile": "/etc/kubernetes/ssl/ca.pem",
                  "healthz_ip": "::", "healthz_port": 10254, "ip_masq": True},
                 id="unit-tls-healthz-v6"),
    pytest.param(["--healthz-ip", "::1", "--healthz-port", "10254", "--metrics=[::1]:9285"], {},
                 {"healthz_ip": "::1", "metrics": "[::1]:9285"}, id="healthz-and-metrics-v6"),
    # Go stops at the first argument that is no flag: `-ip-masq false` is -ip-masq=true
    pytest.param(["-ip-masq", "false", "-iface", "eth0"], {},
                 {"ip_masq": True, "iface": [], "warns": "ignored 'false -iface eth0'"},
                 id="bool-space-value-ends-flags"),
    pytest.param(["-iface", "eth0", "--", "-ip-masq"], {},
                 {"iface": ["eth0"], "ip_masq": False, "warns": "ignored '-ip-masq'"},
                 id="double-dash-ends-flags"),
    # environment only (a flanneld EnvironmentFile), and the command line winning over it
    pytest.param([], {"FLANNELD_ETCD_ENDPOINTS": "10.0.0.1:2379", "FLANNELD_IFACE": "eth1",
                      "FLANNELD_IP_MASQ": "true", "FLANNELD_V": "2",
                      "FLANNELD_SUBNET_LEASE_RENEW_MARGIN": "30",
                      "FLANNELD_KUBE_SUBNET_MGR": "false"},
                 {"etcd_endpoints": ["10.0.0.1:2379"], "iface": ["eth1"], "ip_masq": True, "v": 2,
                  "subnet_lease_renew_margin": 30}, id="env-only"),
    pytest.param(["-iface=eth0", "-v=1"], {"FLANNELD_IFACE": "eth1", "FLANNELD_V": "2"},
                 {"iface": ["eth0"], "v": 1}, id="flags-win-over-env"),
    pytest.param([], {"FLANNELD_IPTABLES_RESYNC": "5s"},
                 {"iptables_resync": 5, "warns": "FLANNELD_IPTABLES_RESYNC"},
                 id="bad-env-resync-ignored"),
    pytest.param([], {"FLANNELD_IPTABLES_FORWARD_RULES": "yes", "FLANNELD_IP_MASQ": "true"},
                 {"iptables_forward_rules": True, "ip_masq": True,
                  "warns": "FLANNELD_IPTABLES_FORWARD_RULES"}, id="bad-env-bool-ignored"),
    pytest.param([], {"FLANNELD_KUBE_SUBNET_MGR": "maybe"},
                 {"warns": "FLANNELD_KUBE_SUBNET_MGR"}, id="bad-env-kube-ignored"),
]


@pytest.mark.parametrize("argv,env,expected", ACCEPTED)
def test_flanneld_command_line_accepted(argv, env, expected):
    o = resolve(argv, env)
    expected = dict(expected)
    warns = expected.pop("warns", None)
    assert {k: getattr(o, k) for k in expected} == expected
    if warns:
        assert any(warns in w for w in o.warnings), o.warnings
    else:
        assert o.warnings == []


# (argv, env, exit code, text in the output)
EXITS = [
    pytest.param(["--kube-subnet-mgr"], {}, 1, "--kube-subnet-mgr=true asks for flanneld's "
                 "Kubernetes mode", id="kube-subnet-mgr"),
    pytest.param(["--ip-masq", "--kube-subnet-mgr=true"], {}, 1, "no Kubernetes subnet manager",
                 id="kube-subnet-mgr=true"),
    pytest.param(["--kube-api-url=https://10.96.0.1:443"], {}, 1, "--kube-api-url",
                 id="kube-api-url"),
    pytest.param(["--set-node-network-unavailable=false"], {}, 1,
                 "--set-node-network-unavailable", id="kube-non-default-bool"),
    pytest.param([], {"FLANNELD_KUBE_SUBNET_MGR": "true"}, 1, "FLANNELD_KUBE_SUBNET_MGR",
                 id="kube-from-env"),
    pytest.param(["-subnet-lease-renew-margin=1440"], {}, 1, "--subnet-lease-renew-margin",
                 id="renew-margin-1440"),
    pytest.param(["-subnet-lease-renew-margin", "0"], {}, 1, "out of range 1..1439",
                 id="renew-margin-0"),
    pytest.param([], {"FLANNELD_SUBNET_LEASE_RENEW_MARGIN": "1440"}, 1,
                 "FLANNELD_SUBNET_LEASE_RENEW_MARGIN", id="renew-margin-env"),
    pytest.param(["--bogus"], {}, 1, "flag provided but not defined: --bogus", id="unknown"),
    pytest.param(["-etcd-endpoints=http://10.0.0.1:2379", "-iface"], {}, 1,
                 "flag needs an argument: -iface", id="missing-value"),
    pytest.param(["---iface=eth0"], {}, 1, "bad flag syntax: ---iface=eth0", id="three-dashes"),
    pytest.param(["--etcd-endpoints=ftp://10.0.0.1:2379"], {}, 1, "--etcd-endpoints",
                 id="endpoint-scheme"),
    pytest.param(["--healthz-port=abc"], {}, 1, "--healthz-port", id="int-value"),
    pytest.param(["--ip-masq=maybe"], {}, 1, "--ip-masq", id="bool-value"),
    pytest.param(["--metrics=::1:9285"], {}, 1, "[::1]:9285", id="metrics-v6-unbracketed"),
    pytest.param(["-help"], {}, 0, "--etcd-endpoints", id="help"),
]


class _NoDaemon:
    def __init__(self, opts, early=None):
        raise AssertionError(f"the command line was accepted: {opts}")


@pytest.mark.parametrize("argv,env,code,text", EXITS)
def test_flanneld_command_line_exit(argv, env, code, text, monkeypatch, capsys):
    for name in [n for n in os.environ if n.startswith(flanneld_flags.ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("dataplane.daemon.main.Daemon", _NoDaemon)
    try:
        rc = cli.main(["run", *argv])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    assert rc == code, out
    assert text in out.err + out.out
