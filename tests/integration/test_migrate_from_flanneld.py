"""Moving a host from flanneld to flannel-udp, and back (root, namespaces, real etcd and TUN).

::

      wf 10.5.200.2 ── hf (flanneld's leftovers, then flannel-udp) ══ overlay ══ hp (flannel-udp) ── wp
                        192.168.77.x                                            192.168.77.y

flanneld cannot be installed here, so what flanneld v0.20.2 leaves on a host after SIGTERM is
staged on hf, from its behaviour as docs/flannel-compat.md describes it:

* its lease: the key of its subnet holding flanneld's value, attached to a 24 h etcd lease;
  nothing is deleted at exit (#lease-value, #lease-ttl);
* its subnet.env, the four lines of #subnet-env;
* its rules, kept at exit (#iptables): the chains FLANNEL-POSTRTG (nat) and FLANNEL-FWD (filter),
  made by the commands flanneld runs, so their jumps are first in POSTROUTING and FORWARD;
* no flannel0 and no UDP socket: they went with the process.

hf has a firewall of its own from before flanneld started (FORWARD policy DROP and a trailing
REJECT, a container runtime's MASQUERADE), so the workloads' traffic needs FLANNEL-FWD, and
whoever leaves rules behind must leave those of the host alone. The peer hp runs flannel-udp,
which speaks flanneld's wire format: it stands for the rest of the overlay.

The move: flannel-udp starts with flanneld's flags on hf. It must take the same subnet (the lease
is found by its PublicIP), leave the ruleset as flanneld left it (no duplicate jump, no second
copy of a rule, nothing stale: compared line by line with iptables-save) but for the rules of
FLANNEL-POSTRTG, which follow flanneld v0.28.9's order in the same place (#iptables), and carry
the workload's traffic again within a second of being ready. A paced stream of UDP echoes from wf
to wp (one every 20 ms, bounded in count and time) measures when it comes back.

The way back is checked against these facts of flanneld's start:

* flanneld reuses the lease whose PublicIP is this host's address, whatever else the value holds,
  renewing it with a new 24 h grant (#lease-acquisition): flannel-udp leaves the key with
  flanneld's udp value byte for byte and a 24 h etcd lease;
* flanneld reads subnet.env back for the previous subnet and network (used for the lease and to
  recycle old rules): the file is byte for byte the one flanneld itself wrote;
* flanneld creates or flushes FLANNEL-POSTRTG and FLANNEL-FWD and fills them, its jumps and rules
  carrying the comments "flanneld masq" / "flanneld forward": the ruleset flannel-udp leaves is
  line for line the one flanneld itself leaves (FLANNEL-POSTRTG with v0.28.9's rules, which
  v0.20.2 flushes and refills), so flanneld's start meets what its own restart would meet;
* flannel0 and the UDP port are free for flanneld to take.
"""
from __future__ import annotations

import base64
import difflib
import json
import os
import re
import shlex
import sys
import time

import pytest

from dataplane.demo import lab
from tests.conftest import wait_until
from tests.integration.conftest import overlay_of
from tests.integration.traffic import STREAM

pytestmark = [pytest.mark.root, pytest.mark.etcd]

NET = "10.5.0.0/16"
SUBNET = "10.5.200.0/24"              # flanneld's lease: never one a fresh host picks (10.5.1-100)
TTL = 86400                           # flanneld's 24 h etcd lease
UDP_PORT = 8285
ECHO_PORT = 7791
FLANNELD_ARGS = ("-ip-masq",)         # the unit's command line, kept for flannel-udp
SUBNET_ENV = ("FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.200.1/24\nFLANNEL_MTU=1472\n"
              "FLANNEL_IPMASQ=true\n")
# flanneld v0.20.2's udp backend writes exactly the first; other versions add backend fields
LEASE_VALUES = {
    "v0.20.2-udp": '{{"PublicIP":"{ip}","PublicIPv6":null}}',
    "backend-fields": '{{"PublicIP":"{ip}","PublicIPv6":null,"BackendType":"udp","BackendData":null}}',
}
OWN_VALUE = '{{"PublicIP":"{ip}","PublicIPv6":null}}'

