"""Lease keys and values exactly as flanneld writes and reads them
(docs/flannel-compat.md#etcd-keys, docs/flannel-compat.md#lease-value)."""
import json
from itertools import islice
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from dataplane.control.lease import (Lease, LeaseAttrs, LeaseFormatError, lease_from_kv, parse_subnet_key,
                             subnet_key_name)


def test_udp_value_is_byte_exact():
    assert LeaseAttrs(IPv4Address("192.168.77.1")).to_json() == b'{"PublicIP":"192.168.77.1","PublicIPv6":null}'


def test_roundtrip():
    a = LeaseAttrs(IPv4Address("1.2.3.4"))
    assert LeaseAttrs.from_json(a.to_json()) == a


def test_key_name_and_parse():
    s = IPv4Network("10.5.84.0/24")
    assert subnet_key_name(s) == "10.5.84.0-24"
    assert parse_subnet_key("/coreos.com/network/subnets/10.5.84.0-24") == (s, None)
    assert parse_subnet_key("10.5.84.0-24") == (s, None)


def test_dual_stack_key():
    s, v6 = IPv4Network("10.5.84.0/24"), IPv6Network("fc00::/64")
    assert subnet_key_name((s, v6)) == "10.5.84.0-24&fc00::-64"
    assert parse_subnet_key("/x/subnets/10.5.84.0-24&fc00::-64") == (s, v6)


@pytest.mark.parametrize("name", ["10.5.84.0-24", "0.0.0.0-0", "10.0.0.0-8", "10.5.84.4-30",
                                  "10.5.84.2-31", "10.5.84.1-32"])
def test_a_parsed_key_is_the_network_ipaddress_makes(name):
    """The common key's network is made without ipaddress's checks (16,000 in a listing): the
    same object as its constructor's, attribute for attribute."""
    made, built = parse_subnet_key(name)[0], IPv4Network(name.replace("-", "/"))
    assert type(made) is IPv4Network and list(vars(made)) == list(vars(built))
    data = lambda net: {k: v for k, v in vars(net).items() if k != "hosts"}  # (/31, /32: a method)
    assert data(made) == data(built)
    assert made == built and hash(made) == hash(built) and str(made) == str(built)
    assert list(islice(made.hosts(), 2)) == list(islice(built.hosts(), 2))
    assert made.broadcast_address == built.broadcast_address


def test_a_read_public_ip_is_the_address_ipaddress_makes():
    made = LeaseAttrs.from_json(b'{"PublicIP":"192.168.77.1","PublicIPv6":null}').public_ip
    built = IPv4Address("192.168.77.1")
    assert type(made) is IPv4Address and made == built and hash(made) == hash(built)
    assert made.packed == built.packed and str(made) == str(built) and int(made) == int(built)


@pytest.mark.parametrize("name", ["10.5.84.0", "10.5.84-24", "10.5.84.0-24x", "abc", "10.5.84.0-33",
                                  "300.5.84.0-24", "", "10.5.84.0_24", "10.5.84.7-24", "10.5.84.0-0"])
def test_bad_keys(name):
    with pytest.raises(LeaseFormatError):
        parse_subnet_key(name)


def test_reads_other_backends_values():
    vx = json.dumps({"PublicIP": "10.0.0.2", "PublicIPv6": None, "BackendType": "vxlan",
                     "BackendData": {"VNI": 1, "VtepMAC": "aa:bb:cc:dd:ee:ff"}})
    a = LeaseAttrs.from_json(vx)
    assert a.public_ip == IPv4Address("10.0.0.2") and a.backend_type == "vxlan"
    assert a.backend_data["VNI"] == 1
    # Go's decoder matches keys case-insensitively and ignores unknown ones.
    b = LeaseAttrs.from_json(b'{"publicip":"10.0.0.3","publicIPv6":"fc00::1","Extra":1}')
    assert b.public_ip == IPv4Address("10.0.0.3") and b.public_ipv6 == IPv6Address("fc00::1")
    # An older flanneld omitted PublicIPv6 entirely.
    assert LeaseAttrs.from_json(b'{"PublicIP":"10.0.0.4"}').public_ipv6 is None


