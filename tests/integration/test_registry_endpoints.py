"""etcd endpoints spelled as flanneld's operators spell them, against a real etcd: HOST:PORT
without a scheme, unix://NAME (a socket in the working directory, etcd's own spelling) and
unix:///PATH."""
from __future__ import annotations

from ipaddress import IPv4Network

import pytest

from dataplane.control.etcd_errors import RegistryError
from dataplane.control.registry import Registry
from dataplane.testbed.etcd import EtcdServer
from tests.conftest import require_etcd, wait_until
from tests.integration.conftest import unique_prefix

pytestmark = pytest.mark.etcd
CONFIG = '{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}'


def round_trip(endpoints: list[str]) -> str:
    """Write the config through one Registry, read it back through another: the URL that served."""
    prefix = unique_prefix("ep")
    with Registry(endpoints, prefix=prefix, timeout=5) as writer:
        writer.put_config(CONFIG)
    with Registry(endpoints, prefix=prefix, timeout=5) as reader:
        assert reader.get_config().network == IPv4Network("10.5.0.0/16")
        assert reader.list_leases()[0] == []
        return reader.current_endpoint


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_endpoint_without_scheme(shared_etcd, host):
    ep = f"{host}:{shared_etcd.client_port}"
    assert round_trip([ep]) == ep


def test_endpoint_without_scheme_fails_over(shared_etcd):
    # the first endpoint has no etcd: the scheme-less second one serves
    ep = f"127.0.0.1:{shared_etcd.client_port}"
    assert round_trip(["127.0.0.1:1", ep]) == ep


@pytest.fixture
def unix_etcd(tmp_path, monkeypatch):
    """An etcd whose only client listener is the socket `localhost:<port>` in tmp_path (etcd
    makes unix://NAME sockets in its working directory); the test runs in tmp_path too."""
    require_etcd()
    monkeypatch.chdir(tmp_path)
    server = EtcdServer()
    name = f"localhost:{server.client_port}"
    server.extra_args = ("--listen-client-urls", f"unix://{name}",
                         "--advertise-client-urls", f"unix://{name}")
    try:
        server.start(wait=False)      # its health check speaks TCP: wait for the socket here
        with Registry([f"unix://{name}"], prefix=unique_prefix("ep"), timeout=1) as probe:
            def answers() -> bool:
                assert server.is_running(), server.log_tail()
                try:
                    probe.current_revision()
                    return True
                except RegistryError:
                    return False
            wait_until(answers, 20, 0.1, lambda: f"etcd on {name}: {server.log_tail()}")
        assert (tmp_path / name).is_socket()
        yield name
    finally:
        server.close()


def test_unix_endpoint_relative(unix_etcd):
    assert round_trip([f"unix://{unix_etcd}"]) == f"unix://{unix_etcd}"


def test_unix_endpoint_absolute(unix_etcd, tmp_path):
    ep = f"unix://{tmp_path}/{unix_etcd}"
    assert ep.startswith("unix:///")
    assert round_trip([ep]) == ep


def test_unix_endpoint_is_no_tcp_port(unix_etcd):
    # unix://localhost:PORT names a file: nothing listens on TCP localhost:PORT
    port = int(unix_etcd.rsplit(":", 1)[1])
    with pytest.raises(RegistryError):
        round_trip([f"localhost:{port}"])
