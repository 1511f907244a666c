"""flannel-udp run's flags: flanneld's names, defaults, Go-style spelling, FLANNELD_* env."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dataplane.cli import flanneld_flags
from dataplane.cli import build_parser


def resolve(argv, env=None):
    args = build_parser().parse_args(["run", *argv])
    return flanneld_flags.resolve(args, env or {})


def test_defaults_are_flanneld_defaults():
    o = resolve([])
    assert o.etcd_endpoints == ["http://127.0.0.1:4001", "http://127.0.0.1:2379"]
    assert o.etcd_prefix == "/coreos.com/network"
    assert o.subnet_file == "/run/flannel/subnet.env"
    assert o.subnet_lease_renew_margin == 60
    assert o.ip_masq is False
    assert o.iptables_resync == 5
    assert o.iptables_forward_rules is True
    assert (o.healthz_ip, o.healthz_port) == ("0.0.0.0", 0)
    assert o.iface == [] and o.iface_regex == [] and o.public_ip == ""
    assert (o.engine, o.accept_from, o.metrics, o.trace) == ("auto", "leases", "", False)


def test_every_default_is_the_daemons_and_the_help_names_it():
    from dataplane.daemon.options import Options
    from dataplane.engine.contract import ICMP_BURST_DEFAULT, ICMP_RATE_DEFAULT
    o, daemon = resolve([]), Options()
    for f in flanneld_flags.FLAGS:
        if f.group != "kube":
            assert getattr(o, f.dest) == getattr(daemon, f.dest), f.name
            assert o.sources[f.dest] == "default"
        assert "{default}" not in f.help_text, f.name
    assert (o.icmp_rate, o.icmp_burst) == (ICMP_RATE_DEFAULT, ICMP_BURST_DEFAULT)
    by_name = flanneld_flags.FLAG_BY_NAME
    assert f"(default: {ICMP_RATE_DEFAULT})" in by_name["icmp-rate"].help_text
    assert f"(default: {ICMP_BURST_DEFAULT})" in by_name["icmp-burst"].help_text
    assert f"(default: {daemon.etcd_prefix})" in by_name["etcd-prefix"].help_text
    assert ",".join(daemon.etcd_endpoints) in by_name["etcd-endpoints"].help_text


@pytest.mark.parametrize("argv", [
    ["-etcd-endpoints=http://10.0.0.1:2379", "-ip-masq", "-v=1", "-iface=eth0"],
    ["--etcd-endpoints", "http://10.0.0.1:2379", "--ip-masq", "-v", "1", "--iface", "eth0"],
    ["-etcd-endpoints", "http://10.0.0.1:2379", "-ip-masq=true", "-v1", "--iface=eth0"],
])
def test_go_and_gnu_spellings(argv):
    o = resolve(argv)
    assert o.etcd_endpoints == ["http://10.0.0.1:2379"]
    assert o.ip_masq is True and o.v == 1 and o.iface == ["eth0"]


def test_operator_flanneld_command_line_unchanged():
    # a typical systemd unit's ExecStart for flanneld
    argv = ("-etcd-endpoints=https://10.0.0.1:2379,https://10.0.0.2:2379 "
            "-etcd-prefix=/coreos.com/network -etcd-cafile=/etc/ssl/ca.pem "
            "-etcd-certfile=/etc/ssl/cert.pem -etcd-keyfile=/etc/ssl/key.pem "
            "-iface=eth1 -iface=10.0.0.5 -iface-regex=^enp -public-ip=203.0.113.7 "
            "-subnet-file=/run/flannel/subnet.env -subnet-lease-renew-margin=30 "
            "-ip-masq=true -iptables-forward-rules=false -iptables-resync=10 "
            "-healthz-ip=127.0.0.1 -healthz-port=10254 -v=2 -vmodule=foo=3").split()
    o = resolve(argv)
    assert o.etcd_endpoints == ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]
    assert o.iface == ["eth1", "10.0.0.5"] and o.iface_regex == ["^enp"]
    assert o.public_ip == "203.0.113.7" and o.subnet_lease_renew_margin == 30
    assert o.ip_masq and not o.iptables_forward_rules and o.iptables_resync == 10
    assert (o.healthz_ip, o.healthz_port, o.v) == ("127.0.0.1", 10254, 2)
    assert any("vmodule" in w for w in o.warnings)


# flanneld v0.28.9's unit file, its ExecStart verbatim (docs/flannel-compat.md#flanneld-v0-28)
V028_EXEC_START = ("--etcd-endpoints=http://10.0.0.1:2379 --etcd-prefix=/coreos.com/network "
                   "--iface=eth1 --ip-masq --ip-masq-fully-random-disable --ip-blackhole-route "
                   "--iptables-resync=5 --subnet-lease-renew-margin=1439 "
                   "--healthz-ip=127.0.0.1 --healthz-port=10254")


def test_flanneld_v028_command_line_unchanged():
    o = resolve(V028_EXEC_START.split())
    assert o.ip_masq and o.ip_masq_fully_random_disable and o.ip_blackhole_route
    assert o.subnet_lease_renew_margin == 1439 and o.iptables_resync == 5
    assert o.warnings == []
    default = resolve([])
    assert not default.ip_masq_fully_random_disable and not default.ip_blackhole_route


def test_flanneld_v028_flags_from_its_environment_file():
    env = {"FLANNELD_IP_MASQ_FULLY_RANDOM_DISABLE": "true", "FLANNELD_IP_BLACKHOLE_ROUTE": "1"}
    o = resolve([], env)
    assert o.ip_masq_fully_random_disable and o.ip_blackhole_route
    assert o.sources["ip_blackhole_route"] == "env"
    # the command line wins over the environment, as in flanneld
    o = resolve(["--ip-blackhole-route=false"], env)
    assert not o.ip_blackhole_route and o.sources["ip_blackhole_route"] == "flag"
    # a value that does not parse is logged and ignored, as flanneld does
    o = resolve([], {"FLANNELD_IP_BLACKHOLE_ROUTE": "sometimes"})
    assert not o.ip_blackhole_route
    assert any("FLANNELD_IP_BLACKHOLE_ROUTE" in w for w in o.warnings)


def test_env_fills_missing_flags_only():
    env = {"FLANNELD_ETCD_ENDPOINTS": "http://1.2.3.4:2379", "FLANNELD_IP_MASQ": "true",
           "FLANNELD_IFACE": "eth9", "FLANNELD_SUBNET_LEASE_RENEW_MARGIN": "5",
           "FLANNELD_ENGINE": "python", "FLANNELD_ACCEPT_FROM": "any"}
    o = resolve(["--iface", "eth0"], env)
    assert o.etcd_endpoints == ["http://1.2.3.4:2379"]
    assert o.ip_masq is True and o.subnet_lease_renew_margin == 5
    assert o.iface == ["eth0"]                      # command line wins
    assert o.engine == "python" and o.accept_from == "any"
    assert o.sources["iface"] == "flag" and o.sources["ip_masq"] == "env"


@pytest.mark.parametrize("argv,name", [
    (["--subnet-lease-renew-margin=0"], "--subnet-lease-renew-margin"),
    (["--subnet-lease-renew-margin=1440"], "--subnet-lease-renew-margin"),
    (["--healthz-port=70000"], "--healthz-port"),
    (["-kube-subnet-mgr"], "--kube-subnet-mgr"),
    (["--kubeconfig-file=/x"], "--kubeconfig-file"),
])
def test_bad_values_name_the_flag(argv, name):
    with pytest.raises(flanneld_flags.FlagError, match=name):
        resolve(argv)


def test_unparsable_env_is_logged_and_ignored():
    # flanneld logs a FLANNELD_* value it cannot parse and keeps the default
    o = resolve([], {"FLANNELD_IP_MASQ": "maybe", "FLANNELD_IPTABLES_FORWARD_RULES": "no way",
                     "FLANNELD_HEALTHZ_PORT": "10254"})
    assert o.ip_masq is False and o.iptables_forward_rules is True and o.healthz_port == 10254
    assert o.sources["ip_masq"] == "default" and o.sources["healthz_port"] == "env"
    assert [w.split("=")[0] for w in o.warnings] == ["ignored FLANNELD_IP_MASQ",
                                                    "ignored FLANNELD_IPTABLES_FORWARD_RULES"]
    assert "'maybe' is not a boolean" in o.warnings[0] and "using false" in o.warnings[0]


def test_unparsable_env_warning_is_logged_by_run(tmp_path):
    # nothing to reach: the daemon stops at the interface, after the warnings are logged
    env = dict(os.environ, FLANNELD_IPTABLES_RESYNC="often")
    r = _run("--iface=fu-no-such-if0", f"--subnet-file={tmp_path}/subnet.env", env=env)
    assert r.returncode == 1, r.stderr
    assert "WARNING" in r.stderr and "ignored FLANNELD_IPTABLES_RESYNC='often'" in r.stderr


def test_kube_flag_false_is_fine():
    assert resolve(["-kube-subnet-mgr=false"]).etcd_prefix == "/coreos.com/network"


def test_metrics_values():
    assert resolve(["--metrics", "127.0.0.1:9285"]).metrics_listen() == ("127.0.0.1", 9285)
    assert resolve(["--metrics=:9285"]).metrics_listen() == ("0.0.0.0", 9285)
    assert resolve(["--metrics=[::1]:9285"]).metrics_listen() == ("::1", 9285)
    assert resolve(["--metrics=[0:0::0]:9285"]).metrics == "[::]:9285"
    o = resolve([])
    assert o.metrics_listen() is None and o.metrics_on_healthz()
    assert not resolve(["--metrics=off"]).metrics_on_healthz()


def _run(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "dataplane", "run", *argv], capture_output=True,
                          text=True, timeout=60, env=env)


def test_help_lists_every_flag():
    out = _run("--help").stdout
    for f in flanneld_flags.FLAGS:
        spelled = f"--{f.name}" if len(f.name) > 1 else f"-{f.name}"
        assert spelled in out, spelled
        assert f.env in out


@pytest.mark.parametrize("argv,name", [
    (["--bogus"], "--bogus"),
    (["--healthz-port=abc"], "--healthz-port"),
    (["--engine=rust"], "--engine"),
    (["--accept-from=nobody"], "--accept-from"),
    (["--etcd-endpoints=ftp://x"], "--etcd-endpoints"),
    (["--public-ip=1.2.3"], "--public-ip"),
    (["--iface-regex=("], "--iface-regex"),
    (["--ip-masq=perhaps"], "--ip-masq"),
    (["--subnet-lease-renew-margin=0"], "--subnet-lease-renew-margin"),
    (["--kube-subnet-mgr"], "no Kubernetes subnet manager"),
])
def test_cli_bad_flag_exits_1_naming_it(argv, name):
    r = _run(*argv)
    assert r.returncode == 1
    assert name in r.stderr, r.stderr


@pytest.mark.parametrize("spelling", ["-version", "--version"])
def test_version_is_the_bare_string_on_stderr(spelling):
    from dataplane import __version__
    r = _run(spelling)
    assert r.returncode == 0 and r.stderr == f"{__version__}\n" and r.stdout == ""


def test_trace_without_any_server_warns():
    assert any("--trace" in w for w in resolve(["--trace"]).warnings)
    assert not any("--trace" in w for w in resolve(["--trace", "--healthz-port=10254"]).warnings)
    assert not any("--trace" in w for w in resolve(["--trace", "--metrics=:9285"]).warnings)


def test_handover_flags():
    o = resolve([])
    assert (o.handover, o.handover_socket) == (False, "/run/flannel/handover.sock")
    o = resolve(["-handover", "--handover-socket=/run/x/h.sock"])
    assert (o.handover, o.handover_socket) == (True, "/run/x/h.sock")
    o = resolve(["--handover-socket="], {"FLANNELD_HANDOVER": "true"})
    assert (o.handover, o.handover_socket) == (True, "")          # no handover offered


def test_public_ipv6_is_a_global_unicast_ipv6_address(capsys):
    """--public-ipv6 names this host's IPv6 underlay (docs/flags.md): a peer must be able to
    send to it, so it is checked as it is read, with words that say why."""
    assert resolve(["--public-ipv6=FD00:99::0001"]).public_ipv6 == "fd00:99::1"
    assert resolve([], {"FLANNELD_PUBLIC_IPV6": "2001:db8::7"}).public_ipv6 == "2001:db8::7"
    assert not any("public-ipv6" in w for w in resolve(["--public-ipv6=2001:db8::7"]).warnings)
    for bad, why in (("10.0.0.1", "not an IPv6 address"), ("fd00::/64", "not an IPv6 address"),
                     ("::1", "not a global unicast"), ("::", "not a global unicast"),
                     ("fe80::1", "not a global unicast"), ("ff02::1", "not a global unicast"),
                     ("::ffff:10.0.0.1", "IPv4-mapped")):
        with pytest.raises(SystemExit):
            resolve([f"--public-ipv6={bad}"])
        err = capsys.readouterr().err
        assert "--public-ipv6" in err and why in err, (bad, err)
    # from the environment, as any value that does not parse: said and ignored
    o = resolve([], {"FLANNELD_PUBLIC_IPV6": "fe80::1"})
    assert o.public_ipv6 == "" and any("FLANNELD_PUBLIC_IPV6" in w for w in o.warnings)
