"""flanneld's firewall rules on hosts shaped like real ones (root, namespaces, real etcd and TUN).

::

      wa 10.5.a.2 ── h0 (engine E) ══ overlay ══ h1 (engine E) ── wb 10.5.b.2
                      │ 192.168.77.1               │ 192.168.77.2
      ────────────────┴──────── bridge ────────────┴────────── inet 192.168.77.3
                                                               ("the internet": no route
                                                                back to 10.5.0.0/16)

The workloads (dataplane.demo.lab) sit behind their hosts, so their packets cross each host's
FORWARD chain and POSTROUTING as a container's would. Each host's own firewall (ufw-like
REJECT, Docker's chains, policy DROP) is put in place first and the daemon restarted, as on a
host that booted with it. One overlay per engine; the last test moves h1's lease.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from dataplane.demo import lab
from dataplane.host.firewall import REMOVAL_COMMANDS
from tests.conftest import ENGINES, wait_until
from tests.integration.conftest import overlay_of
from tests.integration.traffic import STREAM

pytestmark = [pytest.mark.root, pytest.mark.etcd]

NET = "10.5.0.0/16"
TOOLS = ("iptables", "nft")
ECHO_PORT = 7790

UFW_LIKE = """*filter
:FORWARD DROP [0:0]
-A FORWARD -j REJECT --reject-with icmp-port-unreachable
COMMIT
"""

DOCKER_LIKE = """*filter
:FORWARD DROP [0:0]
:DOCKER - [0:0]
:DOCKER-ISOLATION-STAGE-1 - [0:0]
:DOCKER-ISOLATION-STAGE-2 - [0:0]
:DOCKER-USER - [0:0]
-A FORWARD -j DOCKER-USER
-A FORWARD -j DOCKER-ISOLATION-STAGE-1
-A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A FORWARD -o docker0 -j DOCKER
-A FORWARD -i docker0 ! -o docker0 -j ACCEPT
-A FORWARD -i docker0 -o docker0 -j ACCEPT
-A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2
-A DOCKER-ISOLATION-STAGE-1 -j RETURN
-A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP
-A DOCKER-ISOLATION-STAGE-2 -j RETURN
-A DOCKER-USER -j RETURN
COMMIT
"""


class Site:
    """The overlay, its two workloads and the internet host of one engine's run."""

    def __init__(self, ov):
        self.ov = ov
        self.h0, self.h1 = ov.hosts[0], ov.hosts[1]
        self.inet = ov.tb.add_host("inet")        # a host with no daemon: the internet
        self.wa = lab.add_workload(ov, self.h0, "wa", ov.subnet_env(self.h0))
        self.wb = lab.add_workload(ov, self.h1, "wb", ov.subnet_env(self.h1))

    def nft_only_path(self) -> str:
        """A PATH where `iptables` is missing: the daemon falls back to nftables."""
        d = os.path.join(self.ov.tb.workdir, "nft-only-bin")
        if not os.path.isdir(d):
            os.makedirs(d)
            for tool in ("ip", "nft"):
                os.symlink(shutil.which(tool), os.path.join(d, tool))
        return d

    def close(self):
        for w in (getattr(self, "wa", None), getattr(self, "wb", None)):
            if w is not None:
                lab.remove_workload(w)

    def ipt(self, host, *args, check=True):
        return self.ov.exec(host, ["iptables", "-w", "5", *args], check=check)

    def save(self, host, table="filter") -> list[str]:
        return self.ov.exec(host, ["iptables-save", "-t", table], check=True).stdout.splitlines()

    def firewall(self, host, text: str) -> None:
        """The host's own rules, as it boots with them (ours go: the daemon re-adds them)."""
        self.reset_firewall(host)
        r = self.ov.exec(host, ["iptables-restore", "--noflush"], input=text)
        assert r.returncode == 0, r.stderr

    def reset_firewall(self, host) -> None:
        self.ipt(host, "-P", "FORWARD", "ACCEPT")
        self.ipt(host, "-F", "FORWARD")
        for chain in ("DOCKER", "DOCKER-ISOLATION-STAGE-1", "DOCKER-ISOLATION-STAGE-2",
                      "DOCKER-USER"):
            self.ipt(host, "-F", chain, check=False)
            self.ipt(host, "-X", chain, check=False)

    def workloads_reach_each_other(self) -> bool:
        """Both ways at once (a ping that gets no answer waits its -W out)."""
        pings = [subprocess.Popen(w.argv(["ping", "-n", "-q", "-c", "3", "-i", "0.2", "-W", "1",
                                          dst]), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
                 for w, dst in ((self.wa, self.wb.ip), (self.wb, self.wa.ip))]
        return all(p.wait(timeout=20) == 0 for p in pings)


@pytest.fixture(scope="module", params=ENGINES)
def site(request):
    engine = request.param
    for ov in overlay_of(engine, (engine, engine)):
        s = Site(ov)
        try:
            yield s
        finally:
            s.close()


def _restart_both(site, args=()):
    for h in (site.h0, site.h1):
        site.ov.restart_daemon(h, args=args)


def _first_forward_rule(site, host) -> str:
    return next(l for l in site.save(host) if l.startswith("-A FORWARD "))


def test_workloads_reach_each_other_through_a_hosts_own_forward_drop(site):
    """h0 boots with a ufw-like FORWARD (drop and reject), h1 with Docker's chains: one
    restart of both covers both kinds, since every packet between the workloads crosses both
    hosts' FORWARD chains. Each host's firewall is then shown to drop them without our rule."""
    for h, host_rules in ((site.h0, UFW_LIKE), (site.h1, DOCKER_LIKE)):
        site.firewall(h, host_rules)
    try:
        _restart_both(site)
        assert site.workloads_reach_each_other()
        for h in (site.h0, site.h1):
            assert _first_forward_rule(site, h) == \
                '-A FORWARD -m comment --comment "flanneld forward" -j FLANNEL-FWD'
        # without our rules each host's own firewall does drop them: the test can fail
        for h in (site.h1, site.h0):
            assert not _reach_without_our_jump(site, h), f"{h.name}'s firewall let them pass"
    finally:
        for h in (site.h0, site.h1):
            site.reset_firewall(h)
        _restart_both(site)


JUMP = ("-m", "comment", "--comment", "flanneld forward", "-j", "FLANNEL-FWD")


def _reach_without_our_jump(site, host) -> bool:
    """Whether the workloads reach each other while the host's FORWARD lacks our jump; put
    back after. The daemon's resync (5 s) puts it back too: a ping it overlapped is played
    again."""
    def jumps() -> bool:
        return any(l.startswith("-A FORWARD ") and "FLANNEL-FWD" in l for l in site.save(host))
    try:
        for _ in range(3):
            if jumps():
                site.ipt(host, "-D", "FORWARD", *JUMP)
            reached = site.workloads_reach_each_other()
            if not jumps():
                return reached
        raise AssertionError("the daemon put its jump back during every try")
    finally:
        if not jumps():
            site.ipt(host, "-I", "FORWARD", "1", *JUMP)


def _start(site, host, tool, args):
    """(Re)start the host's daemon on `tool`; the other tool's rules are removed first with
    the operator's commands (they stay after exit)."""
    ov = site.ov
    ov.stop_daemon(host)
    for cmd in REMOVAL_COMMANDS["nft" if tool == "iptables" else "iptables"]:
        ov.exec(host, shlex.split(cmd))              # absent already: fine
    d = ov.start_daemon(host, args=args, env=_env(site, tool))
    assert f"with {tool} (they stay after exit)" in d.log_text()
    return d


def _env(site, tool):
    return {"PATH": site.nft_only_path()} if tool == "nft" else None


def _ours(site, host, tool) -> list[str]:
    """Every rule of ours on the host, as the tool prints it."""
    if tool == "iptables":
        return [l for t in ("nat", "filter") for l in site.save(host, t)
                if l.startswith("-A ") and "FLANNEL" in l]
    text = site.ov.exec(host, ["nft", "list", "ruleset"], check=True).stdout
    return [l.strip() for l in text.splitlines()
            if "flanneld" in l or l.startswith("table ip flannel-ipv4")]


@pytest.mark.parametrize("tool", TOOLS)
def test_egress_stays_masqueraded_across_a_daemon_restart(site, tool, figure):
    ov, h0 = site.ov, site.h0
    _start(site, h0, tool, ("--ip-masq",))
    tag = f"{ov.kind}-{tool}"
    echo_out = os.path.join(ov.tb.workdir, f"echo-{tag}.log")
    with open(echo_out, "w") as out:
        echo = ov.tb.popen(site.inet, [sys.executable, "-c", lab.UDP_ECHO, str(ECHO_PORT), "60"],
                           stdout=out, stderr=subprocess.STDOUT)
    stop_file = os.path.join(ov.tb.workdir, f"stop-{tag}")
    stream_out = os.path.join(ov.tb.workdir, f"stream-{tag}.log")
    try:
        time.sleep(0.5)
        site.wa.popen([sys.executable, "-c", STREAM, site.inet.ip, str(ECHO_PORT), "0.02",
                       stop_file, "3000", "45"], stream_out)
        time.sleep(1.0)
        down = time.time()
        assert ov.stop_daemon(h0) == 0
        kept = any("masquerade" in l.lower() for l in _ours(site, h0, tool))
        time.sleep(0.5)
        ov.start_daemon(h0, args=("--ip-masq",), env=_env(site, tool))
        up = time.time()
        time.sleep(1.0)
    finally:
        open(stop_file, "w").close()
        lab.stop_procs(site.wa)
        ov.tb.kill(echo)
    lines = [json.loads(l) for l in open(stream_out) if l.startswith("{")]
    window = [l for l in lines if down <= l["at"] <= up]
    lost = [l["seq"] for l in lines if not l["ok"]]
    figure(f"{tag}: restart window {up - down:.2f} s, datagrams in it / lost",
           f"{len(window)} / {len(lost)} (of {len(lines)} sent)")
    assert len(window) >= 10, "the stream did not cover the restart"
    assert lost == [], f"lost at the NAT: {lost[:20]}"
    assert kept, "the masquerade rules went with the daemon"
    peers = {l.split()[1] for l in open(echo_out) if l.startswith("echo ")}
    assert peers == {h0.ip}, f"not masqueraded: the internet saw {peers}"


@pytest.mark.parametrize("tool", TOOLS)
def test_no_duplicate_rules_after_sigkill_and_restart(site, tool):
    ov, h0 = site.ov, site.h0
    args = ("--ip-masq",)
    _start(site, h0, tool, args)
    before = _ours(site, h0, tool)
    # iptables: two jumps, six masq, two forward; nft: the table, six masq, two forward
    assert len(before) == (1 + 6 + 1 + 2 if tool == "iptables" else 1 + 6 + 2), before
    # a kill that leaves no chance to clean up, then a stop that would: each restart finds the
    # rules as they were, and the second SIGKILL of old would start from the set the first
    # already restarted from
    for sig in (signal.SIGKILL, signal.SIGTERM):
        ov.stop_daemon(h0, sig=sig)
        assert _ours(site, h0, tool) == before           # left as they were
        ov.start_daemon(h0, args=args, env=_env(site, tool))
        after = _ours(site, h0, tool)
        assert sorted(after) == sorted(before) and len(set(after)) == len(after), after


def test_enable_nftables_moves_an_iptables_host_to_flanneld_s_table(site):
    """"EnableNFTables": true in the network config on a host that ran in iptables mode
    (docs/flannel-compat.md#iptables): the rules go to nftables although iptables is there, the
    iptables masquerade goes so that nothing NATs twice, FLANNEL-FWD stays first in FORWARD, and
    the workload's egress is masqueraded by the nftables table alone."""
    ov, h0 = site.ov, site.h0
    _start(site, h0, "iptables", ("--ip-masq",))
    assert any(l.startswith("-A FLANNEL-POSTRTG ") for l in site.save(h0, "nat"))
    ov.put_config({**ov.config, "EnableNFTables": True})
    echo_out = os.path.join(ov.tb.workdir, f"echo-nft-config-{ov.kind}.log")
    echo = None
    try:
        ov.stop_daemon(h0)
        log = ov.start_daemon(h0, args=("--ip-masq",)).log_text()
        assert "EnableNFTables is true in the network config: nftables rules in table ip " \
               "flannel-ipv4" in log
        assert "with nft (they stay after exit)" in log
        nat = "\n".join(site.save(h0, "nat"))
        assert "FLANNEL-POSTRTG" not in nat and "flanneld masq" not in nat, nat
        assert _first_forward_rule(site, h0) == \
            '-A FORWARD -m comment --comment "flanneld forward" -j FLANNEL-FWD'
        table = ov.exec(h0, ["nft", "list", "table", "ip", "flannel-ipv4"], check=True).stdout
        assert "chain postrtg {" in table and "chain forward {" in table, table
        with open(echo_out, "w") as out:
            echo = ov.tb.popen(site.inet, [sys.executable, "-c", lab.UDP_ECHO, str(ECHO_PORT),
                                           "20"], stdout=out, stderr=subprocess.STDOUT)
        assert lab.wait_file_line(echo_out, "ready", proc=echo), "the echo server did not start"
        r = site.wa.run([sys.executable, "-c", lab.UDP_CLIENT, site.inet.ip, str(ECHO_PORT),
                         "nft"])
        # the internet has no route back to the overlay: a reply means it was masqueraded
        assert json.loads(r.stdout)["received"] == 3, r.stdout + r.stderr
        peers = {l.split()[1] for l in open(echo_out) if l.startswith("echo ")}
        assert peers == {h0.ip}, peers
        assert site.workloads_reach_each_other()
    finally:
        if echo is not None:
            ov.tb.kill(echo)
        ov.put_config(ov.config)


def test_previous_networks_rules_are_recycled_and_others_kept(site):
    """subnet.env says the host ran another network before, and older flannels' masquerade
    rules for it sit directly in POSTROUTING: they go, a container runtime's own rule stays."""
    ov, h0 = site.ov, site.h0
    subnet_file = _start(site, h0, "iptables", ("--ip-masq",)).subnet_file
    ov.stop_daemon(h0)
    old_net = "10.4.0.0/16"
    stale = [f"-A POSTROUTING -s {old_net} -d {old_net} -m comment --comment \"flanneld masq\" "
             "-j RETURN",
             f"-A POSTROUTING -s {old_net} ! -d 224.0.0.0/4 -m comment --comment \"flanneld masq\" "
             "-j MASQUERADE"]
    docker = "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE"
    r = ov.exec(h0, ["iptables-restore", "--noflush"],
                input="*nat\n" + "\n".join(stale + [docker]) + "\nCOMMIT\n")
    assert r.returncode == 0, r.stderr
    with open(subnet_file, "w") as f:
        f.write(f"FLANNEL_NETWORK={old_net}\nFLANNEL_SUBNET=10.4.7.1/24\nFLANNEL_MTU=1472\n"
                "FLANNEL_IPMASQ=true\n")
    d = ov.start_daemon(h0, args=("--ip-masq",))
    nat = [l for l in site.save(h0, "nat") if l.startswith("-A POSTROUTING")]
    assert nat[0] == '-A POSTROUTING -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG'
    assert docker in nat and not [l for l in nat if old_net in l], nat
    assert "recycling the old rules" in d.log_text()
    assert site.workloads_reach_each_other()


def _delete_nft_rule(site, host, chain, match) -> None:
    text = site.ov.exec(host, ["nft", "-a", "list", "chain", "ip", "flannel-ipv4", chain],
                        check=True).stdout
    handle = next(l.rsplit("# handle ", 1)[1] for l in text.splitlines() if match in l)
    site.ov.exec(host, ["nft", "delete", "rule", "ip", "flannel-ipv4", chain, "handle", handle],
                 check=True)


@pytest.mark.parametrize("tool", TOOLS)
def test_resync_repairs_a_deleted_rule_after_the_lease_moved(site, tool, figure):
    ov, h1 = site.ov, site.h1
    _start(site, h1, tool, ("--ip-masq", "--iptables-resync=1"))
    old = ov.subnet(h1)
    # Another host takes our subnet: the daemon loses its lease and must move.
    ov.put(f"subnets/{old.network_address}-{old.prefixlen}", '{"PublicIP":"192.168.77.200"}')
    try:
        new = wait_until(lambda: ov.subnet(h1) != old and ov.subnet(h1), 20, 0.2,
                         "the lease to move")
        own = (lambda: [l for l in _ours(site, h1, tool) if f" {new}" in l])
        assert wait_until(own, 5, 0.2, "the masquerade rules rebuilt for the new subnet")
        assert not any(f" {old}" in l for l in _ours(site, h1, tool))
        if tool == "iptables":
            cases = [(lambda: site.ipt(h1, "-D", "FLANNEL-FWD", "-s", NET, "-m", "comment",
                                       "--comment", "flanneld forward", "-j", "ACCEPT"),
                      f"-A FLANNEL-FWD -s {NET} "),
                     (lambda: site.ipt(h1, "-t", "nat", "-D", "POSTROUTING", "-m", "comment",
                                       "--comment", "flanneld masq", "-j", "FLANNEL-POSTRTG"),
                      "-A POSTROUTING -m comment")]
        else:
            cases = [(lambda: _delete_nft_rule(site, h1, "forward", f"ip saddr {NET} accept"),
                      f"ip saddr {NET} accept"),
                     (lambda: _delete_nft_rule(site, h1, "postrtg",
                                               f"ip saddr != {NET} ip daddr {new} return"),
                      f"ip saddr != {NET} ip daddr {new} return")]
        for delete, back in cases:
            delete()
            present = (lambda: any(back in l for l in _ours(site, h1, tool)))
            assert not present()
            t0 = time.monotonic()
            wait_until(present, 1 + 3, 0.1, f"the resync to put back {back!r}")
            figure(f"{ov.kind}-{tool}: {back.strip()!r} back after (s, resync 1 s)",
                   round(time.monotonic() - t0, 2))
        assert ov.daemon(h1).running()
    finally:
        ov.etcdctl("del", f"{ov.prefix}/subnets/{old.network_address}-{old.prefixlen}")

