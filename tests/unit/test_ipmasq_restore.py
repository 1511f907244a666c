"""The iptables-restore and nft texts the rules are installed with (no root: text only)."""
from __future__ import annotations

import ipaddress
import shutil

import pytest

from dataplane.host import firewall_tools
from dataplane.host.family import Part
from dataplane.host.firewall_nft import nft_rule, nft_ruleset
from dataplane.host.firewall_rules import (FILTER, NAT, Previous, chain_rules, in_chain,
                                           missing_rules, restore_text)
from dataplane.host.firewall_rules import forward_rules as _forward_rules
from dataplane.host.firewall_rules import masq_rules as _masq_rules
from dataplane.host.firewall_tools import MasqError
from dataplane.control.subnetfile import read_previous_rules
from tests.conftest import wait_until

NET, SUB = "10.5.0.0/16", "10.5.3.0/24"
NET6, SUB6 = "fc00:5::/56", "fc00:5:0:3::/64"
MASQ_JUMP = '-m comment --comment "flanneld masq" -j FLANNEL-POSTRTG'
FWD_JUMP = '-m comment --comment "flanneld forward" -j FLANNEL-FWD'

SAVE_NAT_OLD_LAYOUT = """\
*nat
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -s 10.4.0.0/16 -d 10.4.0.0/16 -m comment --comment "flanneld masq" -j RETURN
-A POSTROUTING -s 10.4.0.0/16 ! -d 224.0.0.0/4 -m comment --comment "flanneld masq" -j MASQUERADE
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
COMMIT
"""


def masq_rules(*a):
    return in_chain(_masq_rules(*a))


def forward_rules(*a):
    return in_chain(_forward_rules(*a))


def P(net=None, sub=None, masq=None):
    return Previous(net and ipaddress.IPv4Network(net), sub and ipaddress.IPv4Network(sub), masq)


def rules(text, chain):
    return chain_rules(text, chain)


NAT_FLANNEL = [
    "*nat",
    ":FLANNEL-POSTRTG - [0:0]",
    f"-I POSTROUTING 1 {MASQ_JUMP}",
    # flanneld v0.28.9's order (docs/flannel-compat.md#iptables)
    '-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 -m comment --comment "flanneld masq" -j RETURN',
    '-A FLANNEL-POSTRTG -s 10.5.3.0/24 -d 10.5.0.0/16 -m comment --comment "flanneld masq" -j RETURN',
    '-A FLANNEL-POSTRTG -s 10.5.0.0/16 -d 10.5.3.0/24 -m comment --comment "flanneld masq" -j RETURN',
    '-A FLANNEL-POSTRTG ! -s 10.5.0.0/16 -d 10.5.3.0/24 -m comment --comment "flanneld masq" -j RETURN',
    '-A FLANNEL-POSTRTG -s 10.5.0.0/16 ! -d 224.0.0.0/4 -m comment --comment "flanneld masq" '
    '-j MASQUERADE --random-fully',
    '-A FLANNEL-POSTRTG ! -s 10.5.0.0/16 -d 10.5.0.0/16 -m comment --comment "flanneld masq" '
    '-j MASQUERADE --random-fully',
    "COMMIT",
]
FILTER_FLANNEL = [
    "*filter",
    ":FLANNEL-FWD - [0:0]",
    f"-I FORWARD 1 {FWD_JUMP}",
    '-A FLANNEL-FWD -s 10.5.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT',
    '-A FLANNEL-FWD -d 10.5.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT',
    "COMMIT",
]


def test_fresh_host_gets_both_chains_and_jumps_at_the_top_in_one_text():
    want = {NAT: masq_rules(NET, SUB), FILTER: forward_rules(NET)}
    assert restore_text(want, {}).splitlines() == FILTER_FLANNEL + NAT_FLANNEL


