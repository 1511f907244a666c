"""A listing's leases read in one loop (control/lease.py leases_of_kvs): the same Leases as
lease_from_kv's, field for field, and every other key or value left to the general way."""
from dataclasses import fields

import pytest
from pyetcd.etcdrpc import kv_pb2

from dataplane.control.lease import Lease, LeaseFormatError, lease_from_kv, leases_of_kvs

P = "/coreos.com/network/subnets/"
UDP = b'{"PublicIP":"%s","PublicIPv6":null}'
KEYS = [f"{P}10.5.{i}.0-24" for i in (0, 1, 99, 255)] + [
    f"{P}0.0.0.0-0", f"{P}10.5.3.128-25", f"{P}10.5.3.7-32", f"{P}10.5.3.6-31",
    f"{P}10.5.3.7-24",                  # host bits set: refused
    f"{P}010.5.3.0-24", f"{P}10.5.3.0-024", f"{P}10.5.3.0-33", f"{P}10.5.300.0-24",
    f"{P}10.5.3-24", f"{P}10.5.3.0-24\n", f"{P}10.5.3.0-24&fc00::-64", f"{P}10.5.3.0-24x",
    "10.5.3.0-24", f"{P}10.5/3.0-24", f"{P}1.2.3.4.5-24", f"{P}\u00e9.5.3.0-24",
    f"{P}10.5.3.0\x00-24", f"{P}-24", f"{P}10.5.3.0-", f"{P}10.5.3.0-24-24", f"{P}10.5.3.0--24",
    f"{P}10.5.3.0-+24", f"{P}10.5.3.0-2\u0664", f"{P}10.5.3.0- 24"]
VALUES = [UDP % ip for ip in (b"1.2.3.4", b"255.255.255.255", b"0.0.0.0", b"01.2.3.4",
                              b"1.2.3", b"1.2.3.256")] + [
    b'{"PublicIP":"1.2.3.4","PublicIPv6":null} ', b'{"PublicIP":"1.2.3.4"}',
    b'{"PublicIP":"1.2.3.4","PublicIPv6":"fc00::1","BackendType":"udp"}',
    b'{"publicip":"1.2.3.4","DirectRouting":true}', b'{"PublicIP":"1.2.3.4",', b"",
    b"\xff\xfe", UDP % b"1.2.3.4\x00", UDP % b"\xff.2.3.4", UDP % b"",
    b'{"PublicIP":","PublicIPv6":null}',
    UDP % b"1.2.3.4" + b"\n", b" " + UDP % b"1.2.3.4", UDP % b'1.2.3.4","PublicIPv6":"fc00::1',
    UDP % b"1.2.3.4 "] + [
    # a DirectRouting network's values (LeaseAttrs.to_json), read in the loop too, and others
    b'{"PublicIP":"1.2.3.4","PublicIPv6":null,"DirectRouting":true}',
    b'{"PublicIP":"01.2.3.4","PublicIPv6":null,"DirectRouting":true}',
    b'{"PublicIP":"1.2.3.4","PublicIPv6":null,"DirectRouting":false}',
    b'{"PublicIP":"1.2.3.4","PublicIPv6":null,"DirectRouting":true,"ForwardsIPv6":true}',
    b'{"PublicIP":"1.2.3.4","PublicIPv6":null,"DirectRouting":true} ',
    b'{"PublicIP":"1.2.3.4","PublicIPv6":null,"DirectRouting":1}']


def _general(kv):
    try:
        return lease_from_kv(kv.key.decode("utf-8", errors="replace"), kv.value,
                             lease_id=kv.lease, mod_revision=kv.mod_revision,
                             create_revision=kv.create_revision)
    except LeaseFormatError as e:
        return ("bad", kv.key, str(e))


def _whole(x):
    """Every field, the compare=False ones too, with each value's type."""
    if not isinstance(x, Lease):
        return x
    attrs = x.attrs
    return ([(f.name, type(getattr(x, f.name)), getattr(x, f.name)) for f in fields(x)],
            [(f.name, type(getattr(attrs, f.name)), getattr(attrs, f.name))
             for f in fields(attrs)],
            # a /31's and a /32's hosts is a method bound to its own network
            {k: v.__name__ if callable(v) else v for k, v in vars(x.subnet).items()})


def test_every_key_and_value_reads_as_lease_from_kv_reads_it():
    kvs = [kv_pb2.KeyValue(key=k.encode(), value=v, lease=7 * i, mod_revision=100 + i,
                           create_revision=50 + i)
           for i, (k, v) in enumerate((k, v) for k in KEYS for v in VALUES)]
    got = leases_of_kvs(kvs, _general)
    assert len(got) == len(kvs)
    assert [_whole(x) for x in got] == [_whole(_general(kv)) for kv in kvs]
    # the set covers both ways: leases read in the loop, and bad keys and values
    assert sum(isinstance(x, Lease) for x in got) > 20
    assert sum(isinstance(x, tuple) for x in got) > 100


def test_only_what_the_loop_cannot_read_goes_the_general_way():
    sent = []
    direct = b'{"PublicIP":"1.2.3.6","PublicIPv6":null,"DirectRouting":true}'
    kvs = [kv_pb2.KeyValue(key=f"{P}10.5.1.0-24".encode(), value=UDP % b"1.2.3.4"),
           kv_pb2.KeyValue(key=f"{P}10.5.2.0-24".encode(), value=b'{"PublicIP":"1.2.3.5"}'),
           kv_pb2.KeyValue(key=f"{P}10.5.3.0-24".encode(), value=direct)]
    got = leases_of_kvs(kvs, lambda kv: sent.append(kv.key) or "general")
    assert sent == [f"{P}10.5.2.0-24".encode()]
    assert got[1] == "general" and got[0] == _general(kvs[0]) and got[2] == _general(kvs[2])
    assert got[2].attrs.direct_routing and not got[0].attrs.direct_routing


@pytest.mark.parametrize("n", [0, 1, 3])
def test_keeps_the_listing_order(n):
    kvs = [kv_pb2.KeyValue(key=f"{P}10.5.{i}.0-24".encode(), value=UDP % b"1.2.3.4")
           for i in range(n)]
    assert [x.key for x in leases_of_kvs(kvs, _general)] == [kv.key.decode() for kv in kvs]


def test_a_listed_lease_is_a_frozen_lease_that_pickles_and_replaces_as_one():
    """The loop makes its Leases of another class's slots and then gives them Lease's class
    (control/lease.py _fields_of): what comes out is frozen, hashes, pickles and is replaced
    as a Lease made by its constructor."""
    import dataclasses
    import pickle
    kv = kv_pb2.KeyValue(key=f"{P}10.5.1.0-24".encode(), value=UDP % b"1.2.3.4", lease=9,
                         mod_revision=11, create_revision=10)
    got, built = leases_of_kvs([kv], _general)[0], _general(kv)
    assert type(got) is Lease and type(got.attrs) is type(built.attrs)
    for obj, name in ((got, "key"), (got.attrs, "public_ip")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)
    assert hash(got) == hash(built) and {got: 1}[built] == 1
    assert _whole(pickle.loads(pickle.dumps(got))) == _whole(built)
    assert _whole(dataclasses.replace(got, lease_id=3)) == \
        _whole(dataclasses.replace(built, lease_id=3))
