"""flanneld v0.28.9's firewall rules as the kernel holds them (root, one network namespace each).

dataplane.host.firewall runs inside a namespace made for the test (a child Python process
under ``ip netns exec``), and what it left is read back with ``iptables-save`` and ``nft list``,
so each check is on the kernel's rule set, not on the text we sent. What flanneld would have
left (its appended jumps, its nftables table, older flannel-udp's table) is staged with the
same commands first. The facts pinned are those of docs/flannel-compat.md#iptables: the rule
order, --ip-masq-fully-random-disable, EnableNFTables and the move between the two tools, the
table and chain names flanneld shares with us, and `flannel-udp cleanup`'s removal. With
EnableIPv6 the same for IPv6Network (ip6tables, ``ip6 flannel-ipv6``), and one pod's IPv6
datagrams through a host with them: masqueraded out of IPv6Network, not inside it.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from dataplane.testbed import netns
from tests.conftest import require, require_root

pytestmark = pytest.mark.root

NET, SUB = "10.5.0.0/16", "10.5.3.0/24"
NET6, SUB6 = "fc00:5::/56", "fc00:5:0:3::/64"
M = '-m comment --comment "flanneld masq"'
F = '-m comment --comment "flanneld forward"'
MASQ_JUMP = f"{M} -j FLANNEL-POSTRTG"
FWD_JUMP = f"{F} -j FLANNEL-FWD"


def v028_postrtg(random_fully=True) -> list[str]:
    """FLANNEL-POSTRTG as flanneld v0.28.9 fills it, as iptables-save prints it."""
    rf = " --random-fully" if random_fully else ""
    return [f"-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 {M} -j RETURN",
            f"-A FLANNEL-POSTRTG -s {SUB} -d {NET} {M} -j RETURN",
            f"-A FLANNEL-POSTRTG -s {NET} -d {SUB} {M} -j RETURN",
            f"-A FLANNEL-POSTRTG ! -s {NET} -d {SUB} {M} -j RETURN",
            f"-A FLANNEL-POSTRTG -s {NET} ! -d 224.0.0.0/4 {M} -j MASQUERADE{rf}",
            f"-A FLANNEL-POSTRTG ! -s {NET} -d {NET} {M} -j MASQUERADE{rf}"]


def v028_postrtg_nft(random_fully=True) -> list[str]:
    """The same rules as `nft list` prints them back."""
    rf = " fully-random" if random_fully else ""
    return ['meta mark & 0x00004000 == 0x00004000 return comment "flanneld masq"',
            f'ip saddr {SUB} ip daddr {NET} return comment "flanneld masq"',
            f'ip saddr {NET} ip daddr {SUB} return comment "flanneld masq"',
            f'ip saddr != {NET} ip daddr {SUB} return comment "flanneld masq"',
            f'ip saddr {NET} ip daddr != 224.0.0.0/4 masquerade{rf} comment "flanneld masq"',
            f'ip saddr != {NET} ip daddr {NET} masquerade{rf} comment "flanneld masq"']


FWD_NFT = [f'ip saddr {NET} accept comment "flanneld forward"',
           f'ip daddr {NET} accept comment "flanneld forward"']


def v028_postrtg6() -> list[str]:
    """FLANNEL-POSTRTG for IPv6Network as flanneld v0.28.9 fills it, as ip6tables-save prints it."""
    return [f"-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 {M} -j RETURN",
            f"-A FLANNEL-POSTRTG -s {SUB6} -d {NET6} {M} -j RETURN",
            f"-A FLANNEL-POSTRTG -s {NET6} -d {SUB6} {M} -j RETURN",
            f"-A FLANNEL-POSTRTG ! -s {NET6} -d {SUB6} {M} -j RETURN",
            f"-A FLANNEL-POSTRTG -s {NET6} ! -d ff00::/8 {M} -j MASQUERADE --random-fully",
            f"-A FLANNEL-POSTRTG ! -s {NET6} -d {NET6} {M} -j MASQUERADE --random-fully"]


FWD6 = [f"-A FLANNEL-FWD -s {NET6} {F} -j ACCEPT", f"-A FLANNEL-FWD -d {NET6} {F} -j ACCEPT"]
POSTRTG6_NFT = ['meta mark & 0x00004000 == 0x00004000 return comment "flanneld masq"',
                f'ip6 saddr {SUB6} ip6 daddr {NET6} return comment "flanneld masq"',
                f'ip6 saddr {NET6} ip6 daddr {SUB6} return comment "flanneld masq"',
                f'ip6 saddr != {NET6} ip6 daddr {SUB6} return comment "flanneld masq"',
                f'ip6 saddr {NET6} ip6 daddr != ff00::/8 masquerade fully-random comment '
                '"flanneld masq"',
                f'ip6 saddr != {NET6} ip6 daddr {NET6} masquerade fully-random comment '
                '"flanneld masq"']
FWD6_NFT = [f'ip6 saddr {NET6} accept comment "flanneld forward"',
            f'ip6 daddr {NET6} accept comment "flanneld forward"']

# The table older flannel-udp versions made (iptables missing), in their layout.
LEGACY_TABLE = f"""table ip flannel-udp {{
  chain FLANNEL_POSTRTG {{
    type nat hook postrouting priority srcnat - 1; policy accept;
    ip saddr {NET} ip daddr {NET} return comment "flanneld masq"
    ip saddr {NET} ip daddr != 224.0.0.0/4 masquerade fully-random comment "flanneld masq"
  }}
  chain FLANNEL_FWD {{
    type filter hook forward priority filter - 1; policy accept;
    ip saddr {NET} accept comment "flanneld forward"
  }}
}}
"""
# What a flanneld v0.28.9 in nftables mode leaves while it runs: its two tables.
FLANNELD_TABLES = f"""table ip flannel-ipv4 {{
  chain postrtg {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {NET} ip daddr != 224.0.0.0/4 masquerade fully-random
  }}
}}
table ip6 flannel-ipv6 {{}}
"""


class Ns:
    """A namespace of the suite's naming (fu-<pid>-<seq>-fw), deleted at teardown."""

    def __init__(self, role="fw", disable_ipv6=True):
        self.name = netns.ns_name(netns.new_run_id(), role)
        netns.create(self.name, disable_ipv6=disable_ipv6)

    def run(self, argv, input=None, check=True) -> subprocess.CompletedProcess:
        r = subprocess.run(netns.exec_argv(self.name, argv), input=input, capture_output=True,
                           text=True, timeout=60)
        assert not check or r.returncode == 0, f"{argv}: {r.stderr}"
        return r

    def firewall(self, code: str) -> tuple[object, str]:
        """Run `code` with dataplane.host.firewall imported as `fw` in the namespace; its
        `result` comes back decoded from JSON, with the module's log."""
        script = ("import json, logging, sys\n"
                  "logging.basicConfig(stream=sys.stderr, level=logging.INFO)\n"
                  "from dataplane.host import firewall as fw\n"
                  "result = None\n" + code + "\nprint(json.dumps(result))\n")
        r = self.run([sys.executable, "-c", script], check=False)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.splitlines()[-1]), r.stderr

    def save(self, table: str, tool: str = "iptables") -> list[str]:
        return [l for l in self.run([f"{tool}-save", "-t", table]).stdout.splitlines()
                if l.startswith(("-A ", ":"))]

    def chain(self, table: str, chain: str, tool: str = "iptables") -> list[str]:
        return [l for l in self.save(table, tool) if l.startswith(f"-A {chain} ")]

    def nft_tables(self) -> set[str]:
        return {l.strip() for l in self.run(["nft", "list", "tables"]).stdout.splitlines()}

    def nft_chain(self, chain: str, table: str = "ip flannel-ipv4") -> list[str]:
        """The rules of `chain` in `table`, the base chain's line first."""
        out = self.run(["nft", "list", "chain", *table.split(), chain]).stdout
        lines = [l.strip() for l in out.splitlines()]
        return [l for l in lines if l and not l.startswith(("table ", "chain ")) and l != "}"]

    def close(self):
        netns.delete(self.name)