FORWARD_CASES = [
    # (what FORWARD holds now, the lines expected between ":FLANNEL-FWD" and the chain's rules)
    pytest.param([], [f"-I FORWARD 1 {FWD_JUMP}"], id="absent: inserted at the top"),
    pytest.param([f"-A FORWARD {FWD_JUMP}", "-A FORWARD -j REJECT"], [],
                 id="already first and alone: kept (no duplicate)"),
    pytest.param(["-A FORWARD -j DOCKER-USER", f"-A FORWARD {FWD_JUMP}", "-A FORWARD -j REJECT"],
                 [f"-D FORWARD {FWD_JUMP}", f"-I FORWARD 1 {FWD_JUMP}"],
                 id="not first: moved to the top in the same transaction"),
    pytest.param(["-A FORWARD -j REJECT", f"-A FORWARD {FWD_JUMP}"],
                 [f"-D FORWARD {FWD_JUMP}", f"-I FORWARD 1 {FWD_JUMP}"],
                 id="appended after a REJECT (flanneld v0.28.9, older flannel-udp): moved up"),
    pytest.param([f"-A FORWARD {FWD_JUMP}", f"-A FORWARD {FWD_JUMP}"],
                 [f"-D FORWARD {FWD_JUMP}", f"-D FORWARD {FWD_JUMP}", f"-I FORWARD 1 {FWD_JUMP}"],
                 id="duplicates: all deleted, one inserted"),
    pytest.param(["-A FORWARD -j FLANNEL-FWD"],
                 [],
                 id="a jump without the comment, first and alone: kept"),
]


@pytest.mark.parametrize("forward, expected", FORWARD_CASES)
def test_forward_jump(forward, expected):
    text = "*filter\n" + "\n".join(forward) + "\nCOMMIT\n"
    got = restore_text({FILTER: forward_rules(NET)}, {FILTER: rules(text, "FORWARD")})
    lines = got.splitlines()
    assert lines[:2] == ["*filter", ":FLANNEL-FWD - [0:0]"]
    assert lines[2:2 + len(expected)] == expected
    assert lines[2 + len(expected):] == FILTER_FLANNEL[3:]


def test_a_masquerade_jump_appended_by_flanneld_v0_28_is_moved_to_the_top():
    # flanneld v0.28.9 appends (-A) its jump, after a container runtime's MASQUERADE
    save = ("*nat\n-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE\n"
            f"-A POSTROUTING {MASQ_JUMP}\nCOMMIT\n")
    got = restore_text({NAT: masq_rules(NET, SUB)}, {NAT: rules(save, "POSTROUTING")}).splitlines()
    assert got[:4] == ["*nat", ":FLANNEL-POSTRTG - [0:0]", f"-D POSTROUTING {MASQ_JUMP}",
                       f"-I POSTROUTING 1 {MASQ_JUMP}"]
    assert got[4:] == NAT_FLANNEL[3:]
    assert not any("docker0" in l for l in got)


RECYCLE_CASES = [
    # previous, changed, the POSTROUTING rules deleted
    pytest.param(P("10.4.0.0/16", "10.4.7.0/24"), True, 2, id="other network: its rules go"),
    pytest.param(P(NET, "10.5.9.0/24"), True, 0, id="other subnet, same network: none there"),
    pytest.param(P("10.4.0.0/16", "10.4.7.0/24"), False, 0, id="not changed: nothing recycled"),
    pytest.param(P(), True, 0, id="no subnet.env: nothing recycled"),
]


@pytest.mark.parametrize("previous, changed, deleted", RECYCLE_CASES)
def test_recycling_deletes_only_the_previous_networks_flannel_rules(previous, changed, deleted):
    got = restore_text({NAT: masq_rules(NET, SUB)}, {NAT: rules(SAVE_NAT_OLD_LAYOUT, "POSTROUTING")},
                       previous, changed=changed).splitlines()
    deletes = [l for l in got if l.startswith("-D POSTROUTING")]
    assert len(deletes) == deleted
    assert all("flanneld masq" in l and "10.4.0.0/16" in l for l in deletes)
    assert not any("docker0" in l for l in got)          # never someone else's rule


def test_masquerade_turned_off_removes_its_chain_and_jump_only():
    save = f"*nat\n-A POSTROUTING {MASQ_JUMP}\n-A POSTROUTING -j KUBE-POSTROUTING\nCOMMIT\n"
    got = restore_text({FILTER: forward_rules(NET)}, {NAT: rules(save, "POSTROUTING")},
                       drop=(NAT,)).splitlines()
    assert got[got.index("*nat"):] == ["*nat", ":FLANNEL-POSTRTG - [0:0]",
                                       f"-D POSTROUTING {MASQ_JUMP}", "-X FLANNEL-POSTRTG", "COMMIT"]


@pytest.mark.parametrize("random_fully, tail", [(True, ["-j", "MASQUERADE", "--random-fully"]),
                                                (False, ["-j", "MASQUERADE"])])
def test_masquerade_random_fully_only_when_supported(random_fully, tail):
    masq = [r for r in masq_rules(NET, SUB, random_fully) if "MASQUERADE" in r]
    assert len(masq) == 2 and all(r[-len(tail):] == tail for r in masq)


