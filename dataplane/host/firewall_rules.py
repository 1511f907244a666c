"""flanneld's masquerade and forward rules as iptables argument lists, and the
``iptables-restore`` text that installs, recycles and removes them (pure: nothing here runs a
tool; host/firewall.py does, host/firewall_nft.py writes the same rules for nftables).

The rules are flanneld v0.28.9's (docs/operating.md#firewall, docs/flannel-compat.md#iptables).
``--ip-masq`` (nat table, chain FLANNEL-POSTRTG), for overlay network N and this host's lease
subnet S::

    -m mark --mark 0x4000/0x4000        RETURN       kube-proxy's mark: no double NAT
    -s S -d N                           RETURN       our workloads to the overlay: never NAT
    -s N -d S                           RETURN       the overlay to our workloads: never NAT
    ! -s N -d S                         RETURN       the world to our own subnet: keep
    -s N ! -d 224.0.0.0/4               MASQUERADE   the overlay to the world (not multicast)
    ! -s N -d N                         MASQUERADE   the host to the overlay

Overlay traffic that touches neither side of S (another host's workload routed through this
one) is masqueraded: flanneld v0.20.2's ``-s N -d N`` RETURN kept it, v0.28.9 does not.
MASQUERADE gets ``--random-fully`` (nftables: ``fully-random``) where the tool takes it
(iptables >= 1.6.2; nftables: the kernel accepts it in a checked transaction), unless
``--ip-masq-fully-random-disable`` (``Rules(random_fully=False)``).
``--iptables-forward-rules`` (filter table, chain FLANNEL-FWD): ACCEPT ``-s N`` and ``-d N``.
"""
from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass
from typing import Optional, Union

from .family import V4, Family, family_of

KUBE_PROXY_MARK = "0x4000/0x4000"
MASQ_COMMENT = "flanneld masq"
FWD_COMMENT = "flanneld forward"
POSTRTG = "FLANNEL-POSTRTG"
FWD = "FLANNEL-FWD"
NAT, FILTER = "nat", "filter"
# table -> (built-in chain holding the jump, our chain, the comment marking our rules)
CHAINS = {NAT: ("POSTROUTING", POSTRTG, MASQ_COMMENT), FILTER: ("FORWARD", FWD, FWD_COMMENT)}


# What an operator runs to remove the rules (they stay after exit); --help and the tests use them.
def chain_removal(binary: str, table: str) -> list[str]:
    base, chain, comment = CHAINS[table]
    return [f'{binary} -t {table} -D {base} -m comment --comment "{comment}" -j {chain}',
            f"{binary} -t {table} -F {chain}", f"{binary} -t {table} -X {chain}"]


def removal_commands(tool: str, fam: Family = V4) -> list[str]:
    """What removes one family's rules installed with `tool` ('iptables' or 'nft')."""
    if tool == "nft":
        return [f"nft delete table {fam.nft_family} {fam.nft_table}"]
    return chain_removal(fam.iptables, NAT) + chain_removal(fam.iptables, FILTER)


MASQ_REMOVAL = chain_removal("iptables", NAT)
FWD_REMOVAL = chain_removal("iptables", FILTER)
REMOVAL_COMMANDS = {"iptables": removal_commands("iptables"), "nft": removal_commands("nft")}


@dataclass(frozen=True)
class Previous:
    """What subnet.env said before this start (any part may be unknown), for one family."""
    network: Optional[Union[ipaddress.IPv4Network, ipaddress.IPv6Network]] = None
    subnet: Optional[Union[ipaddress.IPv4Network, ipaddress.IPv6Network]] = None
    ipmasq: Optional[bool] = None


# ---------------------------------------------------------------- the rules
def masq_rules(network, subnet, random_fully=True) -> list[tuple]:
    """(table, chain, args) in flanneld v0.28.9's order: the jump, then FLANNEL-POSTRTG's;
    IPv4 or IPv6 as `network` is."""
    fam = family_of(network)
    n, s = str(fam.network(network)), str(fam.network(subnet))
    c = ["-m", "comment", "--comment", MASQ_COMMENT]
    masq = ["-j", "MASQUERADE"] + (["--random-fully"] if random_fully else [])
    return [(NAT, "POSTROUTING", jump_rule(NAT))] + [(NAT, POSTRTG, r) for r in (
        ["-m", "mark", "--mark", KUBE_PROXY_MARK] + c + ["-j", "RETURN"],
        ["-s", s, "-d", n] + c + ["-j", "RETURN"],
        ["-s", n, "-d", s] + c + ["-j", "RETURN"],
        ["!", "-s", n, "-d", s] + c + ["-j", "RETURN"],
        ["-s", n, "!", "-d", fam.multicast] + c + masq,
        ["!", "-s", n, "-d", n] + c + masq,
    )]