@pytest.fixture
def ns():
    require_root()
    for tool in ("iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save",
                 "ip6tables-restore", "nft"):
        require(shutil.which(tool) is not None, f"needs {tool} (apt-get install iptables nftables)")
    n = Ns()
    try:
        yield n
    finally:
        n.close()


def _install(ns, *, random_fully=True, enable_nftables=False, masq=True, forward=True):
    return ns.firewall(f"r = fw.Rules({NET!r}, {SUB!r}, masq={masq}, forward={forward}, "
                       f"random_fully={random_fully}, enable_nftables={enable_nftables})\n"
                       "r.install()\nresult = r.tool")


@pytest.mark.parametrize("random_fully", [True, False], ids=["random-fully", "disabled"])
def test_iptables_holds_v0_28_order_with_our_jumps_first(ns, random_fully):
    tool, log = _install(ns, random_fully=random_fully)
    assert tool == "iptables" and "EnableNFTables is not true" in log
    assert ns.chain("nat", "FLANNEL-POSTRTG") == v028_postrtg(random_fully)
    assert ns.chain("nat", "POSTROUTING") == [f"-A POSTROUTING {MASQ_JUMP}"]
    assert ns.chain("filter", "FLANNEL-FWD") == [f"-A FLANNEL-FWD -s {NET} {F} -j ACCEPT",
                                                 f"-A FLANNEL-FWD -d {NET} {F} -j ACCEPT"]
    assert ("--random-fully" in "\n".join(ns.save("nat"))) == random_fully
    if not random_fully:
        assert "--ip-masq-fully-random-disable" in log


