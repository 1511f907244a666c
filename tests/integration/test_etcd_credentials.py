"""`flannel-udp run` against etcd secured as a careful cluster runs it: TLS with client certificates
required (the CA and the certificates made here with openssl), etcd's auth on, and a user whose role
reads and writes the network's prefix only.

::

      h0, h1: the daemons that forward        h2: daemons that must not start
           |                  |                     |
      -----+------- bridge, switch netns 192.168.77.254: etcd over https, auth on

A refusal no retry mends (a wrong password, a certificate refused either way) ends the daemon at
start with status 1, as flanneld, naming the flag to fix; no line of gRPC's C core reaches its output.
With the right credentials both engines run through expired tokens and an etcd restart; a role
revoked under a running daemon is an error in its log, said once, while it keeps forwarding.
"""
from __future__ import annotations

import re
import time

import pytest

from dataplane.testbed.etcd import EtcdServer, make_certs, server_tls
from tests.conftest import require_overlay, wait_until
from tests.integration.daemon_checks import log_mark

pytestmark = [pytest.mark.root, pytest.mark.etcd]

ROOT_PW, USER, USER_PW = "fu-root-pw", "flannel", "fu-flannel-pw"
TOKEN_TTL = 2            # s: etcd forgets an idle token this fast, so the tests meet expired ones
# A line of gRPC's C core (glog's format): "E1126 15:22:47.020004    5230 file.cc:115] ...".
GRPC_CORE_LINE = re.compile(r"^[EWID]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ", re.M)
FAKE_PEER = "10.5.250.0/24"


@pytest.fixture(scope="module")
def sov(tmp_path_factory):
    """An overlay whose etcd serves TLS, requires client certificates and has auth on."""
    require_overlay()
    from dataplane.testbed.overlay import Overlay
    ov = Overlay(hosts=0, put_config=False)
    try:
        certs = make_certs(str(tmp_path_factory.mktemp("certs")), server_ips=(ov.tb.switch_ip,),
                           clients=("root", USER))
        ov.etcd.close()             # the overlay's own etcd speaks plain http: this one instead
        ov.etcd = EtcdServer(host=ov.tb.switch_ip, netns=ov.tb.switch,
                             name=f"fu-etcd-{ov.tb.tag}", tls=server_tls(certs),
                             extra_args=("--auth-token", "simple",
                                         "--auth-token-ttl", str(TOKEN_TTL)))
        ov.etcd.start()
        ov.etcd.enable_auth(ROOT_PW, {USER: (USER_PW, ov.prefix + "/")})
        ov.put_config(ov.config)
        for _ in range(3):
            ov.add_host(start=False)
        ov.certs = certs
        yield ov
    finally:
        ov.close()


def credentials(ov, **change) -> tuple:
    """The daemon's etcd flags: the user's certificate and password, with ``change`` applied
    (None drops a flag)."""
    c = ov.certs
    flags = {"etcd-certfile": c[f"{USER}_cert"], "etcd-keyfile": c[f"{USER}_key"],
             "etcd-cafile": c["ca"], "etcd-username": USER, "etcd-password": USER_PW}
    flags.update(change)
    return tuple(a for k, v in flags.items() if v is not None for a in (f"--{k}", v))


def log_since(ov, host, mark: int) -> str:
    return ov.daemon(host).log_text()[mark:]


def lines(text: str, level: str, *words: str) -> list[str]:
    return [line for line in text.splitlines()
            if f" {level} " in line and all(w in line for w in words)]


# -- at startup ---------------------------------------------------------------------------------------

STARTUP_REFUSALS = {
    # case: (what changes in the flags, what the log must say)
    "wrong password": (dict(password="wrong"),
                       ("authentication failed, invalid user ID or password", "--etcd-password")),
    "no client certificate": (dict(cert=None, key=None),
                              ("requires a client certificate", "--etcd-certfile")),
    "a certificate etcd does not trust": (dict(cert="rogue_cert", key="rogue_key"),
                                          ("refused our client certificate", "--etcd-certfile")),
    "etcd's certificate not trusted": (dict(ca="other_ca"),
                                       ("is not trusted by --etcd-cafile", "--etcd-cafile")),
}


