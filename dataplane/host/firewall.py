"""flanneld's masquerade and forward rules, through iptables or nftables, with their lifetime.

(Over 600 lines as one piece: the same rules written for both tools, side by side, so that
one can be checked against the other; what both families hold is firewall_stack.py's.)

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

Which tool, as flanneld v0.28.9 chooses, logged with the reason at start:

* ``"EnableNFTables": true`` in the network config: nftables, even where iptables exists (no
  ``nft`` binary then is an error with ``--ip-masq``, a warning for the forward rules alone);
* otherwise iptables; nftables also when the ``iptables`` binary is missing (our fallback:
  flanneld only logs that it installs nothing there).

iptables lifetime (flanneld's, but for the place of the jumps):

* install: both chains are created or flushed and filled, and the jumps put at the TOP of
  POSTROUTING / FORWARD, in ONE ``iptables-restore --noflush`` transaction, so a packet never
  sees half a rule set, and the ACCEPTs run before a host's own REJECT or policy DROP (ufw,
  firewalld, Docker). flanneld v0.28.9 appends its jumps (``-A``) instead. A jump already
  first is kept; any other copy of it (a restart after SIGKILL, an older version's or a
  flanneld's appended jump) is deleted in the same transaction, so ours ends up alone at the
  top. A flanneld v0.28.9 started after us adds no second jump: it looks for its rules with
  ``iptables -C``, which matches ours wherever they stand (its start deletes what it finds
  before appending its own; its resync adds nothing while it finds them all).
* recycling: when subnet.env's previous network or subnet differs from the current one, the
  previous network's rules left directly in POSTROUTING (older flannels' layout) go too; the
  chains themselves are flushed anyway. A previous ``FLANNEL_IPMASQ=true`` with masquerade now
  off removes the masquerade chain (flanneld would leave it NATing).
* resync: every ``--iptables-resync`` seconds, if any rule is missing everything is rebuilt.
  The thread lives as long as the daemon: a lease moving to another subnet rebuilds the rules
  for it and the resync goes on with them.
* exit: the rules STAY, so workloads keep egress NAT and forwarding while the daemon restarts
  or is upgraded (Docker with ``--ip-masq=false`` relies on flannel's masquerade).
  :data:`REMOVAL_COMMANDS` is what an operator runs to remove them.

nftables: table ``ip flannel-ipv4`` with the base chains ``postrtg`` (type nat, hook
postrouting, priority srcnat) and ``forward`` (type filter, hook forward, priority filter):
flanneld's names and priorities, so that a flanneld taking the host over finds its own chains
(the kernel refuses to re-add a base chain with another priority) and deletes the table when
it stops, and we replace a table it left. The same rules as above, replaced whole in one
``nft -f`` transaction that also deletes the table ``ip flannel-udp`` of older flannel-udp
versions (so nothing is NATed by two tables), resynced by comparing the table whole, kept at
exit as the iptables rules are (flanneld deletes its table). Unlike flanneld's, our rules carry
the comments "flanneld masq" / "flanneld forward" (they match nothing; they name the rules in
``nft list ruleset``) and match kube-proxy's mark as a bit, as the iptables rule does.
Caveats: an nftables ``accept`` ends evaluation in its own base chain only, so ``forward``
cannot overrule a drop in another table's forward chain as the iptables jump at the top of
FORWARD does; and among base chains of one priority (the host's own nat chains, iptables-nft's
among them) the kernel runs them in the order they were registered.

Moving between the two, at the first install (flanneld v0.28.9 does it at start):

* nftables while iptables exists (EnableNFTables): the iptables masquerade goes, so that a host
  moved from iptables mode does not keep NATing through it: every jump to FLANNEL-POSTRTG, the
  chain, and older flannels' "flanneld masq" rules in POSTROUTING (flanneld only flushes the
  chain: an empty chain and its jump left behind would only mislead a reader of
  iptables-save). FLANNEL-FWD and its jump stay: they ACCEPT only what ``forward`` accepts
  too, and on a host whose FORWARD drops (Docker's policy DROP, ufw) they are what keeps the
  overlay forwarded, which the nftables accept cannot do (above). They are no longer resynced;
  ``flannel-udp cleanup`` (or :data:`FWD_REMOVAL`) removes them.
* iptables: the tables ``ip flannel-ipv4`` and ``ip6 flannel-ipv6`` (a flanneld's or ours in
  nftables mode) and ``ip flannel-udp`` (older flannel-udp) are deleted, after our iptables
  rules are in.

IPv6 (``"EnableIPv6": true``), as flanneld v0.28.9: the same rules for IPv6Network and the
lease's IPv6 part, ff00::/8 as the multicast range masquerade leaves alone, each family with
its own :class:`Rules`: ip6tables (the same chain names and comments in ip6tables' nat and
filter tables) or the nftables table ``ip6 flannel-ipv6`` (same chains), chosen as for IPv4
with ``ip6tables`` in the place of ``iptables``. Its lifetime is the IPv4 rules': resynced,
rebuilt for a new IPv6 part, kept at exit, removed by :func:`remove_all`. The iptables-mode
cross-over of the IPv6 rules deletes ``ip6 flannel-ipv6`` only; that of the IPv4 rules all three
tables, so the daemon installs the IPv6 rules first (host/firewall_stack.py). A daemon that
starts without EnableIPv6 removes the IPv6 rules of either tool (:func:`remove_family`) at its
first install: left by a run with it, they would NAT and accept for an IPv6Network this host no
longer serves, until ``flannel-udp cleanup``.
"""
from __future__ import annotations