def test_jumps_a_flanneld_v0_28_appended_are_moved_to_the_top(ns):
    """flanneld v0.28.9 appends its jumps after the host's own rules (a REJECT that then
    rejects the overlay); we put ours first and leave one of each, and flanneld's own check
    (`iptables -C`) still finds its jump, so a flanneld after us appends none."""
    host = ("*nat\n-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE\nCOMMIT\n"
            "*filter\n-A FORWARD -j REJECT --reject-with icmp-port-unreachable\nCOMMIT\n")
    ns.run(["iptables-restore", "--noflush"], input=host)
    flanneld = ["*nat", ":FLANNEL-POSTRTG - [0:0]", *v028_postrtg(),
                f"-A POSTROUTING {MASQ_JUMP}", "COMMIT",
                "*filter", ":FLANNEL-FWD - [0:0]", f"-A FLANNEL-FWD -s {NET} {F} -j ACCEPT",
                f"-A FLANNEL-FWD -d {NET} {F} -j ACCEPT", f"-A FORWARD {FWD_JUMP}", "COMMIT"]
    ns.run(["iptables-restore", "--noflush"], input="\n".join(flanneld) + "\n")
    assert ns.chain("filter", "FORWARD")[-1] == f"-A FORWARD {FWD_JUMP}"     # staged last

    _install(ns)
    assert ns.chain("nat", "POSTROUTING") == [
        f"-A POSTROUTING {MASQ_JUMP}", "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE"]
    assert ns.chain("filter", "FORWARD") == [
        f"-A FORWARD {FWD_JUMP}", "-A FORWARD -j REJECT --reject-with icmp-port-unreachable"]
    assert ns.chain("nat", "FLANNEL-POSTRTG") == v028_postrtg()
    for table, base, jump in (("nat", "POSTROUTING", MASQ_JUMP), ("filter", "FORWARD", FWD_JUMP)):
        check = ns.run(["iptables", "-w", "5", "-t", table, "-C", base, *shlex.split(jump)],
                       check=False)
        assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("random_fully", [True, False], ids=["random-fully", "disabled"])
def test_enable_nftables_puts_flanneld_s_table_in_and_takes_the_iptables_nat_out(ns,
                                                                                random_fully):
    # a host moved from iptables mode: our iptables rules, and older flannel-udp's table
    _install(ns)
    ns.run(["nft", "-f", "-"], input=LEGACY_TABLE)
    assert ns.chain("nat", "FLANNEL-POSTRTG") and "table ip flannel-udp" in ns.nft_tables()

    tool, log = _install(ns, random_fully=random_fully, enable_nftables=True)
    assert tool == "nft"
    assert "EnableNFTables is true in the network config: nftables rules in table ip " \
           "flannel-ipv4" in log
    assert ns.nft_chain("postrtg") == [
        "type nat hook postrouting priority srcnat; policy accept;",
        *v028_postrtg_nft(random_fully)]
    assert ns.nft_chain("forward") == ["type filter hook forward priority filter; policy accept;",
                                       *FWD_NFT]
    tables = ns.nft_tables()
    assert "table ip flannel-udp" not in tables and "table ip flannel-ipv4" in tables
    # nothing of the iptables masquerade is left to NAT a second time; FLANNEL-FWD stays
    nat = "\n".join(ns.save("nat"))
    assert "FLANNEL-POSTRTG" not in nat and "flanneld masq" not in nat, nat
    assert ns.chain("filter", "FORWARD") == [f"-A FORWARD {FWD_JUMP}"]
    assert len(ns.chain("filter", "FLANNEL-FWD")) == 2