def test_other_backend_fields_written_back_in_go_order():
    a = LeaseAttrs(IPv4Address("10.0.0.2"), backend_type="vxlan", backend_data={"VNI": 1})
    assert a.to_json() == b'{"PublicIP":"10.0.0.2","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1}}'


@pytest.mark.parametrize("raw", [b"", b"null", b"[]", b"{", b'{"PublicIP":null}', b'{"PublicIP":"x"}',
                                 b'{"PublicIP":"fc00::1"}', b'{"PublicIP":"1.2.3.4","PublicIPv6":"zz"}',
                                 b"\xff\xfe", b'{"PublicIP":5}', b'{"PublicIP":["1.2.3.4"]}',
                                 b'{"PublicIP":"1.2.3.4","x":' + b"[" * 100000 + b"]" * 100000 + b"}",
                                 b'{"PublicIP":"' + b"9" * (1 << 20) + b'"}'])
def test_bad_values(raw):
    with pytest.raises(LeaseFormatError):
        LeaseAttrs.from_json(raw)


def test_lease_from_kv():
    l = lease_from_kv("/p/subnets/10.5.3.0-24", b'{"PublicIP":"1.1.1.1","PublicIPv6":null}', lease_id=7,
                      mod_revision=9)
    assert l.subnet == IPv4Network("10.5.3.0/24") and l.public_ip == IPv4Address("1.1.1.1")
    assert (l.lease_id, l.mod_revision) == (7, 9)


def test_errors_quote_huge_values_briefly():
    for raw in (b"x" * (1 << 20), b'{"PublicIP":"' + b"9" * (1 << 20) + b'"}', b"[" * 100000):
        with pytest.raises(LeaseFormatError) as e:
            LeaseAttrs.from_json(raw)
        assert len(str(e.value)) < 300
    with pytest.raises(LeaseFormatError, match="host bits"):
        parse_subnet_key("/p/subnets/10.5.3.7-24")


def test_peer_problem():
    from dataplane.control.lease import peer_problem
    net = IPv4Network("10.5.0.0/16")

    def lease(subnet, ip):
        return lease_from_kv(f"/p/subnets/{subnet}", f'{{"PublicIP":"{ip}"}}')
    assert peer_problem(lease("10.5.3.0-24", "192.168.1.2"), net) is None
    assert "outside" in peer_problem(lease("10.6.3.0-24", "192.168.1.2"), net)
    assert "outside" in peer_problem(lease("0.0.0.0-0", "192.168.1.2"), net)
    for ip in ("0.0.0.0", "127.0.0.1", "224.0.0.1", "255.255.255.255"):
        assert ip in peer_problem(lease("10.5.3.0-24", ip), net)
    assert "inside the Network" in peer_problem(lease("10.5.3.0-24", "10.5.9.1"), net)
    assert peer_problem(lease("10.6.3.0-24", "10.5.9.1"), None) is None


def test_a_lease_crosses_a_pickle_whole():
    """The peer watch process hands the daemon leases pickled (as numbers, not strings)."""
    import pickle
    lease = Lease(IPv4Network("10.5.7.0/24"),
                  LeaseAttrs(IPv4Address("192.168.77.7"), IPv6Address("fd00::7"), "udp",
                             {"VNI": 1}, None),
                  IPv6Network("fd01::/64"), 1795560000.5, 0x1234, 42, "/p/subnets/a-key")
    back = pickle.loads(pickle.dumps(lease, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == lease and back.key == lease.key and back.attrs.backend_data == {"VNI": 1}
    assert isinstance(back.subnet, IPv4Network) and isinstance(back.public_ip, IPv4Address)
    assert b"10.5.7.0" not in pickle.dumps(lease)         # numbers, not strings to parse again


def test_forwards_ipv6_mark_is_written_after_flanneld_fields_and_read_back():
    """A flannel-udp host that forwards IPv6 says so in its value (control/routes.py routes a
    peer's IPv6 part only then); flanneld reads past the field."""
    a = LeaseAttrs(IPv4Address("192.168.77.1"), forwards_ipv6=True)
    assert a.to_json() == b'{"PublicIP":"192.168.77.1","PublicIPv6":null,"ForwardsIPv6":true}'
    assert LeaseAttrs.from_json(a.to_json()) == a
    assert not LeaseAttrs.from_json(b'{"PublicIP":"192.168.77.1","forwardsipv6":"yes"}').forwards_ipv6
