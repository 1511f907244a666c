"""`flannel-udp forward` argument parsing (no root: nothing is opened)."""
from __future__ import annotations

import ipaddress

import pytest

from dataplane.cli import build_parser


def parse(*argv):
    return build_parser().parse_args(["forward", *argv])


def test_defaults_and_routes():
    a = parse("--tun-addr", "10.5.1.0/32", "--listen", "192.168.77.1:8285",
              "--route", "10.5.2.0/24=192.168.77.2", "--route", "10.5.3.0/24=192.168.77.3:9000")
    assert a.tun_addr == ipaddress.IPv4Interface("10.5.1.0/32")
    assert a.listen == ("192.168.77.1", 8285)
    assert a.route == [(ipaddress.IPv4Network("10.5.2.0/24"), "192.168.77.2", None),
                       (ipaddress.IPv4Network("10.5.3.0/24"), "192.168.77.3", 9000)]
    assert a.tun_name == "flannel%d" and a.network is None and a.mtu is None
    assert a.engine is None and a.accept_from == "any"


def test_dual_stack_arguments():
    """The bench's inner-IPv6 paths: the TUN's IPv6 address (a bare one is a /128), the IPv6
    network's route, and an IPv6 subnet routed to an IPv4 peer."""
    a = parse("--tun-addr", "10.5.1.0/32", "--listen", "192.168.77.1:8285",
              "--tun-addr6", "fc00:5:0:1::", "--network6", "fc00:5::/56",
              "--route", "fc00:5:0:2::/64=192.168.77.2:8285")
    assert a.tun_addr6 == ipaddress.IPv6Interface("fc00:5:0:1::/128")
    assert a.network6 == ipaddress.IPv6Network("fc00:5::/56")
    assert a.route == [(ipaddress.IPv6Network("fc00:5:0:2::/64"), "192.168.77.2", 8285)]
    plain = parse("--tun-addr", "10.5.1.0/32", "--listen", "192.168.77.1:8285")
    assert plain.tun_addr6 is None and plain.network6 is None


def test_listen_port_defaults_to_8285():
    assert parse("--tun-addr", "10.5.1.0", "--listen", "192.168.77.1").listen == \
        ("192.168.77.1", 8285)


@pytest.mark.parametrize("argv, flag", [
    (["--route", "10.5.2.0/24"], "--route"),
    (["--route", "10.5.2.0/24=host"], "--route"),
    (["--route", "10.5.2.1/24=192.168.77.2"], "--route"),     # host bits set
    (["--route", "10.5.2.0/24=192.168.77.2:70000"], "--route"),
    (["--mtu", "20"], "--mtu"),
    (["--engine", "go"], "--engine"),
    (["--network", "10.5.0.0/33"], "--network"),
    (["--tun-addr6", "10.5.1.0"], "--tun-addr6"),
    (["--network6", "10.5.0.0/16"], "--network6"),
    (["--route", "fc00:5:0:2::/64=fc00::2"], "--route"),       # the underlay is IPv4
])
def test_bad_values_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        parse("--tun-addr", "10.5.1.0/32", "--listen", "192.168.77.1:8285", *argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


def test_bad_listen_exits_2(capsys):
    with pytest.raises(SystemExit):
        parse("--tun-addr", "10.5.1.0/32", "--listen", "nowhere:1")
    assert "--listen" in capsys.readouterr().err


def test_route_file_lines_and_comments(tmp_path):
    from dataplane.cli.forward import read_route_file
    f = tmp_path / "routes"
    f.write_text("# 2 peers\n10.6.0.0/24=172.16.0.1\n\n10.6.1.0/24=172.16.0.2:9000  # second\n")
    assert read_route_file(str(f)) == [
        (ipaddress.IPv4Network("10.6.0.0/24"), "172.16.0.1", None),
        (ipaddress.IPv4Network("10.6.1.0/24"), "172.16.0.2", 9000)]


def test_route_file_names_the_bad_line(tmp_path):
    from dataplane.cli.forward import read_route_file
    f = tmp_path / "routes"
    f.write_text("10.6.0.0/24=172.16.0.1\n10.6.1.0/24=nowhere\n")
    with pytest.raises(ValueError, match="line 2"):
        read_route_file(str(f))