def test_chain_rules_reads_quoted_comments_back():
    save = ('-A FLANNEL-FWD -s 10.5.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT\n'
            '-A FORWARD -j REJECT\n')
    assert chain_rules(save, "FLANNEL-FWD") == [forward_rules(NET)[0]]


MISSING_CASES = [
    pytest.param(lambda s: s, [], id="all there"),
    pytest.param(lambda s: s.replace(f"-A POSTROUTING {MASQ_JUMP}\n", ""),
                 ["nat POSTROUTING -> FLANNEL-POSTRTG"], id="jump deleted"),
    pytest.param(lambda s: s.replace("-A FLANNEL-POSTRTG -m mark", "-A OTHER -m mark"),
                 ["nat FLANNEL-POSTRTG -m mark"], id="a chain rule deleted"),
]


@pytest.mark.parametrize("edit, gone", MISSING_CASES)
def test_missing_rules(edit, gone):
    want = {NAT: masq_rules(NET, SUB)}
    installed = f"-A POSTROUTING {MASQ_JUMP}\n" + "".join(
        l + "\n" for l in NAT_FLANNEL if l.startswith("-A FLANNEL-POSTRTG"))
    found = missing_rules(want, {NAT: edit(installed)})
    assert [g[:len(p)] for g, p in zip(found, gone)] == gone and len(found) == len(gone)


@pytest.mark.parametrize("masq, forward, chains", [(True, True, ["postrtg", "forward"]),
                                                   (False, True, ["forward"]),
                                                   (True, False, ["postrtg"])])
def test_nft_table_is_flanneld_s_replaced_whole_with_the_legacy_one(masq, forward, chains):
    text = nft_ruleset(NET, SUB, masq, forward)
    lines = text.splitlines()
    # create-if-absent, delete, define: one transaction that also recycles the old rules and
    # removes the table of older flannel-udp versions
    assert lines[:5] == ["table ip flannel-udp {}", "delete table ip flannel-udp",
                         "table ip flannel-ipv4 {}", "delete table ip flannel-ipv4",
                         "table ip flannel-ipv4 {"]
    assert [l.split()[1] for l in lines if l.strip().startswith("chain ")] == chains
    # flanneld's standard priorities: its `add chain` on our table must not be refused
    assert ("type nat hook postrouting priority srcnat; policy accept;" in text) == masq
    assert ("type filter hook forward priority filter; policy accept;" in text) == forward
    assert " - 1" not in text
    assert (f"ip saddr != {NET} ip daddr {SUB} return" in text) == masq


MASQ_NFT = [
    'meta mark & 0x4000 == 0x4000 return comment "flanneld masq"',
    f'ip saddr {SUB} ip daddr {NET} return comment "flanneld masq"',
    f'ip saddr {NET} ip daddr {SUB} return comment "flanneld masq"',
    f'ip saddr != {NET} ip daddr {SUB} return comment "flanneld masq"',
    f'ip saddr {NET} ip daddr != 224.0.0.0/4 masquerade{{}} comment "flanneld masq"',
    f'ip saddr != {NET} ip daddr {NET} masquerade{{}} comment "flanneld masq"',
]


@pytest.mark.parametrize("random_fully", [True, False])
def test_nft_postrtg_holds_the_iptables_rules_in_their_order(random_fully):
    text = nft_ruleset(NET, SUB, True, False, random_fully)
    body = text[text.index("chain postrtg {"):].splitlines()[2:]
    tail = " fully-random" if random_fully else ""
    assert [l.strip() for l in body[:len(MASQ_NFT)]] == [r.format(tail) for r in MASQ_NFT]
    assert body[len(MASQ_NFT)].strip() == "}"
    assert ("fully-random" in text) == random_fully
    # the same list as iptables', rule for rule
    assert [nft_rule(r) for r in masq_rules(NET, SUB, random_fully)] == \
        [r.format(tail) for r in MASQ_NFT]


def test_nft_forward_chain_accepts_the_network_both_ways():
    text = nft_ruleset(NET, SUB, False, True)
    body = [l.strip() for l in text[text.index("chain forward {"):].splitlines()[2:4]]
    assert body == [f'ip saddr {NET} accept comment "flanneld forward"',
                    f'ip daddr {NET} accept comment "flanneld forward"']


