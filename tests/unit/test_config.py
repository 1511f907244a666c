"""parse_config against flanneld's own results and this daemon's extra checks
(docs/flannel-compat.md#network-config)."""
from ipaddress import IPv4Address, IPv4Network, IPv6Network

import pytest

from dataplane.control.config import ConfigError, parse_config

A = IPv4Address


# -- the compat table, row by row --------------------------------------------------------------------
def test_table_default_16():
    c = parse_config('{"Network":"10.5.0.0/16"}')
    assert c.backend_type == "udp" and c.backend_port == 8285
    assert (c.network, c.subnet_len, c.subnet_min, c.subnet_max) == (
        IPv4Network("10.5.0.0/16"), 24, A("10.5.1.0"), A("10.5.255.0"))
    assert c.enable_ipv4 and not c.enable_ipv6


def test_table_23():
    c = parse_config('{"Network":"10.5.0.0/23"}')
    assert (c.subnet_len, c.subnet_min, c.subnet_max) == (25, A("10.5.0.128"), A("10.5.1.128"))


def test_table_28():
    c = parse_config('{"Network":"10.5.0.0/28"}')
    assert (c.subnet_len, c.subnet_min, c.subnet_max) == (30, A("10.5.0.4"), A("10.5.0.12"))


def test_table_29_too_small():
    with pytest.raises(ConfigError, match=r"^network is too small. Minimum useful network prefix is /28$"):
        parse_config('{"Network":"10.5.0.0/29"}')


def test_table_subnetlen_20():
    c = parse_config('{"Network":"10.5.0.0/16","SubnetLen":20}')
    assert (c.subnet_len, c.subnet_min, c.subnet_max) == (20, A("10.5.16.0"), A("10.5.240.0"))


def test_table_subnetlen_17_four_subnets():
    with pytest.raises(ConfigError, match=r"^network must be able to accommodate at least four subnets$"):
        parse_config('{"Network":"10.5.0.0/16","SubnetLen":17}')


def test_table_subnetlen_31():
    with pytest.raises(ConfigError, match=r"^SubnetLen must be less than /31$"):
        parse_config('{"Network":"10.5.0.0/16","SubnetLen":31}')


def test_table_subnetmin_not_aligned():
    with pytest.raises(ConfigError, match=r"^SubnetMin is not on a SubnetLen boundary: 10.5.10.1$"):
        parse_config('{"Network":"10.5.0.0/16","SubnetMin":"10.5.10.1"}')


def test_table_normalised_cidr_uppercase_backend():
    c = parse_config('{"Network":"10.5.3.7/16","Backend":{"Type":"UDP","Port":8286}}')
    assert c.network == IPv4Network("10.5.0.0/16")
    assert c.backend_type == "UDP" and c.backend_port == 8286


# -- more of flanneld's rules -------------------------------------------------------------------------
@pytest.mark.parametrize("net,expected_len", [("10.0.0.0/8", 24), ("10.5.0.0/22", 24), ("10.5.0.0/24", 26),
                                              ("10.5.0.0/26", 28)])
def test_default_subnet_len(net, expected_len):
    assert parse_config(f'{{"Network":"{net}"}}').subnet_len == expected_len


def test_keys_are_case_insensitive_and_unknown_ignored():
    c = parse_config('{"network":"10.6.0.0/16","subnetlen":25,"SUBNETMIN":"10.6.0.128",'
                     '"backend":{"type":"udp","PORT":9000},"Whatever":[1,2]}')
    assert (c.network, c.subnet_len, c.subnet_min, c.backend_port) == (
        IPv4Network("10.6.0.0/16"), 25, A("10.6.0.128"), 9000)


def test_later_duplicate_key_wins():
    assert parse_config('{"Network":"10.1.0.0/16","network":"10.2.0.0/16"}').network == IPv4Network("10.2.0.0/16")


def test_subnet_min_max_explicit():
    c = parse_config('{"Network":"10.5.0.0/16","SubnetMin":"10.5.10.0","SubnetMax":"10.5.20.0"}')
    assert (c.subnet_min, c.subnet_max) == (A("10.5.10.0"), A("10.5.20.0"))
    assert c.subnet_compatible(IPv4Network("10.5.15.0/24"))
    assert not c.subnet_compatible(IPv4Network("10.5.21.0/24"))
    assert not c.subnet_compatible(IPv4Network("10.5.15.0/25"))


