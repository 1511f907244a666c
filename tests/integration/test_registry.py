"""The etcd registry against a real etcd: config, leases, guarded writes, watch resume, auth and TLS."""
from __future__ import annotations

import logging
import threading
import time
from ipaddress import IPv4Address, IPv4Network

import pytest

from dataplane.control import etcd as etcd_transport
from dataplane.control.etcd_errors import RegistryDeniedError, RegistryError, RegistryUnavailableError
from dataplane.control.lease import LeaseAttrs
from dataplane.control.registry import CONFIG_NOT_FOUND, ConfigNotFoundError, Registry
from dataplane.testbed.etcd import EtcdServer, make_certs, server_tls
from tests.conftest import require_etcd, wait_until
from tests.integration.conftest import reach_again, unique_prefix

pytestmark = pytest.mark.etcd
A1 = LeaseAttrs(IPv4Address("192.168.77.1"))
A2 = LeaseAttrs(IPv4Address("192.168.77.2"))
S1 = IPv4Network("10.5.84.0/24")


def test_config_missing_then_present(shared_etcd, make_registry):
    reg = make_registry(shared_etcd, config=None)
    with pytest.raises(ConfigNotFoundError) as err:
        reg.get_config()
    assert str(err.value) == CONFIG_NOT_FOUND
    reg.put_config('{"Network":"10.9.0.0/16"}')
    assert reg.get_config().network == IPv4Network("10.9.0.0/16")
    assert reg.config_key.endswith("/network/config")


def test_default_prefix():
    reg = Registry(["http://127.0.0.1:1"])
    try:
        assert reg.config_key == "/coreos.com/network/config"
        assert reg.lease_key(S1) == "/coreos.com/network/subnets/10.5.84.0-24"
    finally:
        reg.close()