def test_flanneld_s_chains_fit_our_table_and_the_old_priorities_would_not(ns):
    """A flanneld v0.28.9 in nftables mode taking the host over adds its base chains to the
    table we left: the kernel takes that only at the same type, hook and priority."""
    _install(ns, enable_nftables=True)
    flanneld = ("add table ip flannel-ipv4\n"
                "add chain ip flannel-ipv4 postrtg { type nat hook postrouting priority 100 ; }\n"
                "add chain ip flannel-ipv4 forward { type filter hook forward priority 0 ; }\n"
                "flush chain ip flannel-ipv4 postrtg\n")
    assert ns.run(["nft", "-f", "-"], input=flanneld, check=False).returncode == 0
    older = "add chain ip flannel-ipv4 postrtg { type nat hook postrouting priority 99 ; }\n"
    assert ns.run(["nft", "-f", "-"], input=older, check=False).returncode != 0


def test_nftables_resync_puts_a_deleted_rule_back(ns):
    got, _ = ns.firewall(
        f"import subprocess\n"
        f"r = fw.Rules({NET!r}, {SUB!r}, masq=True, forward=True, enable_nftables=True)\n"
        "r.install()\n"
        "listing = subprocess.run(['nft', '-a', 'list', 'chain', 'ip', 'flannel-ipv4', "
        "'postrtg'], capture_output=True, text=True).stdout\n"
        f"line = next(l for l in listing.splitlines() if 'ip saddr != {NET} ip daddr {SUB}' in l)\n"
        "subprocess.run(['nft', 'delete', 'rule', 'ip', 'flannel-ipv4', 'postrtg', 'handle', "
        "line.rsplit('# handle ', 1)[1]], check=True)\n"
        "gone = line.split(' comment')[0].strip() not in fw.run(['nft', 'list', 'table', 'ip', "
        "'flannel-ipv4']).stdout\n"
        "result = [gone, r.resync(), r.resync()]")
    assert got == [True, True, False]            # deleted; rebuilt; nothing missing after
    assert ns.nft_chain("postrtg")[1:] == v028_postrtg_nft()


def test_iptables_mode_deletes_the_nftables_tables_a_flanneld_left(ns):
    ns.run(["nft", "-f", "-"], input=FLANNELD_TABLES + LEGACY_TABLE)
    assert {"table ip flannel-ipv4", "table ip6 flannel-ipv6",
            "table ip flannel-udp"} <= ns.nft_tables()
    tool, log = _install(ns)
    assert tool == "iptables"
    assert not ns.nft_tables() & {"table ip flannel-ipv4", "table ip6 flannel-ipv6",
                                  "table ip flannel-udp"}
    assert "deleted the nftables table(s) ip flannel-ipv4, ip6 flannel-ipv6, ip flannel-udp" in log
    assert ns.chain("nat", "FLANNEL-POSTRTG") == v028_postrtg()


def test_remove_all_removes_the_iptables_chains_and_every_flannel_table(ns):
    _install(ns)
    ns.run(["nft", "-f", "-"], input=FLANNELD_TABLES + LEGACY_TABLE)
    ns.run(["nft", "add", "table", "ip", "someone-else"])
    dry, _ = ns.firewall("result = fw.remove_all(dry_run=True)")
    for want in ("nft delete table ip flannel-ipv4", "nft delete table ip6 flannel-ipv6",
                 "nft delete table ip flannel-udp", "-X FLANNEL-POSTRTG", "-X FLANNEL-FWD"):
        assert any(want in line for line in dry), (want, dry)
    assert "table ip flannel-udp" in ns.nft_tables() and ns.chain("nat", "FLANNEL-POSTRTG")

    done, _ = ns.firewall("result = fw.remove_all()")
    assert done == dry
    left = ns.nft_tables()
    assert "table ip someone-else" in left, left
    assert not [t for t in left if "flannel" in t], left
    for table in ("nat", "filter"):
        text = "\n".join(ns.save(table))
        assert "FLANNEL" not in text and "flanneld" not in text, text
    again, _ = ns.firewall("result = fw.remove_all()")
    assert again == []