def forward_rules(network) -> list[tuple]:
    """(table, chain, args): the jump, then FLANNEL-FWD's rules."""
    n = str(family_of(network).network(network))
    c = ["-m", "comment", "--comment", FWD_COMMENT]
    return [(FILTER, "FORWARD", jump_rule(FILTER)),
            (FILTER, FWD, ["-s", n] + c + ["-j", "ACCEPT"]),
            (FILTER, FWD, ["-d", n] + c + ["-j", "ACCEPT"])]


def in_chain(rules: list[tuple]) -> list[list[str]]:
    """The rules that live in our own chain (what `restore_text` fills it with)."""
    return [args for _, chain, args in rules if chain in (POSTRTG, FWD)]


def jump_rule(table) -> list[str]:
    _, chain, comment = CHAINS[table]
    return ["-m", "comment", "--comment", comment, "-j", chain]


def chain_rules(save_text: str, chain: str) -> list[list[str]]:
    """The rules of `chain` in iptables-save output, as argument lists (without ``-A chain``)."""
    out = []
    for line in save_text.splitlines():
        if line.startswith(f"-A {chain} "):
            out.append(shlex.split(line)[2:])
    return out


def _jumps_to(args: list[str], target: str) -> bool:
    return any(a == "-j" and b == target for a, b in zip(args, args[1:]))


def _recyclable(args: list[str], comment: str, previous: Previous) -> bool:
    """A rule of the previous network/subnet left directly in the built-in chain."""
    if comment not in args:
        return False
    old = {str(x) for x in (previous.network, previous.subnet) if x is not None}
    return bool(old.intersection(args))


def restore_text(want: dict, builtin: dict, previous: Previous = Previous(), *,
                 changed: bool = False, drop: tuple = ()) -> str:
    """One ``iptables-restore --noflush`` input.

    want:    table -> our chain's rules (argument lists); its jump goes to the top of the
             table's built-in chain.
    builtin: table -> the built-in chain's current rules (from iptables-save), to find our
             jumps already there and the previous network's rules to recycle.
    changed: the previous network or subnet differs from the current one (recycle).
    drop:    tables whose chain and jump must go (a feature turned off since last time).
    """
    out = []
    for table in sorted(set(want) | set(drop)):
        base, chain, comment = CHAINS[table]
        current = builtin.get(table, [])
        jumps = [r for r in current if _jumps_to(r, chain)]
        lines = [f":{chain} - [0:0]"]          # created, or flushed if it exists (--noflush)
        keep_jump = table in want and len(jumps) == 1 and current[0] == jumps[0]
        if not keep_jump:
            lines += [_line("-D", base, r) for r in jumps]
        if changed and table in want:
            lines += [_line("-D", base, r) for r in current
                      if not _jumps_to(r, chain) and _recyclable(r, comment, previous)]
        if table in want:
            if not keep_jump:
                lines.append(_line("-I", base, ["1"] + jump_rule(table)))
            lines += [_line("-A", chain, r) for r in want[table]]
        else:
            lines.append(f"-X {chain}")
        out += [f"*{table}"] + lines + ["COMMIT"]
    return "\n".join(out) + "\n"


def _line(op: str, chain: str, args: list[str]) -> str:
    # iptables-restore reads double quotes only (as iptables-save writes them)
    return " ".join([op, chain] + [f'"{a}"' if " " in a else a for a in args])


def missing_rules(want: dict, save: dict) -> list[str]:
    """What resync finds missing: our jumps and our chains' rules, compared with what
    iptables-save printed right after the install (`want` holds those lines) per table."""
    gone = []
    for table, (base, chain, _) in CHAINS.items():
        if table not in want:
            continue
        text = save.get(table, "")
        if not any(_jumps_to(r, chain) for r in chain_rules(text, base)):
            gone.append(f"{table} {base} -> {chain}")
        present = chain_rules(text, chain)
        gone += [f"{table} {chain} {' '.join(r)}" for r in want[table] if r not in present]
    return gone



def removal_lines(table: str, saved: str, binary: str = "iptables") -> tuple[list[str], list[str]]:
    """What removes our chain of `table` and everything that leads to it from iptables-save's
    `saved`: (iptables-restore lines, the equivalent commands). Any rule that jumps to the
    chain, any rule of the built-in chain carrying our comment (older flannels' rules left
    there directly), the chain itself."""
    base, chain, comment = CHAINS[table]
    lines, done = [], []
    for line in saved.splitlines():
        if not line.startswith("-A "):
            continue
        words = shlex.split(line)
        where, args = words[1], words[2:]
        if _jumps_to(args, chain) or (where == base and comment in args):
            lines.append(_line("-D", where, args))
            done.append(f"{binary} -t {table} -D {where} {shlex.join(args)}")
    if re.search(rf"^:{re.escape(chain)} ", saved, re.M):
        rules = len(chain_rules(saved, chain))
        # the declaration flushes the chain under --noflush; then it can go
        lines += [f":{chain} - [0:0]", f"-X {chain}"]
        done.append(f"{binary} -t {table} -F {chain}; {binary} -t {table} -X {chain}"
                    f"    # {rules} rule(s)")
    return lines, done