def test_backend_absent_is_udp_and_port_default():
    c = parse_config('{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}')
    assert c.backend_type == "udp" and c.backend_port == 8285


# -- keys as flanneld v0.28.9 has them ------------------------------------------------------------------
@pytest.mark.parametrize("text", ['{"Networks":["10.7.0.0/16","10.8.0.0/16"]}',
                                  '{"networks":["10.7.0.0/16"],"IPv6Networks":["fc00::/48"]}'])
def test_networks_list_alone_is_no_network(text):
    """`Networks` is no field of v0.28.9's config: without `Network` there is no network at all."""
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert str(err.value) == "please define a correct Network parameter in the flannel config"


@pytest.mark.parametrize("lists", ['"Networks":["10.7.0.0/16"]', '"Networks":"not a list"',
                                   '"Networks":[1,{"x":2}]', '"IPv6Networks":42', '"ipv6networks":null'])
def test_networks_lists_are_unknown_keys_ignored(lists):
    c = parse_config(f'{{"Network":"10.5.0.0/16",{lists}}}')
    assert c.network == IPv4Network("10.5.0.0/16") and c.subnet_len == 24
    assert c.ipv6_network is None


def test_enable_nftables_parsed_default_off():
    assert parse_config('{"Network":"10.5.0.0/16"}').enable_nftables is False
    assert parse_config('{"Network":"10.5.0.0/16","EnableNFTables":true}').enable_nftables is True
    assert parse_config('{"Network":"10.5.0.0/16","EnableNFTables":false}').enable_nftables is False
    # Go's field matching ignores case; null leaves the default; a later duplicate wins
    assert parse_config('{"Network":"10.5.0.0/16","enablenftables":true}').enable_nftables is True
    assert parse_config('{"Network":"10.5.0.0/16","EnableNFTables":null}').enable_nftables is False
    assert parse_config('{"Network":"10.5.0.0/16","EnableNFTables":true,'
                        '"ENABLENFTABLES":false}').enable_nftables is False


@pytest.mark.parametrize("value,shown", [('"true"', "string"), ("1", "number"), ("0", "number"),
                                         ("[true]", "array"), ('{"on":true}', "object")])
def test_enable_nftables_not_a_bool_is_go_unmarshal_error(value, shown):
    with pytest.raises(ConfigError) as err:
        parse_config(f'{{"Network":"10.5.0.0/16","EnableNFTables":{value}}}')
    assert str(err.value) == (f"json: cannot unmarshal {shown} into Go struct field "
                              "Config.EnableNFTables of type bool")


def test_number_into_a_bool_field_does_not_quote_the_number():
    """Go quotes the number only for integer fields it failed to parse (SubnetLen -1, above)."""
    with pytest.raises(ConfigError) as err:
        parse_config('{"Network":"10.5.0.0/16","EnableIPv4":1}')
    assert str(err.value) == ("json: cannot unmarshal number into Go struct field Config.EnableIPv4 "
                              "of type bool")