@pytest.mark.parametrize("case", list(STARTUP_REFUSALS))
def test_a_refusal_at_start_exits_1_naming_the_flag(sov, case, monkeypatch):
    # flanneld exits 1 at once on these (docs/flannel-compat.md#process).
    # The operator's environment, without the variables the test process got from the registry
    # it imported: the daemon itself must keep gRPC's C core quiet.
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    monkeypatch.delenv("GRPC_TRACE", raising=False)
    change, words = STARTUP_REFUSALS[case]
    flag = {"password": "etcd-password", "cert": "etcd-certfile", "key": "etcd-keyfile",
            "ca": "etcd-cafile"}
    args = credentials(sov, **{flag[k]: sov.certs.get(v, v) if v else v
                               for k, v in change.items()})
    h = sov.hosts[2]
    mark = log_mark(sov, h)
    try:
        sov.start_daemon(h, args=args, wait=False)
        assert sov.wait_exit(h, 20) == 1, log_since(sov, h, mark)[-3000:]
        log = log_since(sov, h, mark)
    finally:
        sov.stop_daemon(h)
    said = lines(log, "ERROR", *words)
    assert said, log[-3000:]
    assert len(lines(log, "ERROR", words[0])) <= 2, log[-3000:]     # the refusal, the exit
    assert "is etcd running" not in log                             # not an outage
    assert not GRPC_CORE_LINE.search(log), GRPC_CORE_LINE.findall(log)
    assert "TSI_DATA_CORRUPTED" not in log


# -- running ------------------------------------------------------------------------------------------

@pytest.fixture
def pair(sov, engine_kind):
    """h0 and h1 running ``engine_kind`` with the right credentials, forwarding to each other;
    ``log(host)`` is what their daemon logged."""
    a, b = sov.hosts[0], sov.hosts[1]
    sov.marks = {h.name: log_mark(sov, h) for h in (a, b)}
    try:
        for h in (a, b):
            sov.start_daemon(h, engine=engine_kind, args=credentials(sov), wait=False)
        for h in (a, b):
            sov.wait_ready(h)
        assert sov.reachable(a, sov.flannel_ip(b)) and sov.reachable(b, sov.flannel_ip(a))
        yield a, b, lambda h: log_since(sov, h, sov.marks[h.name])
    finally:
        for h in (a, b):
            sov.stop_daemon(h)


def test_tls_and_auth_run_through_expired_tokens_and_an_etcd_restart(sov, pair):
    a, b, log = pair
    time.sleep(TOKEN_TTL + 1)                  # every token the daemons hold has expired
    # Its lease deleted, a's daemon writes it again: unary calls that meet the expired token.
    subnet = sov.subnet(a)
    sov.delete_lease(subnet)
    wait_until(lambda: str(sov.leases().get(subnet)) == a.ip, timeout=15,
               what=lambda: f"{a.name}'s lease written again; etcd holds {sov.leases()}")
    sov.etcd.restart()                         # etcd forgets every token: the watches log in again
    try:
        sov.put(f"subnets/{FAKE_PEER.replace('/', '-')}", '{"PublicIP":"192.168.77.250"}')
        for h in (a, b):                       # a peer change reaches both through their watches
            wait_until(lambda h=h: f"Subnet added: {FAKE_PEER}" in log(h),
                       timeout=20, what=f"{h.name} to see the new peer after the restart")
    finally:
        sov.delete_lease(FAKE_PEER)
    assert sov.ping(a, sov.flannel_ip(b), count=3)["received"] == 3
    assert sov.ping(b, sov.flannel_ip(a), count=3)["received"] == 3
    for h in (a, b):
        assert not lines(log(h), "ERROR"), lines(log(h), "ERROR")
        assert "refuses this client" not in log(h) and "permission denied" not in log(h)


def test_a_role_revoked_while_running_is_an_error_said_once_and_forwarding_goes_on(sov, pair):
    a, b, log = pair
    revoked = False
    try:
        sov.etcdctl("user", "revoke-role", USER, USER)
        revoked = True
        # The streams that run keep running; etcd's restart makes every daemon ask again.
        sov.etcd.restart()
        for h in (a, b):
            wait_until(lambda h=h: lines(log(h), "ERROR", "permission denied"),
                       timeout=20, what=f"{h.name} to say its role lacks the permission")
        time.sleep(3)                          # retried every second meanwhile
        for h in (a, b):
            said = lines(log(h), "ERROR", "permission denied")
            assert all(f"etcd user '{USER}'" in s and "grant-permission" in s for s in said), said
            # once per watch (its peers, its config, its own lease), not once per retry
            assert len(said) <= 3, said
        assert sov.ping(a, sov.flannel_ip(b), count=3)["received"] == 3
        assert sov.ping(b, sov.flannel_ip(a), count=3)["received"] == 3
        sov.etcdctl("user", "grant-role", USER, USER)
        revoked = False
        for h in (a, b):
            wait_until(lambda h=h: "recovered after" in log(h), timeout=20,
                       what=f"{h.name} to say the refusal is over")
        for h in (a, b):
            assert sov.daemon(h).running()
    finally:
        if revoked:
            sov.etcdctl("user", "grant-role", USER, USER)
