"""subnet.env in flanneld's format, written atomically, read back tolerantly
(docs/flannel-compat.md#subnet-env)."""
import os
from ipaddress import IPv4Network

import pytest

from dataplane.control.subnetfile import read_previous_subnet, read_subnet_env, write_subnet_env
from dataplane.host.family import Part

N, S = IPv4Network("10.5.0.0/16"), IPv4Network("10.5.84.0/24")


def test_exact_format(tmp_path):
    p = tmp_path / "run" / "flannel" / "subnet.env"          # directories are created
    write_subnet_env(str(p), [Part(N, S)], 1472, False)
    assert p.read_text() == ("FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.84.1/24\n"
                             "FLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n")
    assert oct(p.stat().st_mode & 0o777) == oct(0o644 & ~_umask())
    assert not (p.parent / ".subnet.env").exists()


def _umask():
    old = os.umask(0)
    os.umask(old)
    return old


def test_ipmasq_true_and_overwrite(tmp_path):
    p = str(tmp_path / "subnet.env")
    write_subnet_env(p, [Part(N, S)], 1472, False)
    write_subnet_env(p, [Part(N, IPv4Network("10.5.9.0/24"))], 1400, True)
    env = read_subnet_env(p)
    assert env == {"FLANNEL_NETWORK": "10.5.0.0/16", "FLANNEL_SUBNET": "10.5.9.1/24",
                   "FLANNEL_MTU": "1400", "FLANNEL_IPMASQ": "true"}
    assert read_previous_subnet(p) == IPv4Network("10.5.9.0/24")


def test_atomic_rename_keeps_old_inode_readers(tmp_path):
    p = str(tmp_path / "subnet.env")
    write_subnet_env(p, [Part(N, S)], 1472, False)
    with open(p) as reader:
        write_subnet_env(p, [Part(N, IPv4Network("10.5.1.0/24"))], 1472, False)
        assert "10.5.84.1/24" in reader.read()        # the old file, complete
    assert "10.5.1.1/24" in open(p).read()


def test_missing_file(tmp_path):
    assert read_subnet_env(str(tmp_path / "nope")) is None
    assert read_previous_subnet(str(tmp_path / "nope")) is None


def test_reads_flanneld_file_with_ipv6_lines_and_comments(tmp_path):
    p = tmp_path / "subnet.env"
    p.write_text("# written by flanneld\nFLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.51.1/24\n"
                 "FLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\nFLANNEL_IPV6_NETWORK=fc00::/48\n"
                 'FLANNEL_IPV6_SUBNET="fc00:0:0:1::1/64"\n')
    env = read_subnet_env(str(p))
    assert env["FLANNEL_IPV6_SUBNET"] == "fc00:0:0:1::1/64"
    assert read_previous_subnet(str(p)) == IPv4Network("10.5.51.0/24")


@pytest.mark.parametrize("content", [
    b"FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.",          # truncated mid-line
    b"FLANNEL_NETWORK=10.5.0.0/16\n",                               # truncated before FLANNEL_SUBNET
    b"\x00\x01garbage\xff",
    b"this is not an env file\n",
    b"FLANNEL_SUBNET=10.5.84.1\n",                                  # no prefix length
    b"FLANNEL_SUBNET=fc00::1/64\n",
    b"FLANNEL_SUBNET=10.5.84.1/24\nFLANNEL_MTU=abc\n",
    b"",
])
def test_garbage_ignored_with_warning(tmp_path, caplog, content):
    p = tmp_path / "subnet.env"
    p.write_bytes(content)
    assert read_subnet_env(str(p)) is None
    assert read_previous_subnet(str(p)) is None
    assert "ignoring" in caplog.text