import ipaddress
import logging
import re
import shlex
import shutil
import subprocess
import threading
from dataclasses import dataclass
from typing import Optional, Union

log = logging.getLogger(__name__)

KUBE_PROXY_MARK = "0x4000/0x4000"
MASQ_COMMENT = "flanneld masq"
FWD_COMMENT = "flanneld forward"
POSTRTG = "FLANNEL-POSTRTG"
FWD = "FLANNEL-FWD"
NAT, FILTER = "nat", "filter"
# table -> (built-in chain holding the jump, our chain, the comment marking our rules)
CHAINS = {NAT: ("POSTROUTING", POSTRTG, MASQ_COMMENT), FILTER: ("FORWARD", FWD, FWD_COMMENT)}

# nftables, flanneld v0.28.9's names (see the module docstring)
NFT_TABLE = "flannel-ipv4"
NFT_TABLE6 = "flannel-ipv6"
NFT_LEGACY_TABLE = "flannel-udp"        # flannel-udp before EnableNFTables
NFT_POSTRTG, NFT_FWD = "postrtg", "forward"
# (family, name): every nftables table a flannel may have left on a host
NFT_TABLES = (("ip", NFT_TABLE), ("ip6", NFT_TABLE6), ("ip", NFT_LEGACY_TABLE))


@dataclass(frozen=True)
class Family:
    """What the IPv4 and the IPv6 rules differ in (the module docstring)."""
    version: int
    iptables: str               # the binary; its -save and -restore sit beside it
    nft_family: str             # nftables' family, also its address match ("ip6 saddr")
    nft_table: str
    multicast: str              # never masqueraded
    network: type

    @property
    def save(self) -> str:
        return f"{self.iptables}-save"

    @property
    def restore(self) -> str:
        return f"{self.iptables}-restore"


V4 = Family(4, "iptables", "ip", NFT_TABLE, "224.0.0.0/4", ipaddress.IPv4Network)
V6 = Family(6, "ip6tables", "ip6", NFT_TABLE6, "ff00::/8", ipaddress.IPv6Network)


def family_of(network) -> Family:
    return V6 if ipaddress.ip_network(str(network), strict=False).version == 6 else V4

# What an operator runs to remove the rules (they stay after exit); --help and the tests use them.
def _chain_removal(binary: str, table: str) -> list[str]:
    base, chain, comment = CHAINS[table]
    return [f'{binary} -t {table} -D {base} -m comment --comment "{comment}" -j {chain}',
            f"{binary} -t {table} -F {chain}", f"{binary} -t {table} -X {chain}"]


def removal_commands(tool: str, fam: Family = V4) -> list[str]:
    """What removes one family's rules installed with `tool` ('iptables' or 'nft')."""
    if tool == "nft":
        return [f"nft delete table {fam.nft_family} {fam.nft_table}"]
    return _chain_removal(fam.iptables, NAT) + _chain_removal(fam.iptables, FILTER)


MASQ_REMOVAL = _chain_removal("iptables", NAT)
FWD_REMOVAL = _chain_removal("iptables", FILTER)
REMOVAL_COMMANDS = {"iptables": removal_commands("iptables"), "nft": removal_commands("nft")}


class MasqError(RuntimeError):
    """Rules could not be installed; the message says what to do."""


def _run(argv, check=True, input=None):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30, input=input)
    if check and p.returncode != 0:
        raise MasqError(f"`{' '.join(argv)}` failed: {p.stderr.strip() or p.stdout.strip()}")
    return p