# The host's own firewall, there since boot (a firewalld/ufw-like FORWARD, Docker's NAT).
HOST_FIREWALL = """*nat
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
COMMIT
*filter
:FORWARD DROP [0:0]
-A FORWARD -j REJECT --reject-with icmp-port-unreachable
COMMIT
"""
# What flanneld v0.20.2 with --ip-masq ran for network NET and lease SUBNET, in its order.
_M = '-m comment --comment "flanneld masq"'
_F = '-m comment --comment "flanneld forward"'
FLANNELD_RULES = [
    "-t nat -N FLANNEL-POSTRTG",
    f"-t nat -A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 {_M} -j RETURN",
    f"-t nat -A FLANNEL-POSTRTG -s {NET} -d {NET} {_M} -j RETURN",
    f"-t nat -A FLANNEL-POSTRTG -s {NET} ! -d 224.0.0.0/4 {_M} -j MASQUERADE --random-fully",
    f"-t nat -A FLANNEL-POSTRTG ! -s {NET} -d {SUBNET} {_M} -j RETURN",
    f"-t nat -A FLANNEL-POSTRTG ! -s {NET} -d {NET} {_M} -j MASQUERADE --random-fully",
    f"-t nat -I POSTROUTING 1 {_M} -j FLANNEL-POSTRTG",
    "-t filter -N FLANNEL-FWD",
    f"-t filter -A FLANNEL-FWD -s {NET} {_F} -j ACCEPT",
    f"-t filter -A FLANNEL-FWD -d {NET} {_F} -j ACCEPT",
    f"-t filter -I FORWARD 1 {_F} -j FLANNEL-FWD",
]


# FLANNEL-POSTRTG as flannel-udp fills it: flanneld v0.28.9's order, as iptables-save prints it
V028_POSTRTG = [
    f"-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 {_M} -j RETURN",
    f"-A FLANNEL-POSTRTG -s {SUBNET} -d {NET} {_M} -j RETURN",
    f"-A FLANNEL-POSTRTG -s {NET} -d {SUBNET} {_M} -j RETURN",
    f"-A FLANNEL-POSTRTG ! -s {NET} -d {SUBNET} {_M} -j RETURN",
    f"-A FLANNEL-POSTRTG -s {NET} ! -d 224.0.0.0/4 {_M} -j MASQUERADE --random-fully",
    f"-A FLANNEL-POSTRTG ! -s {NET} -d {NET} {_M} -j MASQUERADE --random-fully",
]


def _with_v028_masquerade(lines: list[str]) -> list[str]:
    """`lines` (iptables-save) with FLANNEL-POSTRTG's rules replaced, where they stood, by
    flanneld v0.28.9's."""
    ours = [i for i, l in enumerate(lines) if l.startswith("-A FLANNEL-POSTRTG ")]
    assert ours == list(range(ours[0], ours[-1] + 1)), lines
    return lines[:ours[0]] + V028_POSTRTG + lines[ours[-1] + 1:]


class Move:
    """One engine's overlay: the peer hp with its workload, and hf, a host that ran flanneld."""

    def __init__(self, ov):
        self.ov = ov
        self.hp = ov.hosts[0]
        self.hf = ov.add_host(start=False)
        self.wp = lab.add_workload(ov, self.hp, "wp", ov.subnet_env(self.hp))
        self.wf = None

    def close(self):
        for w in (self.wf, self.wp):
            if w is not None:
                lab.remove_workload(w)

    @property
    def key(self) -> str:
        net, plen = SUBNET.split("/")
        return f"{self.ov.prefix}/subnets/{net}-{plen}"

    def stage_flanneld(self, value: str) -> None:
        """What flanneld leaves on hf after SIGTERM, with the workload Docker started from its
        subnet.env."""
        ov, hf = self.ov, self.hf
        lease_id = ov.etcdctl("lease", "grant", str(TTL)).stdout.split()[1]
        ov.etcdctl("put", f"--lease={lease_id}", self.key, input=value.encode())
        with open(ov.subnet_file(hf), "w") as f:
            f.write(SUBNET_ENV)
        r = ov.exec(hf, ["iptables-restore", "--noflush"], input=HOST_FIREWALL)
        assert r.returncode == 0, r.stderr
        for rule in FLANNELD_RULES:
            ov.exec(hf, ["iptables", "-w", "5", *shlex.split(rule)], check=True)
        self.wf = lab.add_workload(ov, hf, "wf", ov.subnet_env(hf))

    def ruleset(self) -> list[str]:
        """hf's nat and filter tables as iptables-save prints them, counters zeroed."""
        out = []
        for table in ("nat", "filter"):
            text = self.ov.exec(self.hf, ["iptables-save", "-t", table], check=True).stdout
            out += [re.sub(r"\[\d+:\d+\]$", "[0:0]", l) for l in text.splitlines()
                    if not l.startswith("#")]
        return out

    def etcd_kv(self) -> tuple[str, int]:
        """(value, remaining TTL in s) of flanneld's key; TTL -1 when no etcd lease holds it."""
        ov = self.ov
        kv = json.loads(ov.etcdctl("get", self.key, "-w", "json").stdout)["kvs"][0]
        value = base64.b64decode(kv["value"]).decode()
        if not kv.get("lease"):
            return value, -1
        ttl = ov.etcdctl("lease", "timetolive", format(int(kv["lease"]), "x")).stdout
        return value, int(re.search(r"remaining\((-?\d+)s\)", ttl).group(1))


@pytest.fixture
def move(engine_kind):
    for ov in overlay_of(engine_kind, (engine_kind,)):
        m = Move(ov)
        try:
            yield m
        finally:
            m.close()