# ---------------------------------------------------------------- dual stack (EnableIPv6)
def _stack(enable_nftables=False, masq=True, ipv6=True) -> str:
    """Code that makes both families' rules in the namespace as the daemon does, as `r` (with
    `ipv6` False: as a daemon without EnableIPv6 does)."""
    six = f", Part({NET6!r}, {SUB6!r})" if ipv6 else ""
    return ("from dataplane.host.family import V4, V6, Part\n"
            "from dataplane.host.firewall_stack import Stack\n"
            f"r = Stack([Part({NET!r}, {SUB!r}){six}], masq={masq}, forward=True, "
            f"enable_nftables={enable_nftables})\n"
            "r.install()\n")


def test_dual_stack_ip6tables_rules_are_restored_moved_and_cleaned_up(ns):
    got, log = ns.firewall(
        _stack() + "import subprocess\n"
        "before = r.of(V6).resync()\n"
        f"subprocess.run(['ip6tables', '-t', 'nat', '-D', 'FLANNEL-POSTRTG', '-s', {NET6!r}, "
        f"'!', '-d', 'ff00::/8', '-m', 'comment', '--comment', 'flanneld masq', '-j', "
        "'MASQUERADE', '--random-fully'], check=True)\n"
        "subprocess.run(['ip6tables', '-t', 'filter', '-D', 'FORWARD', '-m', 'comment', "
        "'--comment', 'flanneld forward', '-j', 'FLANNEL-FWD'], check=True)\n"
        "result = [before, r.of(V6).resync(), r.of(V6).resync(), r.of(V4).resync()]")
    assert got == [False, True, False, False], log    # rebuilt once; IPv4's untouched
    assert "ip6tables rule(s) missing" in log
    assert ns.chain("nat", "FLANNEL-POSTRTG", "ip6tables") == v028_postrtg6()
    assert ns.chain("nat", "POSTROUTING", "ip6tables") == [f"-A POSTROUTING {MASQ_JUMP}"]
    assert ns.chain("filter", "FORWARD", "ip6tables") == [f"-A FORWARD {FWD_JUMP}"]
    assert ns.chain("filter", "FLANNEL-FWD", "ip6tables") == FWD6
    assert ns.chain("nat", "FLANNEL-POSTRTG") == v028_postrtg()      # IPv4's beside them

    # an IPv6-only reshape of the lease: the masquerade follows the new part
    moved, _ = ns.firewall(_stack() + "r.update_subnet([r.of(V4).subnet, 'fc00:5:0:9::/64'])\n"
                           "result = str(r.of(V6).subnet)")
    assert moved == "fc00:5:0:9::/64"
    assert ns.chain("nat", "FLANNEL-POSTRTG", "ip6tables") == [
        l.replace(SUB6, "fc00:5:0:9::/64") for l in v028_postrtg6()]

    dry, _ = ns.firewall("result = fw.remove_all(dry_run=True)")
    assert any(l.startswith("ip6tables -t nat -D POSTROUTING") for l in dry), dry
    assert any(l.startswith("ip6tables -t filter -F FLANNEL-FWD") for l in dry), dry
    ns.firewall("result = fw.remove_all()")
    for tool in ("iptables", "ip6tables"):
        for table in ("nat", "filter"):
            text = "\n".join(ns.save(table, tool))
            assert "FLANNEL" not in text and "flanneld" not in text, (tool, text)