@pytest.mark.parametrize("text,message", [
    ('{}', "please define a correct Network parameter in the flannel config"),
    ('{"Network":""}', "invalid CIDR address: "),
    ('{"Network":"10.5.0.0"}', "invalid CIDR address: 10.5.0.0"),
    ('{"Network":"10.5.0.300/16"}', "invalid CIDR address: 10.5.0.300/16"),
    ('{"Network":"fc00::/48"}', "invalid CIDR address: fc00::/48"),
    ('{"Network":"10.5.0.0/16","SubnetMin":"10.6.1.0"}', "SubnetMin is not in the range of the Network"),
    ('{"Network":"10.5.0.0/16","SubnetMax":"10.6.1.0"}', "SubnetMax is not in the range of the Network"),
    ('{"Network":"10.5.0.0/16","SubnetMax":"10.5.10.7"}', "SubnetMax is not on a SubnetLen boundary: 10.5.10.7"),
    ('{"Network":"10.5.0.0/16","SubnetMin":"banana"}', "Invalid IP address format"),
    ('{"Network":"10.5.0.0/16","SubnetLen":"24"}',
     "json: cannot unmarshal string into Go struct field Config.SubnetLen of type uint"),
    ('{"Network":"10.5.0.0/16","SubnetLen":-1}',
     "json: cannot unmarshal number -1 into Go struct field Config.SubnetLen of type uint"),
    ('{"Network":16}', "json: cannot unmarshal number 16 into Go struct field Config.Network of type ip.IP4Net"),
    ('{"Network":"10.5.0.0/16","EnableIPv4":"yes"}',
     "json: cannot unmarshal string into Go struct field Config.EnableIPv4 of type bool"),
    ('{"Network":"10.5.0.0/16","Backend":"udp"}',
     "error decoding Backend property of config: json: cannot unmarshal string into Go value of type "
     "struct { Type string }"),
    ('{"Network":"10.5.0.0/16","Backend":{"Type":"udp","Port":"8285"}}',
     "error decoding UDP backend config: json: cannot unmarshal string into Go struct field .Port of type int"),
    ('{"Network":"10.5.0.0/16","Backend":{"Type":"udp","Port":70000}}',
     "error decoding UDP backend config: Port 70000 is not in 1..65535"),
    ('[1,2]', "json: cannot unmarshal array into Go value of type subnet.Config"),
])
def test_invalid(text, message):
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert str(err.value) == message


def test_not_json():
    with pytest.raises(ConfigError, match="invalid JSON"):
        parse_config('{"Network": "10.5.0.0/16"')


@pytest.mark.parametrize("backend", ["vxlan", "host-gw", "wireguard", "VXLAN"])
def test_other_backend_names_what_we_run(backend):
    with pytest.raises(ConfigError) as err:
        parse_config(f'{{"Network":"10.5.0.0/16","Backend":{{"Type":"{backend}"}}}}')
    msg = str(err.value)
    assert msg.startswith(f"unknown backend type: {backend}") and "only the udp backend" in msg


def test_empty_backend_object_is_unknown_type():
    with pytest.raises(ConfigError, match=r"^unknown backend type:  \(this daemon runs only the udp backend\)"):
        parse_config('{"Network":"10.5.0.0/16","Backend":{}}')


def test_ipv6_only_is_a_clear_error():
    with pytest.raises(ConfigError, match="IPv6-only network config is not supported: in etcd mode "
                                          "flannel always takes an IPv4 subnet .* so an IPv4 "
                                          "Network is required"):
        parse_config('{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48"}')


def test_no_stack():
    with pytest.raises(ConfigError, match="none defined stack"):
        parse_config('{"EnableIPv4":false}')


def test_dual_stack_parsed_ipv6_ignored():
    c = parse_config('{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48"}')
    assert c.enable_ipv6 and c.ipv6_network == IPv6Network("fc00::/48") and c.ipv6_subnet_len == 64
    assert c.network == IPv4Network("10.5.0.0/16")


@pytest.mark.parametrize("text,message", [
    ('{"Network":"10.5.0.0/16","EnableIPv6":true}',
     "please define a correct IPv6Network parameter in the flannel config"),
    ('{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/125"}',
     "IPv6Network is too small. Minimum useful network prefix is /124"),
    ('{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/64","IPv6SubnetLen":127}',
     "SubnetLen must be less than /127"),
    ('{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/64","IPv6SubnetLen":65}',
     "network must be able to accommodate at least four subnets"),
    ('{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetMin":"fc01::"}',
     "IPv6SubnetMin is not in the range of the IPv6Network"),
    ('{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetMax":"fc01::"}',
     "IPv6SubnetMax is not in the range of the IPv6Network"),
    # v0.28.9 names SubnetLen (not IPv6SubnetLen) in the IPv6 boundary messages
    ('{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48",'
     '"IPv6SubnetMin":"fc00:0:0:1::1"}',
     "IPv6SubnetMin is not on a SubnetLen boundary: fc00:0:0:1::1"),
    ('{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48",'
     '"IPv6SubnetMax":"fc00:0:0:2:8000::"}',
     "IPv6SubnetMax is not on a SubnetLen boundary: fc00:0:0:2:8000::"),
    ('{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"10.6.0.0/16"}',
     "invalid CIDR address: 10.6.0.0/16"),
])
def test_invalid_ipv6(text, message):
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert str(err.value) == message