@dataclass(frozen=True)
class Previous:
    """What subnet.env said before this start (any part may be unknown), for one family."""
    network: Optional[Union[ipaddress.IPv4Network, ipaddress.IPv6Network]] = None
    subnet: Optional[Union[ipaddress.IPv4Network, ipaddress.IPv6Network]] = None
    ipmasq: Optional[bool] = None


# ---------------------------------------------------------------- the rules (pure)
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


def _iptables_random_fully(binary: str = "iptables") -> bool:
    p = _run([binary, "--version"], check=False)
    m = re.search(r"v(\d+)\.(\d+)\.(\d+)", p.stdout)
    return bool(m) and tuple(map(int, m.groups())) >= (1, 6, 2)


def _nft_random_fully(fam: Family = V4) -> bool:
    # -c: the kernel checks the transaction and nothing is committed
    probe = (f"table {fam.nft_family} {fam.nft_table}-probe {{\n  chain p {{\n"
             "    type nat hook postrouting priority srcnat; policy accept;\n"
             "    masquerade fully-random\n  }\n}\n")
    return _run(["nft", "-c", "-f", "-"], check=False, input=probe).returncode == 0


def _nft_tables_present() -> list[tuple[str, str]]:
    """The tables of :data:`NFT_TABLES` that exist, as (family, name)."""
    if not shutil.which("nft"):
        return []
    out = _run(["nft", "list", "tables"], check=False).stdout
    present = {tuple(l.split()[1:3]) for l in out.splitlines() if l.startswith("table ")}
    return [t for t in NFT_TABLES if t in present]


def _delete_nft_tables(tables) -> None:
    """One transaction: none of them goes unless all do."""
    _run(["nft", "-f", "-"], input="".join(f"delete table {f} {n}\n" for f, n in tables))


def _removal(table: str, saved: str, binary: str = "iptables") -> tuple[list[str], list[str]]:
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


def _iptables_tools(fam: Family = V4) -> bool:
    return bool(shutil.which(fam.save) and shutil.which(fam.restore))