def test_dual_stack_nftables_table_ip6_is_restored_and_cleaned_up(ns):
    _, _ = ns.firewall(_stack())                # iptables mode first: the move takes it out
    got, log = ns.firewall(
        _stack(enable_nftables=True) + "import subprocess\n"
        "listing = subprocess.run(['nft', '-a', 'list', 'chain', 'ip6', 'flannel-ipv6', "
        "'forward'], capture_output=True, text=True).stdout\n"
        "line = next(l for l in listing.splitlines() if 'ip6 daddr' in l)\n"
        "subprocess.run(['nft', 'delete', 'rule', 'ip6', 'flannel-ipv6', 'forward', 'handle', "
        "line.rsplit('# handle ', 1)[1]], check=True)\n"
        "result = [r.of(V6).resync(), r.of(V6).resync(), r.of(V4).resync()]")
    assert got == [True, False, False], log
    assert "nftables rules in table ip6 flannel-ipv6" in log
    assert ns.nft_chain("postrtg", "ip6 flannel-ipv6") == [
        "type nat hook postrouting priority srcnat; policy accept;", *POSTRTG6_NFT]
    assert ns.nft_chain("forward", "ip6 flannel-ipv6") == [
        "type filter hook forward priority filter; policy accept;", *FWD6_NFT]
    nat6 = "\n".join(ns.save("nat", "ip6tables"))
    assert "FLANNEL-POSTRTG" not in nat6 and "flanneld masq" not in nat6, nat6
    assert "ip6tables masquerade" in log

    ns.firewall("result = fw.remove_all()")
    assert not [t for t in ns.nft_tables() if "flannel" in t]
    assert "FLANNEL" not in "\n".join(ns.save("filter", "ip6tables"))


@pytest.mark.parametrize("enable_nftables", [False, True], ids=["ip6tables", "nftables"])
def test_a_start_without_ipv6_removes_the_ipv6_rules_a_run_with_it_left(ns, enable_nftables):
    """EnableIPv6 turned off between two runs: the second removes the first's IPv6 rules (said
    once), keeps its IPv4 ones and the host's own ip6tables rules; a third finds nothing."""
    host = ("*nat\n-A POSTROUTING -s fd00:1::/64 -j MASQUERADE\nCOMMIT\n"
            "*filter\n-A FORWARD -j REJECT --reject-with icmp6-port-unreachable\nCOMMIT\n")
    ns.run(["ip6tables-restore", "--noflush"], input=host)
    ns.firewall(_stack(enable_nftables))
    if enable_nftables:      # what an ip6tables-mode run before that one left: FLANNEL-FWD
        assert "table ip6 flannel-ipv6" in ns.nft_tables()
        ns.run(["ip6tables-restore", "--noflush"], input="\n".join(
            ["*filter", ":FLANNEL-FWD - [0:0]", *FWD6, f"-I FORWARD 1 {FWD_JUMP}", "COMMIT"]) + "\n")
    else:
        assert ns.chain("nat", "FLANNEL-POSTRTG", "ip6tables") == v028_postrtg6()
    _, log = ns.firewall(_stack(enable_nftables, ipv6=False))
    said = [l for l in log.splitlines() if "EnableIPv6 is off" in l]
    assert len(said) == 1 and "ip6tables -t filter -F FLANNEL-FWD" in said[0], log
    assert ("nft delete table ip6 flannel-ipv6" in said[0]) == enable_nftables, said
    assert ns.save("nat", "ip6tables")[-1:] == ["-A POSTROUTING -s fd00:1::/64 -j MASQUERADE"]
    assert [l for l in ns.save("filter", "ip6tables") if l.startswith("-A")] == [
        "-A FORWARD -j REJECT --reject-with icmp6-port-unreachable"]
    assert "FLANNEL" not in "\n".join(ns.save("nat", "ip6tables"))
    assert "table ip6 flannel-ipv6" not in ns.nft_tables()
    if enable_nftables:
        assert ns.nft_chain("postrtg")[1:] == v028_postrtg_nft()
    else:
        assert ns.chain("nat", "FLANNEL-POSTRTG") == v028_postrtg()
    _, log = ns.firewall(_stack(enable_nftables, ipv6=False))
    assert "EnableIPv6 is off" not in log, log

    if enable_nftables:
        return
    # The same through a handover: the old daemon (with EnableIPv6) still runs, its resync
    # every 50 ms, when the new one (without) removes the IPv6 rules; having handed over, the
    # old one must not put them back before it exits (one tool: the resync is the daemon's).
    alive, log = ns.firewall(
        _stack() + "import time\n"
        "from dataplane.daemon.main import Daemon\n"
        "from dataplane.daemon.options import Options\n"
        "r.start_resync(0.05)\n"
        "old = Daemon(Options())\n"
        "old.state.rules = r\n"
        "old.succession.handed_over(4242)\n"
        + _stack(ipv6=False).replace("r = Stack", "new = Stack")
        .replace("r.install()", "new.install()") +
        "time.sleep(0.3)\n"
        "result = r.of(V6)._thread.is_alive()")
    assert not alive and "rebuilding them all" not in log, log
    assert "FLANNEL" not in "\n".join(ns.save("nat", "ip6tables") + ns.save("filter", "ip6tables"))
    assert "table ip6 flannel-ipv6" not in ns.nft_tables()