@pytest.mark.parametrize("body, expected", [
    ("FLANNEL_NETWORK=10.4.0.0/16\nFLANNEL_SUBNET=10.4.7.1/24\nFLANNEL_MTU=1472\n"
     "FLANNEL_IPMASQ=true\n", ("10.4.0.0/16", "10.4.7.0/24", True)),
    ("FLANNEL_SUBNET=10.4.7.1/24\nFLANNEL_IPMASQ=false\n", (None, "10.4.7.0/24", False)),
    ("FLANNEL_NETWORK=fd00::/64\nFLANNEL_SUBNET=10.4.7.1/24\n", None),   # invalid file: ignored
    (None, (None, None, None)),
])
def test_read_previous_rules(tmp_path, body, expected):
    path = tmp_path / "subnet.env"
    if body is not None:
        path.write_text(body)
    got = read_previous_rules(str(path))
    if expected is None:
        assert got == (None, None, None)
    else:
        assert got == tuple(ipaddress.IPv4Network(x) if isinstance(x, str) else x
                            for x in expected)


def test_help_says_the_rules_stay_and_how_to_remove_them():
    import subprocess
    import sys

    from dataplane.host.firewall import REMOVAL_COMMANDS
    out = subprocess.run([sys.executable, "-m", "dataplane", "run", "--help"], capture_output=True,
                         text=True, timeout=60, env={"COLUMNS": "1000", "PATH": ""}).stdout
    flat = " ".join(out.split())
    assert flat.count("the rules stay after exit") == 2
    for cmd in REMOVAL_COMMANDS["iptables"] + REMOVAL_COMMANDS["nft"]:
        assert cmd in flat, cmd


class FakeHost:
    """Stands in for iptables: counts installs, fails when told, reports what is missing."""

    def __init__(self):
        self.installs, self.fail, self.missing = [], False, []

    def install(self, rules):
        if self.fail:
            raise MasqError("iptables-restore: busy")
        self.installs.append(str(rules.subnet))


@pytest.fixture
def fake(monkeypatch):
    from dataplane.host import firewall
    host = FakeHost()
    monkeypatch.setattr(firewall, "choose_tool", lambda prefer=None, enable_nftables=False, fam=None:
                        ("iptables", "a fake host"))
    monkeypatch.setattr(firewall, "iptables_random_fully", lambda *binary: True)
    monkeypatch.setattr(firewall.Rules, "_ipt_install", lambda self: host.install(self))
    monkeypatch.setattr(firewall.Rules, "_ipt_missing", lambda self: list(host.missing))
    return host


def test_resync_survives_lease_moves_and_retries_a_failed_rebuild(fake):
    from dataplane.host.firewall import Rules
    r = Rules(NET, SUB, masq=True, forward=True)
    r.install()
    r.start_resync(0.05)
    try:
        fake.fail = True
        r.update_subnet("10.5.9.0/24")                   # logged, not raised: the move goes on
        fake.fail = False
        wait_until(lambda: fake.installs[-1] == "10.5.9.0/24", 5, 0.02,
                   "the resync to rebuild for the new subnet")
        assert fake.installs == [SUB, "10.5.9.0/24"]     # the resync rebuilt for the new subnet
        r.update_subnet("10.5.10.0/24")
        fake.missing = ["nat POSTROUTING -> FLANNEL-POSTRTG"]
        wait_until(lambda: len(fake.installs) >= 4, 5, 0.02, "the resync after the second move")
        assert fake.installs[2:4] == ["10.5.10.0/24"] * 2   # still resyncing after two moves
        assert r._thread.is_alive()
    finally:
        r.stop()
    assert not r._thread.is_alive()


TOOL_CASES = [
    # (binaries on the PATH, EnableNFTables, the tool, words of the reason logged)
    pytest.param({"iptables", "nft"}, False, "iptables", "EnableNFTables is not true",
                 id="both, EnableNFTables unset: iptables"),
    pytest.param({"iptables", "nft"}, True, "nft", "EnableNFTables is true in the network "
                 "config: nftables rules in table ip flannel-ipv4", id="both, EnableNFTables: nft"),
    pytest.param({"nft"}, False, "nft", "the iptables binary is missing",
                 id="no iptables: the nftables fallback"),
    pytest.param({"iptables"}, True, None, "`nft` was not found", id="EnableNFTables, no nft"),
    pytest.param(set(), False, None, "neither", id="none"),
]


@pytest.mark.parametrize("found, enable, tool, why", TOOL_CASES)
def test_tool_choice_follows_enable_nftables(monkeypatch, found, enable, tool, why):
    from dataplane.host import firewall
    monkeypatch.setattr(shutil, "which",
                        lambda name: f"/x/{name}" if name in found else None)
    got, reason = firewall.choose_tool(enable_nftables=enable)
    assert got == tool and why in reason, reason