class Rules:
    """The rules for one network and the current lease subnet, of one family (that of
    `network`): installed, resynced, kept."""

    def __init__(self, network, subnet, masq: bool, forward: bool, tool: str | None = None,
                 previous: Previous = Previous(), *, random_fully: bool = True,
                 enable_nftables: bool = False):
        self.fam = family_of(network)
        self.network = self.fam.network(network)
        self.subnet = self.fam.network(subnet)
        self.masq = masq
        self.forward = forward
        self.previous = previous
        self.enable_nftables = enable_nftables
        self.tool, why = choose_tool(tool, enable_nftables, self.fam)
        self._lock = threading.Lock()   # one install/resync at a time
        self._stop = threading.Event()
        self._thread = None
        self._installed = False
        self._expected = None           # what the host printed right after the install
        self._stopped_once = False
        self._dirty = False             # a rebuild failed: the next resync rebuilds regardless
        self._crossed = False           # the other tool's leftovers are gone (first install)
        self._random_fully = False
        ipt = self.fam.iptables
        if self.tool is None:
            if masq:
                raise MasqError(missing_tool(self.network, enable_nftables))
            if forward:
                log.warning("%s: FORWARD accept rules for %s not added "
                            "(--iptables-forward-rules); install %s or add them yourself",
                            "nft not found (EnableNFTables is true in the network config)"
                            if enable_nftables else f"{ipt} not found", self.network,
                            "nftables" if enable_nftables else f"iptables (it has {ipt})")
            return
        log.info("Firewall%s: %s", " (IPv6)" if self.fam is V6 else "", why)
        if masq:
            self._random_fully = self._choose_random_fully(random_fully)

    @property
    def binary(self) -> str:
        """The tool by its name (ip6tables for IPv6), for the log."""
        return self.fam.iptables if self.tool == "iptables" else "nft"

    def _choose_random_fully(self, wanted: bool) -> bool:
        word = "--random-fully" if self.tool == "iptables" else "fully-random"
        if not wanted:
            log.info("--ip-masq-fully-random-disable: MASQUERADE without %s", word)
            return False
        if self.tool == "iptables":
            ok = _iptables_random_fully(self.fam.iptables)
            why = f"{self.fam.iptables} is older than 1.6.2"
        else:
            ok, why = _nft_random_fully(self.fam), "the kernel refuses it"
        if not ok:
            log.info("MASQUERADE without %s: %s", word, why)
        return ok

    def _want(self) -> dict:
        want = {}
        if self.masq:
            want[NAT] = in_chain(masq_rules(self.network, self.subnet, self._random_fully))
        if self.forward:
            want[FILTER] = in_chain(forward_rules(self.network))
        return want

    def _recycle(self) -> bool:
        p = self.previous
        changed = ((p.network is not None and p.network != self.network)
                   or (p.subnet is not None and p.subnet != self.subnet))
        if changed:
            log.info("Previous network or subnet (%s, %s) differs from the current one (%s, %s): "
                     "recycling the old rules", p.network, p.subnet, self.network, self.subnet)
        return changed

    def _cross_over(self, clear) -> None:
        """The other tool's leftovers, once, after our rules are in (so that no packet meets
        neither); a failure is only logged: ours are in, the next rebuild tries again."""
        if self._crossed:
            return
        try:
            clear()
        except MasqError as e:
            log.warning("Could not remove the other firewall tool's flannel rules: %s", e)
            return
        self._crossed = True

    # --- iptables (ip6tables for IPv6)
    def _save(self, table) -> str:
        return _run([self.fam.save, "-t", table]).stdout

    def _ipt_install(self):
        want = self._want()
        drop = (NAT,) if not self.masq and self.previous.ipmasq else ()
        tables = set(want) | set(drop)
        saved = {t: self._save(t) for t in tables}
        builtin = {t: chain_rules(saved[t], CHAINS[t][0]) for t in tables}
        if drop and POSTRTG not in saved[NAT]:
            drop = ()
        text = restore_text(want, builtin, self.previous, changed=self._recycle(), drop=drop)
        _run([self.fam.restore, "-w", "5", "--noflush"], input=text)
        if drop:
            log.info("Masquerade is off now (subnet.env said FLANNEL_IPMASQ=true): removed %s",
                     POSTRTG)
        after = {t: self._save(t) for t in want}
        self._expected = {t: chain_rules(after[t], CHAINS[t][1]) for t in want}
        self._cross_over(self._drop_nft_tables)

    def _drop_nft_tables(self):
        # IPv4's go with all of them (the module docstring), IPv6's with its own
        tables = [t for t in _nft_tables_present()
                  if self.fam is V4 or t == (self.fam.nft_family, self.fam.nft_table)]
        if tables:
            _delete_nft_tables(tables)
            log.info("%s mode: deleted the nftables table(s) %s (a flannel in nftables "
                     "mode left them)", self.fam.iptables,
                     ", ".join(f"{f} {n}" for f, n in tables))

    def _ipt_missing(self) -> list[str]:
        return missing_rules(self._expected, {t: self._save(t) for t in self._expected})

    # --- nftables
    @property
    def _nft_name(self) -> str:
        return f"{self.fam.nft_family} {self.fam.nft_table}"

    def _nft_list(self) -> str:
        return _run(["nft", "list", "table", self.fam.nft_family, self.fam.nft_table],
                    check=False).stdout

    def _nft_install(self):
        self._recycle()                 # only logged: the old table goes whole with `delete`
        legacy = (self.fam is V4 and not self._crossed
                  and ("ip", NFT_LEGACY_TABLE) in _nft_tables_present())
        text = nft_ruleset(self.network, self.subnet, self.masq, self.forward,
                           self._random_fully)
        p = _run(["nft", "-f", "-"], check=False, input=text)
        if p.returncode != 0:
            raise MasqError(f"nft could not load the table {self._nft_name}: {p.stderr.strip()}")
        if legacy:
            log.info("Replaced the table ip %s of an older flannel-udp by ip %s",
                     NFT_LEGACY_TABLE, NFT_TABLE)
        self._expected = self._nft_list()
        self._cross_over(self._drop_iptables_masq)

    def _drop_iptables_masq(self):
        fam = self.fam
        if not _iptables_tools(fam):
            return
        nat = _run([fam.save, "-t", NAT], check=False)
        lines, done = _removal(NAT, nat.stdout, fam.iptables) if nat.returncode == 0 else ([], [])
        if lines:
            _run([fam.restore, "-w", "5", "--noflush"],
                 input="\n".join(["*nat"] + lines + ["COMMIT"]) + "\n")
            log.info("nftables mode: removed the %s masquerade so that nothing is NATed "
                     "twice: %s", fam.iptables, "; ".join(done))
        fwd = _run([fam.save, "-t", FILTER], check=False).stdout
        if re.search(rf"^:{FWD} ", fwd, re.M):
            log.info("nftables mode: the %s chain %s and its jump stay (they keep the "
                     "overlay forwarded where FORWARD drops; no longer resynced); to remove "
                     "them: %s", fam.iptables, FWD, "; ".join(_chain_removal(fam.iptables, FILTER)))

    def _nft_missing(self) -> list[str]:
        return [] if self._nft_list() == self._expected else [f"table {self._nft_name}"]

    # --- public
    def install(self) -> None:
        """Build (or rebuild) every rule in one transaction."""
        if self.tool is None or not (self.masq or self.forward):
            return
        with self._lock:
            self._install_locked()
        if self.tool == "iptables":
            parts = (("masquerade (FLANNEL-POSTRTG)", self.masq),
                     ("forward (FLANNEL-FWD)", self.forward))
        else:
            parts = ((f"masquerade (table {self._nft_name}, chain {NFT_POSTRTG})", self.masq),
                     (f"forward (table {self._nft_name}, chain {NFT_FWD})", self.forward))
        what = " and ".join(w for w, on in parts if on)
        log.info("Installed %s rules for %s, subnet %s, with %s (they stay after exit)", what,
                 self.network, self.subnet, self.binary)

    def _install_locked(self):
        self._dirty = True
        if self.tool == "iptables":
            self._ipt_install()
        else:
            self._nft_install()
        self._dirty = False
        self._installed = True
        self.previous = Previous(self.network, self.subnet, self.masq)   # recycled once

    def resync(self) -> bool:
        """Rebuild everything if any rule is missing; True if something was."""
        with self._lock:
            if not self._installed:
                return False
            if self._dirty:
                gone = ["the last rebuild failed"]
            else:
                gone = self._ipt_missing() if self.tool == "iptables" else self._nft_missing()
            if not gone:
                return False
            log.warning("%d %s rule(s) missing (%s); rebuilding them all", len(gone), self.binary,
                        "; ".join(gone[:3]))
            self._install_locked()
            return True

    def start_resync(self, period_s: float) -> None:
        """The resync thread; it runs until :meth:`stop`, across lease moves."""
        if not self._installed or self._thread is not None:
            return

        def loop():
            while not self._stop.wait(period_s):
                try:
                    self.resync()
                except Exception as e:  # keep the daemon up; the next period retries
                    log.warning("%s resync failed: %s", self.binary, e)

        name = "ipmasq6-resync" if self.fam is V6 else "ipmasq-resync"
        self._thread = threading.Thread(target=loop, name=name, daemon=True)
        self._thread.start()

    def update_subnet(self, subnet) -> None:
        """The lease moved to another subnet (of this family): rebuild for it (the resync goes
        on)."""
        subnet = self.fam.network(subnet)
        with self._lock:
            if subnet == self.subnet:
                return
            self.previous = Previous(self.network, self.subnet, self.masq)
            self.subnet = subnet
            if not self._installed:
                return
            try:
                self._install_locked()
            except MasqError as e:      # the lease move goes on; the resync retries
                log.warning("Could not rebuild the %s rules for the new subnet %s (retried every "
                            "resync period): %s", self.binary, subnet, e)
                return
        log.info("Rebuilt the %s rules for the new subnet %s", self.binary, subnet)

    def remove(self) -> None:
        """Remove every rule and chain in one transaction (not done at exit: see stop)."""
        self.stop()
        with self._lock:
            if not self._installed:
                return
            if self.tool == "iptables":
                tables = tuple(self._expected)
                builtin = {t: chain_rules(self._save(t), CHAINS[t][0]) for t in tables}
                _run([self.fam.restore, "-w", "5", "--noflush"],
                     input=restore_text({}, builtin, drop=tables))
            else:
                _run(["nft", "delete", "table", self.fam.nft_family, self.fam.nft_table],
                     check=False)
            self._installed = False
        log.info("Removed the %s rules for %s", self.binary, self.network)

    def stop(self) -> None:
        """Stop the resync at exit. The rules stay (see the module docstring)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._installed and not self._stopped_once:
            self._stopped_once = True
            log.info("Leaving the %s rules in place; to remove them: %s", self.binary,
                     "; ".join(removal_commands(self.tool, self.fam)))


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
    if _iptables_tools(fam):
        restore: list[str] = []
        for table in CHAINS:
            saved = _run([fam.save, "-t", table], check=False).stdout
            lines, said = _removal(table, saved, fam.iptables)
            done += said
            if lines:
                restore += [f"*{table}"] + lines + ["COMMIT"]
        if restore and not dry_run:
            _run([fam.restore, "-w", "5", "--noflush"], input="\n".join(restore) + "\n")
    tables = [t for t in _nft_tables_present() if t[0] == fam.nft_family]
    done += [f"nft delete table {f} {n}" for f, n in tables]
    if tables and not dry_run:
        _delete_nft_tables(tables)
    return done