def test_dual_stack_without_ip6tables_names_what_to_install(ns):
    """A PATH with iptables but neither ip6tables nor nft, as a host with a bare iptables."""
    bin_dir = f"/tmp/{ns.name}-bin"
    os.makedirs(bin_dir)
    try:
        for tool in ("iptables", "iptables-save", "iptables-restore"):
            os.symlink(shutil.which(tool), os.path.join(bin_dir, tool))
        got, _ = ns.firewall(
            f"import os\nos.environ['PATH'] = {bin_dir!r}\n"
            "try:\n    " + _stack().replace("\n", "\n    ") + "result = 'installed'\n"
            "except fw.MasqError as e:\n    result = str(e)\n")
    finally:
        shutil.rmtree(bin_dir)
    assert "neither `ip6tables` nor `nft`" in got and "apt-get install iptables" in got, got
    assert not ns.chain("nat", "FLANNEL-POSTRTG"), "nothing installed before the error"


_RECEIVER = """
import json, socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.bind(("::", 7791)); s.settimeout(10)
print("ready", flush=True)
print(json.dumps([s.recvfrom(64)[1][0] for _ in range(2)]), flush=True)
"""
_SENDER = """
import socket
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
for dst in ("2001:db8:1::2", "fc00:5:0:9::2"):
    s.sendto(b"x", (dst, 7791))
"""


@pytest.mark.parametrize("enable_nftables", [False, True], ids=["ip6tables", "nftables"])
def test_a_pod_s_ipv6_datagram_leaves_masqueraded_only_out_of_ipv6network(enable_nftables):
    """pod fc00:5:0:3::2 -- host (the rules; 2001:db8:1::1) -- outside 2001:db8:1::2, which also
    holds fc00:5:0:9::2 (another host's pod, as the overlay would deliver it)."""
    require_root()
    for tool in ("ip6tables", "nft"):
        require(shutil.which(tool) is not None, f"needs {tool} (apt-get install iptables nftables)")
    made = []
    try:
        host, pod, out = (Ns(role, disable_ipv6=False) for role in ("fwh", "fwp", "fwo"))
        made += [host, pod, out]
        ip = ["ip", "-batch", "-"]
        host.run(ip, input=f"link add vp type veth peer name eth0 netns {pod.name}\n"
                           f"link add vo type veth peer name eth0 netns {out.name}\n"
                           "addr add fc00:5:0:3::1/64 dev vp nodad\n"
                           "addr add 2001:db8:1::1/64 dev vo nodad\n"
                           "link set vp up\nlink set vo up\n"
                           "route add fc00:5:0:9::/64 via 2001:db8:1::2\n")
        host.run(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])
        pod.run(ip, input="addr add fc00:5:0:3::2/64 dev eth0 nodad\nlink set eth0 up\n"
                          "route add default via fc00:5:0:3::1\n")
        out.run(ip, input="addr add 2001:db8:1::2/64 dev eth0 nodad\n"
                          "addr add fc00:5:0:9::2/128 dev eth0 nodad\nlink set eth0 up\n"
                          "route add default via 2001:db8:1::1\n")
        _, log = host.firewall(_stack(enable_nftables=enable_nftables))
        receiver = subprocess.Popen(netns.exec_argv(out.name, [sys.executable, "-c", _RECEIVER]),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert receiver.stdout.readline().strip() == "ready", receiver.stderr.read()
            pod.run([sys.executable, "-c", _SENDER])
            got, err = receiver.communicate(timeout=15)
        finally:
            if receiver.poll() is None:
                receiver.kill()
                receiver.wait()
        assert receiver.returncode == 0, err
        # out of IPv6Network: the host's address; inside it (-s S -d N RETURN): the pod's own
        assert json.loads(got) == ["2001:db8:1::1", "fc00:5:0:3::2"], log
    finally:
        for n in made:
            n.close()
