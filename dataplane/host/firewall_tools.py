"""The host's firewall tools: which one installs the rules, running it, and removing every
flannel rule of either tool (``flannel-udp cleanup``).

Which tool, as flanneld v0.28.9 chooses, logged with the reason at start:

* ``"EnableNFTables": true`` in the network config: nftables, even where iptables exists (no
  ``nft`` binary then is an error with ``--ip-masq``, a warning for the forward rules alone);
* otherwise iptables; nftables also when the ``iptables`` binary is missing (our fallback:
  flanneld only logs that it installs nothing there).
"""
from __future__ import annotations

import re
import shutil
import subprocess

from .family import V4, V6, Family, family_of
from .firewall_nft import NFT_TABLES
from .firewall_rules import CHAINS, FWD, POSTRTG, removal_lines


class MasqError(RuntimeError):
    """Rules could not be installed; the message says what to do."""


def run(argv, check=True, input=None):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30, input=input)
    if check and p.returncode != 0:
        raise MasqError(f"`{' '.join(argv)}` failed: {p.stderr.strip() or p.stdout.strip()}")
    return p




# ---------------------------------------------------------------- the host
def choose_tool(prefer=None, enable_nftables: bool = False,
                fam: Family = V4) -> tuple[str | None, str]:
    """('iptables' | 'nft' | None, why), as flanneld v0.28.9 chooses (the module docstring);
    'iptables' means ip6tables for `fam` V6. `prefer` forces one (tests)."""
    binary = {"iptables": fam.iptables}
    table = f"table {fam.nft_family} {fam.nft_table}"
    if prefer:
        return (prefer if shutil.which(binary.get(prefer, prefer)) else None), \
            f"{prefer} asked for"
    if enable_nftables:
        if shutil.which("nft"):
            return "nft", f"EnableNFTables is true in the network config: nftables rules in {table}"
        return None, "EnableNFTables is true in the network config but `nft` was not found"
    if shutil.which(fam.iptables):
        return "iptables", ("EnableNFTables is not true in the network config: "
                            f"{fam.iptables} rules ({POSTRTG}, {FWD})")
    if shutil.which("nft"):
        return "nft", f"the {fam.iptables} binary is missing: nftables rules in {table}"
    return None, f"neither `{fam.iptables}` nor `nft` was found"


def missing_tool(network, enable_nftables: bool = False) -> str:
    """What --ip-masq says when :func:`choose_tool` finds no tool for `network`'s family: the
    package that has it (Debian's and Ubuntu's names)."""
    fam = family_of(network)
    ipt = fam.iptables
    v6 = f" for the IPv6Network {network} (\"EnableIPv6\": true)" if fam is V6 else ""
    if enable_nftables:
        return (f"--ip-masq{v6} with \"EnableNFTables\": true in the network config needs "
                "nftables and `nft` was not found: install it (apt-get install nftables), set "
                "EnableNFTables to false, or run without --ip-masq")
    return (f"--ip-masq{v6} needs {ipt} or nftables and neither `{ipt}` nor `nft` was found: "
            f"install one (apt-get install iptables, which has {ipt}) or run without --ip-masq")


def detect_tool(prefer=None, enable_nftables: bool = False) -> str | None:
    """'iptables', 'nft' or None (:func:`choose_tool` without the reason)."""
    return choose_tool(prefer, enable_nftables)[0]


def iptables_random_fully(binary: str = "iptables") -> bool:
    p = run([binary, "--version"], check=False)
    m = re.search(r"v(\d+)\.(\d+)\.(\d+)", p.stdout)
    return bool(m) and tuple(map(int, m.groups())) >= (1, 6, 2)


def nft_random_fully(fam: Family = V4) -> bool:
    # -c: the kernel checks the transaction and nothing is committed
    probe = (f"table {fam.nft_family} {fam.nft_table}-probe {{\n  chain p {{\n"
             "    type nat hook postrouting priority srcnat; policy accept;\n"
             "    masquerade fully-random\n  }\n}\n")
    return run(["nft", "-c", "-f", "-"], check=False, input=probe).returncode == 0


def nft_tables_present() -> list[tuple[str, str]]:
    """The tables of :data:`NFT_TABLES` that exist, as (family, name)."""
    if not shutil.which("nft"):
        return []
    out = run(["nft", "list", "tables"], check=False).stdout
    present = {tuple(l.split()[1:3]) for l in out.splitlines() if l.startswith("table ")}
    return [t for t in NFT_TABLES if t in present]


def delete_nft_tables(tables) -> None:
    """One transaction: none of them goes unless all do."""
    run(["nft", "-f", "-"], input="".join(f"delete table {f} {n}\n" for f, n in tables))



def iptables_tools(fam: Family = V4) -> bool:
    return bool(shutil.which(fam.save) and shutil.which(fam.restore))


# ---------------------------------------------------------------- leaving the overlay
def remove_all(dry_run: bool = False) -> list[str]:
    """Remove every rule, chain and table the daemon (or flanneld) installs, whatever network they
    were for: any rule that jumps to FLANNEL-POSTRTG or FLANNEL-FWD, any rule of POSTROUTING /
    FORWARD carrying our comments (older flannels' rules left there directly), both chains, in
    iptables and in ip6tables, and the nftables tables ``ip flannel-ipv4``, ``ip6 flannel-ipv6``
    and ``ip flannel-udp`` (older flannel-udp). For `flannel-udp cleanup`, when a host leaves the
    overlay for good: the daemon itself never removes them (they stay at exit, see the module
    docstring), but for the IPv6 ones when it starts without EnableIPv6 (:func:`remove_family`).

    Each of iptables and ip6tables is one ``-restore --noflush`` transaction, as the install;
    each family's nftables tables one ``nft -f``. Returns what was removed (with ``dry_run``: what would be), as
    the equivalent commands, one per line; [] when nothing of ours is there."""
    return remove_family(V4, dry_run) + remove_family(V6, dry_run)


def remove_family(fam: Family, dry_run: bool = False) -> list[str]:
    """:func:`remove_all` for one family: its iptables tool's chains and rules, and the flannel
    nftables tables of its nftables family (IPv4: ``ip flannel-ipv4`` and ``ip flannel-udp``;
    IPv6: ``ip6 flannel-ipv6``)."""
    done: list[str] = []
    if iptables_tools(fam):
        restore: list[str] = []
        for table in CHAINS:
            saved = run([fam.save, "-t", table], check=False).stdout
            lines, said = removal_lines(table, saved, fam.iptables)
            done += said
            if lines:
                restore += [f"*{table}"] + lines + ["COMMIT"]
        if restore and not dry_run:
            run([fam.restore, "-w", "5", "--noflush"], input="\n".join(restore) + "\n")
    tables = [t for t in nft_tables_present() if t[0] == fam.nft_family]
    done += [f"nft delete table {f} {n}" for f, n in tables]
    if tables and not dry_run:
        delete_nft_tables(tables)
    return done
