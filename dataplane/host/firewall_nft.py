"""The same rules in nftables' words: one table per family, replaced whole (pure: nothing here
runs ``nft``; host/firewall.py does).

nftables: table ``ip flannel-ipv4`` with the base chains ``postrtg`` (type nat, hook
postrouting, priority srcnat) and ``forward`` (type filter, hook forward, priority filter):
flanneld's names and priorities, so that a flanneld taking the host over finds its own chains
(the kernel refuses to re-add a base chain with another priority) and deletes the table when
it stops, and we replace a table it left. firewall_rules.py's rules, replaced whole in one
``nft -f`` transaction that also deletes the table ``ip flannel-udp`` of older flannel-udp
versions (so nothing is NATed by two tables), resynced by comparing the table whole, kept at
exit as the iptables rules are (flanneld deletes its table). Unlike flanneld's, our rules carry
the comments "flanneld masq" / "flanneld forward" (they match nothing; they name the rules in
``nft list ruleset``) and match kube-proxy's mark as a bit, as the iptables rule does.
Caveats: an nftables ``accept`` ends evaluation in its own base chain only, so ``forward``
cannot overrule a drop in another table's forward chain as the iptables jump at the top of
FORWARD does; and among base chains of one priority (the host's own nat chains, iptables-nft's
among them) the kernel runs them in the order they were registered.
"""
from __future__ import annotations

from .family import V4, V6, Family, family_of
from .firewall_rules import forward_rules, in_chain, masq_rules

# nftables, flanneld v0.28.9's names (see the module docstring)
NFT_TABLE = V4.nft_table
NFT_TABLE6 = V6.nft_table
NFT_LEGACY_TABLE = "flannel-udp"        # flannel-udp before EnableNFTables
NFT_POSTRTG, NFT_FWD = "postrtg", "forward"
# (family, name): every nftables table a flannel may have left on a host
NFT_TABLES = (("ip", NFT_TABLE), ("ip6", NFT_TABLE6), ("ip", NFT_LEGACY_TABLE))


_NFT_ADDR = {"-s": "saddr", "-d": "daddr"}
_NFT_VERDICT = {"RETURN": "return", "ACCEPT": "accept", "MASQUERADE": "masquerade"}


def nft_rule(args: list[str], fam: Family = V4) -> str:
    """One of our iptables rules (as :func:`masq_rules` and :func:`forward_rules` give them) in
    nftables' words, so both tools install the same rules from one list; the comment goes
    last, where nft wants it."""
    out, comment, negate, i = [], None, False, 0
    while i < len(args):
        a = args[i]
        if a == "!":
            negate, i = True, i + 1
            continue
        if a in _NFT_ADDR:
            out.append(f"{fam.nft_family} {_NFT_ADDR[a]} {'!= ' if negate else ''}{args[i + 1]}")
            i += 2
        elif args[i:i + 3] == ["-m", "mark", "--mark"]:
            value, _, mask = args[i + 3].partition("/")
            out.append(f"meta mark & {mask} == {value}" if mask else f"meta mark {value}")
            i += 4
        elif args[i:i + 3] == ["-m", "comment", "--comment"]:
            comment, i = args[i + 3], i + 4
        elif a == "-j":
            out.append(_NFT_VERDICT[args[i + 1]])
            i += 2
        elif a == "--random-fully":
            out.append("fully-random")
            i += 1
        else:
            raise ValueError(f"no nftables form for {a!r} in {args}")
        negate = False
    if comment is not None:
        out.append(f'comment "{comment}"')
    return " ".join(out)


def nft_ruleset(network, subnet, masq: bool, forward: bool, random_fully: bool = True) -> str:
    """The same rules as the nftables table ``ip flannel-ipv4`` (``ip6 flannel-ipv6`` for an
    IPv6 `network`), replaced whole in one ``nft -f`` transaction that also deletes older
    flannel-udp's ``ip flannel-udp`` (an empty ``table`` line before each ``delete`` makes it
    valid when the table is not there)."""
    fam = family_of(network)
    lines = []
    for table in ((NFT_LEGACY_TABLE, NFT_TABLE) if fam is V4 else (fam.nft_table,)):
        lines += [f"table {fam.nft_family} {table} {{}}", f"delete table {fam.nft_family} {table}"]
    lines.append(f"table {fam.nft_family} {fam.nft_table} {{")
    chains = []
    if masq:
        chains.append((NFT_POSTRTG, "type nat hook postrouting priority srcnat",
                       in_chain(masq_rules(network, subnet, random_fully))))
    if forward:
        chains.append((NFT_FWD, "type filter hook forward priority filter",
                       in_chain(forward_rules(network))))
    for name, base, rules in chains:
        lines += [f"  chain {name} {{", f"    {base}; policy accept;"]
        lines += [f"    {nft_rule(r, fam)}" for r in rules]
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"