def _stream(move, tag: str, start_daemon) -> tuple[list, float, float]:
    """Workload traffic wf -> wp (echoed) across `start_daemon()`: (the stream's lines, the wall
    time the daemon was started, the wall time it was ready)."""
    wdir = move.ov.tb.workdir
    echo_out = os.path.join(wdir, f"echo-{tag}.log")
    stream_out = os.path.join(wdir, f"stream-{tag}.log")
    stop_file = os.path.join(wdir, f"stop-{tag}")
    echo = move.wp.popen([sys.executable, "-c", lab.UDP_ECHO, str(ECHO_PORT), "40"], echo_out)
    try:
        assert lab.wait_file_line(echo_out, "ready", proc=echo), "the echo server did not start"
        move.wf.popen([sys.executable, "-c", STREAM, move.wp.ip, str(ECHO_PORT), "0.02",
                       stop_file, "1500", "30"], stream_out)
        time.sleep(0.5)                      # the outage as it was: flanneld gone, nothing else
        t0 = time.time()
        d = start_daemon()
        ready = t0 + (d.ready_at - d.started)
        wait_until(lambda: any(l["ok"] for l in lab.json_lines(stream_out)), 10, 0.05,
                   "the workload's traffic to come back")
        time.sleep(1.0)                      # and stay back
    finally:
        open(stop_file, "w").close()
        lab.stop_procs(move.wf)
        lab.stop_procs(move.wp)
    return lab.json_lines(stream_out), t0, ready


def _same_rules(now: list[str], staged: list[str]) -> None:
    assert now == staged, "\n".join(difflib.unified_diff(staged, now, "flanneld left", "now",
                                                         lineterm=""))


@pytest.mark.parametrize("shape", sorted(LEASE_VALUES))
def test_host_moves_from_flanneld_and_back(move, shape, figure):
    ov, hf = move.ov, move.hf
    value = LEASE_VALUES[shape].format(ip=hf.ip)
    move.stage_flanneld(value)
    staged = move.ruleset()
    assert sum("flanneld" in l for l in staged) == 2 + 5 + 2, staged

    lines, t0, ready = _stream(move, f"{ov.kind}-{shape}",
                               lambda: ov.start_daemon(hf, args=FLANNELD_ARGS))
    d = ov.daemon(hf)
    # the same subnet, found by PublicIP, the key rewritten with our (= flanneld's udp) value
    assert ov.subnet(hf).with_prefixlen == SUBNET
    assert "for current IP" in d.log_text()
    assert {str(s): ip for s, ip in ov.leases().items() if ip == hf.ip} == {SUBNET: hf.ip}
    kv_value, ttl = move.etcd_kv()
    assert kv_value == OWN_VALUE.format(ip=hf.ip) and TTL - 120 <= ttl <= TTL
    # flanneld's rules recycled in place: not one line more, less or moved, FLANNEL-POSTRTG
    # filled in v0.28.9's order
    expected = _with_v028_masquerade(staged)
    _same_rules(move.ruleset(), expected)
    # traffic: nothing before the daemon, back within a second of ready, nothing lost after
    before = [l for l in lines if l["at"] < t0]
    assert before and not any(l["ok"] for l in before), "workloads talked without a daemon"
    back = next(l for l in lines if l["ok"])
    lost_after = [l["seq"] for l in lines if l["seq"] > back["seq"] and not l["ok"]]
    figure(f"{ov.kind}/{shape}: workload traffic back after start / after READY (s)",
           f"{back['at'] - t0:.2f} / {back['at'] - ready:.2f} (READY after "
           f"{ready - t0:.2f} s; 20 ms probes)")
    # measured from READY, not from the start: how long a loaded machine takes to start Python
    # is not the daemon's to promise, forwarding once it says it is ready is
    assert back["at"] - ready <= 1.0, f"traffic back {back['at'] - ready:.2f} s after READY"
    assert lost_after == [], f"lost after traffic came back: {lost_after[:20]}"

    # the way back: what flannel-udp leaves is what flanneld itself left
    assert ov.stop_daemon(hf) == 0
    _same_rules(move.ruleset(), expected)
    with open(ov.subnet_file(hf)) as f:
        assert f.read() == SUBNET_ENV
    kv_value, ttl = move.etcd_kv()
    assert json.loads(kv_value)["PublicIP"] == hf.ip
    assert kv_value == LEASE_VALUES["v0.20.2-udp"].format(ip=hf.ip) and ttl > TTL - 120
    assert ov.exec(hf, ["ip", "link", "show", "flannel0"]).returncode != 0
    assert ov.exec(hf, ["ss", "-Hlun", f"sport = :{UDP_PORT}"], check=True).stdout.strip() == ""
    tables = ov.exec(hf, ["nft", "list", "tables"]).stdout
    assert "flannel-udp" not in tables and "flannel-ipv4" not in tables, tables