def test_create_is_exact_and_if_absent(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    lease = reg.create_lease(S1, A1)
    assert lease is not None and lease.lease_id
    kvs, _ = reg.get(reg.lease_key(S1))
    assert kvs[0].value == b'{"PublicIP":"192.168.77.1","PublicIPv6":null}'
    assert kvs[0].lease == lease.lease_id
    assert 86390 <= reg.time_to_live(lease.lease_id) <= 86400       # flanneld's 24 h
    assert reg.create_lease(S1, A2) is None                        # taken: not overwritten
    assert reg.get(reg.lease_key(S1))[0][0].value == A1.to_json()


def test_renew_is_new_grant_and_guarded(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    first = reg.create_lease(S1, A1, ttl=60)
    renewed = reg.renew_lease(S1, A1, ttl=120)
    assert renewed is not None and renewed.lease_id != first.lease_id
    kv = reg.get(reg.lease_key(S1))[0][0]
    assert kv.lease == renewed.lease_id and kv.value == A1.to_json()
    assert reg.renew_lease(S1, A2, ttl=60) is None                  # held by another node: untouched
    assert reg.get(reg.lease_key(S1))[0][0].value == A1.to_json()
    assert reg.delete_lease(S1)
    assert reg.renew_lease(S1, A1, ttl=60) is not None              # absent: put again


def test_list_with_revision_skips_malformed(shared_etcd, make_registry, caplog):
    reg = make_registry(shared_etcd)
    reg.create_lease(S1, A1)
    reg.put(reg.subnets_prefix + "10.5.85.0-24", A2.to_json())       # lease-less, as an operator would
    reg.put(reg.subnets_prefix + "garbage-key", A2.to_json())
    reg.put(reg.subnets_prefix + "10.5.86.0-24", b"not json")
    reg.put(reg.subnets_prefix + "10.5.87.0-24", b'{"PublicIP":"10.0.0.9","BackendType":"vxlan",'
                                                  b'"BackendData":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"}}')
    with caplog.at_level(logging.WARNING):
        leases, rev = reg.list_leases(with_ttl=True)
    assert rev == reg.current_revision()
    assert sorted(str(l.subnet) for l in leases) == ["10.5.84.0/24", "10.5.85.0/24", "10.5.87.0/24"]
    assert "garbage-key" in caplog.text and "10.5.86.0-24" in caplog.text
    by = {str(l.subnet): l for l in leases}
    assert by["10.5.84.0/24"].expiration > time.time() + 86000
    assert by["10.5.85.0/24"].expiration is None and by["10.5.85.0/24"].reservation   # no TTL


def test_failover_to_next_endpoint(shared_etcd, make_registry):
    # The first endpoint is dead (nothing listens): every call fails over to the live one.
    reg = make_registry(["http://127.0.0.1:1", shared_etcd.client_url])
    assert reg.get_config().network == IPv4Network("10.5.0.0/16")
    assert reg.current_endpoint == shared_etcd.client_url


def test_all_endpoints_down_is_a_clear_error():
    reg = Registry(["http://127.0.0.1:1", "http://127.0.0.1:2"], timeout=1)
    try:
        with pytest.raises(RegistryError, match="failed on every endpoint"):
            reg.get_config()
    finally:
        reg.close()


def test_keepalive_never_faster_than_5s():
    opts = dict(etcd_transport._CHANNEL_OPTIONS)
    assert opts["grpc.keepalive_time_ms"] >= 5000
    assert opts["grpc.keepalive_permit_without_calls"] == 0


def _collect_watch(reg, start_revision, retry_interval=0.2):
    got: list = []
    relists: list = []

    def relist():
        rev = reg.current_revision()
        relists.append(rev)
        return rev

    loop = reg.watch_loop(reg.subnets_prefix, prefix=True, start_revision=start_revision,
                          on_events=lambda evs, rev: got.extend(evs), on_compacted=relist,
                          retry_interval=retry_interval)
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    return loop, t, got, relists


def test_watch_resumes_after_etcd_restart_without_loss(etcd, make_registry):
    reg = make_registry(etcd)
    start = reg.current_revision() + 1
    loop, t, got, _ = _collect_watch(reg, start)
    try:
        wait_until(loop.connected.is_set, what="watch connected")
        reg.txn_put_delete({reg.subnets_prefix + "10.5.1.0-24": A1.to_json(),
                            reg.subnets_prefix + "10.5.2.0-24": A2.to_json()})
        wait_until(lambda: len(got) == 2, what="both events of one txn")
        etcd.kill()
        etcd.start()
        reach_again(reg)
        reg.put(reg.subnets_prefix + "10.5.3.0-24", A1.to_json())
        reg.delete(reg.subnets_prefix + "10.5.1.0-24")
        wait_until(lambda: len(got) == 4, what="events after the restart")
        assert [(e.kind, e.key.rsplit("/", 1)[1]) for e in got] == [
            ("put", "10.5.1.0-24"), ("put", "10.5.2.0-24"), ("put", "10.5.3.0-24"), ("delete", "10.5.1.0-24")]
        assert loop.reconnects >= 1
        revs = [e.mod_revision for e in got]
        assert revs == sorted(revs)
    finally:
        loop.cancel()
        t.join(5)
    assert not t.is_alive()


def test_a_watch_is_read_on_its_own_thread_and_outlives_its_request(shared_etcd, make_registry):
    # One request, then etcd's responses, taken from the channel by the thread that runs the
    # watch: no thread of gRPC's hands each over, none holds our half of the stream open (etcd
    # watches on after it is closed). Each thread more cost a burst of 5,000 leases a handoff
    # an event (perf/README.md#watch-one-thread).
    reg = make_registry(shared_etcd)
    before = set(threading.enumerate())
    loop, t, got, _ = _collect_watch(reg, reg.current_revision() + 1)
    try:
        wait_until(loop.connected.is_set, what="watch connected")
        for i in range(20):
            reg.put(reg.subnets_prefix + f"10.5.{i}.0-24", A1.to_json())
        wait_until(lambda: len(got) == 20, what="the 20 puts' events")
        others = [th.name for th in threading.enumerate() if th not in before and th is not t]
        assert others == []
        time.sleep(1.5)                     # long after the request went and our half closed
        reg.put(reg.subnets_prefix + "10.5.99.0-24", A2.to_json())
        wait_until(lambda: len(got) == 21, what="an event after a pause")
        assert loop.reconnects == 0
    finally:
        loop.cancel()
        t.join(5)
    assert not t.is_alive()


def test_watch_from_compacted_revision_relists(etcd, make_registry):
    reg = make_registry(etcd)
    old = reg.current_revision()
    for i in range(3):
        reg.put(reg.subnets_prefix + f"10.5.{i + 1}.0-24", A1.to_json())
    reg.compact(reg.current_revision())
    loop, t, got, relists = _collect_watch(reg, old)
    try:
        wait_until(lambda: relists, what="re-list after compaction")
        wait_until(loop.connected.is_set, what="watch re-created after the re-list")
        reg.put(reg.subnets_prefix + "10.5.9.0-24", A1.to_json())
        wait_until(lambda: any(e.key.endswith("10.5.9.0-24") for e in got), what="event after re-list")
        assert loop.resyncs == 1
    finally:
        loop.cancel()
        t.join(5)


def test_auth_and_token_refresh():
    require_etcd()
    with EtcdServer(extra_args=("--auth-token", "simple", "--auth-token-ttl", "1")) as etcd:
        etcd.etcdctl("user", "add", "root:rootpw")
        etcd.etcdctl("auth", "enable")
        prefix = unique_prefix("auth")
        reg = Registry([etcd.client_url], prefix=prefix, username="root", password="rootpw")
        loop = t = None
        try:
            reg.put_config('{"Network":"10.5.0.0/16"}')
            assert reg.get_config().subnet_len == 24
            loop, t, got, _ = _collect_watch(reg, reg.current_revision() + 1)
            wait_until(loop.connected.is_set, what="authenticated watch")
            time.sleep(3.5)                               # the simple token expires after 1 s idle
            assert reg.create_lease(S1, A1) is not None    # re-authenticated transparently
            etcd.restart()                                # forgets every token: the watch must log in again
            reg.put(reg.lease_key(IPv4Network("10.5.85.0/24")), A2.to_json())
            wait_until(lambda: len(got) == 2, what="events through a re-authenticated watch")
        finally:
            if loop is not None:
                loop.cancel()
                t.join(5)
            reg.close()
        bad = Registry([etcd.client_url], prefix=prefix, username="root", password="wrong")
        try:
            with pytest.raises(RegistryError, match="INVALID_ARGUMENT|authentication failed"):
                bad.get_config()
        finally:
            bad.close()
        anon = Registry([etcd.client_url], prefix=prefix)
        try:
            with pytest.raises(RegistryError):
                anon.get_config()
        finally:
            anon.close()


def test_tls_with_client_certificates(tmp_path):
    require_etcd()
    d = str(tmp_path)
    certs = make_certs(d, clients=("client",))       # the CA and certificates, made with openssl
    tls = server_tls(certs, client="client")
    with EtcdServer(tls=tls) as etcd:
        assert etcd.client_url.startswith("https://")
        reg = Registry([etcd.client_url], prefix=unique_prefix("tls"), keyfile=f"{d}/client.key",
                       certfile=f"{d}/client.crt", cafile=f"{d}/ca.crt")
        try:
            reg.put_config('{"Network":"10.5.0.0/16"}')
            assert reg.create_lease(S1, A1) is not None
            assert len(reg.list_leases()[0]) == 1
        finally:
            reg.close()
        # flanneld's rule: a key and a cert mean TLS, even for an endpoint written as http://.
        plain = etcd.client_url.replace("https://", "http://")
        reg = Registry([plain], prefix=unique_prefix("tls"), keyfile=f"{d}/client.key",
                       certfile=f"{d}/client.crt", cafile=f"{d}/ca.crt")
        try:
            reg.put_config('{"Network":"10.5.0.0/16"}')
        finally:
            reg.close()
        nocert = Registry([etcd.client_url], prefix=unique_prefix("tls"), cafile=f"{d}/ca.crt", timeout=2)
        try:
            with pytest.raises(RegistryError):
                nocert.get_config()
        finally:
            nocert.close()


def test_closing_the_registry_ends_its_watches(shared_etcd, make_registry):
    reg = make_registry(shared_etcd)
    loop, t, _, _ = _collect_watch(reg, reg.current_revision() + 1, retry_interval=0.05)
    wait_until(loop.connected.is_set, what="watch connected")
    reg.close()
    t.join(5)
    assert not t.is_alive()
    with pytest.raises(RegistryError, match="closed"):
        reg.get_config()


# -- refusals and outages: what the log says, and how often ------------------------------------------

ROOT_PW, USER, USER_PW = "fu-root-pw", "flannel", "fu-flannel-pw"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """etcd as a careful cluster runs it: TLS with client certificates required, auth on, and a
    user whose role reads and writes one prefix only. Yields (etcd, certs, prefix)."""
    require_etcd()
    certs = make_certs(str(tmp_path_factory.mktemp("certs")), clients=("root", USER))
    allowed = unique_prefix("secured").rsplit("/", 1)[0]
    etcd = EtcdServer(tls=server_tls(certs))
    try:
        etcd.start()
        etcd.enable_auth(ROOT_PW, {USER: (USER_PW, allowed + "/")})
        yield etcd, certs, allowed + "/network"
    finally:
        etcd.close()


def _client(secured, prefix=None, **kw) -> Registry:
    """The user's client, with ``kw`` changing what it presents."""
    etcd, certs, allowed = secured
    args = dict(keyfile=certs[f"{USER}_key"], certfile=certs[f"{USER}_cert"], cafile=certs["ca"],
                username=USER, password=USER_PW, timeout=2)
    args.update(kw)
    return Registry([etcd.client_url], prefix=prefix or allowed, **args)


def _lines(caplog, level=logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "dataplane.control.registry" and r.levelno >= level]


REFUSALS = {
    # case: (client arguments, reason, what the message must say)
    "wrong password": (dict(password="wrong"), "auth",
                       ("authentication failed, invalid user ID or password", "--etcd-password")),
    "no client certificate": (dict(keyfile=None, certfile=None), "tls-client",
                              ("requires a client certificate", "--etcd-certfile")),
    "certificate of another CA": (dict(keyfile="rogue_key", certfile="rogue_cert"), "tls-client",
                                  ("refused our client certificate", "--etcd-certfile")),
    "etcd's certificate not trusted": (dict(cafile="other_ca"), "tls-server",
                                       ("is not trusted by --etcd-cafile", "--etcd-cafile")),
    "no permission on the prefix": (dict(prefix="/fu-not-granted/network"), "permission",
                                    ("permission denied", "grant-permission")),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refusal_names_the_side_and_the_flag_and_is_said_once(secured, case, caplog):
    etcd, certs, _ = secured
    kw, reason, words = REFUSALS[case]
    kw = {k: certs.get(v, v) if isinstance(v, str) else v for k, v in kw.items()}
    reg = _client(secured, **kw)
    try:
        with caplog.at_level(logging.DEBUG, logger="dataplane.control.registry"):
            for _ in range(5):                  # a caller retrying: the log says it once
                with pytest.raises(RegistryDeniedError) as err:
                    reg.get_config()
                assert err.value.reason == reason
                time.sleep(0.05)
    finally:
        reg.close()
    assert all(w in str(err.value) for w in words), err.value
    assert "TSI_DATA_CORRUPTED" not in str(err.value)
    errors = [r for r in caplog.records
              if r.name == "dataplane.control.registry" and r.levelno >= logging.WARNING]
    assert [r.levelno for r in errors] == [logging.ERROR], [r.getMessage() for r in errors]
    assert words[0] in errors[0].getMessage()


def test_tls_files_that_cannot_serve_are_named_at_start(secured, tmp_path):
    _, certs, _ = secured
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="--etcd-certfile .* and --etcd-keyfile"):
        _client(secured, certfile=str(garbage))
    with pytest.raises(ValueError, match="--etcd-certfile .* and --etcd-keyfile"):
        _client(secured, keyfile=certs["root_key"])         # another certificate's key
    with pytest.raises(ValueError, match="--etcd-cafile"):
        _client(secured, cafile=str(garbage))


def test_a_user_against_etcd_without_auth_works_without_a_token(shared_etcd, make_registry):
    # etcd's Go client (so flanneld) goes on without a token when auth is off; so do we
    # (docs/flannel-compat.md#process).
    reg = make_registry(shared_etcd, username="flannel", password="anything")
    assert reg.get_config().network == IPv4Network("10.5.0.0/16")
    assert reg.create_lease(S1, A1) is not None


def test_a_running_watch_says_a_refusal_once_and_resumes_once_fixed(secured, caplog):
    etcd, _, prefix = secured
    reg = _client(secured)
    reg.put_config('{"Network":"10.5.0.0/16"}')
    loop, t, got, _ = _collect_watch(reg, reg.current_revision() + 1, retry_interval=0.1)
    changed = False
    try:
        wait_until(loop.connected.is_set, what="watch connected")
        with caplog.at_level(logging.DEBUG, logger="dataplane.control.registry"):
            etcd.etcdctl("user", "passwd", USER, "--interactive=false", input="changed\n")
            changed = True
            etcd.restart()                      # the stream must log in again: refused now
            wait_until(lambda: any("authentication failed" in m for m in _lines(caplog)),
                       what="the refusal in the log")
            attempts = loop.reconnects
            wait_until(lambda: loop.reconnects >= attempts + 10, what="ten more refused attempts")
            etcd.etcdctl("user", "passwd", USER, "--interactive=false", input=USER_PW + "\n")
            changed = False
            wait_until(loop.connected.is_set, what="watch connected again")
        reg.put(reg.subnets_prefix + "10.5.1.0-24", A1.to_json())
        wait_until(lambda: got, what="an event after the refusal")
    finally:
        if changed:
            etcd.etcdctl("user", "passwd", USER, "--interactive=false", input=USER_PW + "\n")
        loop.cancel()
        t.join(5)
        reg.close()
    refused = [m for m in _lines(caplog, logging.ERROR) if "authentication failed" in m]
    assert len(refused) == 1, _lines(caplog)
    assert "--etcd-password" in refused[0]
    assert any("refuses this client: recovered after" in m for m in _lines(caplog))


def test_an_outage_is_said_once_reminded_and_said_over(etcd, make_registry, caplog, monkeypatch):
    reg = make_registry(["http://127.0.0.1:1", etcd.client_url])   # the first endpoint is dead
    monkeypatch.setattr(reg.unreachable, "remind_every", 1.0)
    loop, t, got, _ = _collect_watch(reg, reg.current_revision() + 1, retry_interval=0.05)
    try:
        wait_until(loop.connected.is_set, what="watch connected")
        caplog.clear()                          # the switch away from the dead one is said
        with caplog.at_level(logging.DEBUG, logger="dataplane.control.registry"):
            etcd.stop()
            calls = 0
            started = time.monotonic()
            while time.monotonic() - started < 3.5:    # a caller retrying too
                with pytest.raises(RegistryUnavailableError):
                    reg.get_config()
                calls += 1
                time.sleep(0.05)
            etcd.start()
            wait_until(loop.connected.is_set, what="watch connected again")
            outage = time.monotonic() - started
        reg.put(reg.subnets_prefix + "10.5.1.0-24", A1.to_json())
        wait_until(lambda: got, what="an event after the outage")
    finally:
        loop.cancel()
        t.join(5)
    said = _lines(caplog)
    first = [m for m in said if m.startswith("etcd unreachable:") and "still failing" not in m
             and "recovered" not in m]
    reminders = [m for m in said if "still failing after" in m]
    over = [m for m in said if "etcd unreachable: recovered after" in m]
    switches = [m for m in said if "switching to" in m]
    assert calls >= 20 and loop.reconnects >= 20      # retried all along: said, not flooded
    assert len(first) == 1 and "is etcd running and are --etcd-endpoints right?" in first[0], said
    assert 2 <= len(reminders) <= outage + 1, said    # one a second at this pace
    assert len(over) == 1, said
    assert len(switches) <= 2, said                   # once per endpoint, not per attempt
    assert len(said) <= 10, said