def test_enable_nftables_without_nft_names_the_config_key(monkeypatch, caplog):
    import logging

    from dataplane.host import firewall
    monkeypatch.setattr(shutil, "which",
                        lambda name: "/x/iptables" if name == "iptables" else None)
    with pytest.raises(MasqError, match="EnableNFTables.*nft.*nftables"):
        firewall.Rules(NET, SUB, masq=True, forward=True, enable_nftables=True)
    with caplog.at_level(logging.WARNING, logger=firewall.log.name):
        r = firewall.Rules(NET, SUB, masq=False, forward=True, enable_nftables=True)
    assert r.tool is None and "nft not found (EnableNFTables" in caplog.text


@pytest.mark.parametrize("tool", ["iptables", "nft"])
@pytest.mark.parametrize("asked, supported, expected", [(True, True, True), (False, True, False),
                                                        (True, False, False)])
def test_random_fully_needs_the_switch_and_the_tool(monkeypatch, caplog, tool, asked, supported,
                                                    expected):
    import logging

    from dataplane.host import firewall
    monkeypatch.setattr(firewall, "choose_tool", lambda prefer=None, enable_nftables=False, fam=None:
                        (tool, "a fake host"))
    monkeypatch.setattr(firewall, "iptables_random_fully", lambda *binary: supported)
    monkeypatch.setattr(firewall, "nft_random_fully", lambda *fam: supported)
    with caplog.at_level(logging.INFO, logger=firewall.log.name):
        r = firewall.Rules(NET, SUB, masq=True, forward=False, random_fully=asked)
    masq = [a for a in r._want()[NAT] if "MASQUERADE" in a]
    assert len(masq) == 2 and all(("--random-fully" in a) == expected for a in masq)
    assert ("fully-random" in nft_ruleset(NET, SUB, True, False, r._random_fully)) == expected
    if not asked:
        assert "--ip-masq-fully-random-disable" in caplog.text


@pytest.mark.parametrize("dual", [False, True], ids=["ipv4", "dual-stack"])
@pytest.mark.parametrize("disable, enable", [(False, False), (True, True), (True, False)])
def test_the_daemon_passes_the_flag_and_the_config_key_to_the_rules(monkeypatch, tmp_path,
                                                                    disable, enable, dual):
    from dataplane.daemon import startup
    from dataplane.daemon.options import Options
    from dataplane.host import firewall
    made = []

    class Recorder:
        def __init__(self, network, subnet, **kw):
            self.seen = dict(kw, network=network, subnet=subnet)
            made.append(self)

        def install(self):
            self.seen["installed"] = True

        def start_resync(self, period):
            self.seen["resync"] = period

    monkeypatch.setattr(firewall, "Rules", Recorder)
    cleared = []        # without EnableIPv6 the IPv6 leftovers go (the netns tests: the rules)
    monkeypatch.setattr(firewall_tools, "remove_family", lambda fam: cleared.append(fam) or [])
    path = tmp_path / "subnet.env"
    path.write_text("FLANNEL_NETWORK=10.4.0.0/16\nFLANNEL_SUBNET=10.4.7.1/24\nFLANNEL_MTU=1472\n"
                    "FLANNEL_IPMASQ=true\nFLANNEL_IPV6_NETWORK=fc00:4::/56\n"
                    "FLANNEL_IPV6_SUBNET=fc00:4:0:7::1/64\n")
    opts = Options(ip_masq=True, ip_masq_fully_random_disable=disable, subnet_file=str(path))
    parts = [Part(NET, SUB)] + ([Part(NET6, SUB6)] if dual else [])
    stack = startup.install_rules(opts, parts, enable_nftables=enable)
    # the IPv6 rules first: the IPv4 ones' cross-over may delete ip6 flannel-ipv6
    assert [m.seen["network"] for m in made] == ([NET6] if dual else []) + [NET]
    assert stack.members == made
    for m in made:
        assert m.seen["random_fully"] is (not disable) and m.seen["enable_nftables"] is enable
        assert m.seen["installed"] and m.seen["resync"] == opts.iptables_resync
    assert made[-1].seen["previous"] == P("10.4.0.0/16", "10.4.7.0/24", True)
    assert cleared == ([] if dual else [firewall.V6])
    if dual:
        assert made[0].seen["previous"] == Previous(ipaddress.IPv6Network("fc00:4::/56"),
                                                    ipaddress.IPv6Network("fc00:4:0:7::/64"), True)
