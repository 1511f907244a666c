"""flanneld's masquerade and forward rules of one family on this host, through iptables or
nftables, with their lifetime: :class:`Rules`. The rules themselves are host/firewall_rules.py's
(iptables) and host/firewall_nft.py's (nftables), the choice of tool and ``flannel-udp cleanup``
host/firewall_tools.py's, both families together host/firewall_stack.py's.

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

import logging
import re
import threading

from .family import V4, V6, Family, family_of
from .firewall_nft import NFT_FWD, NFT_LEGACY_TABLE, NFT_POSTRTG, NFT_TABLE, nft_ruleset
from .firewall_rules import (CHAINS, FILTER, FWD, FWD_REMOVAL, MASQ_REMOVAL, NAT, POSTRTG,
                             REMOVAL_COMMANDS, Previous, chain_removal, chain_rules, forward_rules,
                             in_chain, masq_rules, missing_rules, removal_commands,
                             removal_lines, restore_text)
from .firewall_tools import (MasqError, choose_tool, delete_nft_tables, detect_tool,
                             iptables_random_fully, iptables_tools, missing_tool,
                             nft_random_fully, nft_tables_present, remove_all, remove_family, run)

log = logging.getLogger(__name__)


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
            ok = iptables_random_fully(self.fam.iptables)
            why = f"{self.fam.iptables} is older than 1.6.2"
        else:
            ok, why = nft_random_fully(self.fam), "the kernel refuses it"
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
        return run([self.fam.save, "-t", table]).stdout

    def _ipt_install(self):
        want = self._want()
        drop = (NAT,) if not self.masq and self.previous.ipmasq else ()
        tables = set(want) | set(drop)
        saved = {t: self._save(t) for t in tables}
        builtin = {t: chain_rules(saved[t], CHAINS[t][0]) for t in tables}
        if drop and POSTRTG not in saved[NAT]:
            drop = ()
        text = restore_text(want, builtin, self.previous, changed=self._recycle(), drop=drop)
        run([self.fam.restore, "-w", "5", "--noflush"], input=text)
        if drop:
            log.info("Masquerade is off now (subnet.env said FLANNEL_IPMASQ=true): removed %s",
                     POSTRTG)
        after = {t: self._save(t) for t in want}
        self._expected = {t: chain_rules(after[t], CHAINS[t][1]) for t in want}
        self._cross_over(self._drop_nft_tables)

    def _drop_nft_tables(self):
        # IPv4's go with all of them (the module docstring), IPv6's with its own
        tables = [t for t in nft_tables_present()
                  if self.fam is V4 or t == (self.fam.nft_family, self.fam.nft_table)]
        if tables:
            delete_nft_tables(tables)
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
        return run(["nft", "list", "table", self.fam.nft_family, self.fam.nft_table],
                    check=False).stdout

    def _nft_install(self):
        self._recycle()                 # only logged: the old table goes whole with `delete`
        legacy = (self.fam is V4 and not self._crossed
                  and ("ip", NFT_LEGACY_TABLE) in nft_tables_present())
        text = nft_ruleset(self.network, self.subnet, self.masq, self.forward,
                           self._random_fully)
        p = run(["nft", "-f", "-"], check=False, input=text)
        if p.returncode != 0:
            raise MasqError(f"nft could not load the table {self._nft_name}: {p.stderr.strip()}")
        if legacy:
            log.info("Replaced the table ip %s of an older flannel-udp by ip %s",
                     NFT_LEGACY_TABLE, NFT_TABLE)
        self._expected = self._nft_list()
        self._cross_over(self._drop_iptables_masq)

    def _drop_iptables_masq(self):
        fam = self.fam
        if not iptables_tools(fam):
            return
        nat = run([fam.save, "-t", NAT], check=False)
        lines, done = (removal_lines(NAT, nat.stdout, fam.iptables) if nat.returncode == 0
                       else ([], []))
        if lines:
            run([fam.restore, "-w", "5", "--noflush"],
                 input="\n".join(["*nat"] + lines + ["COMMIT"]) + "\n")
            log.info("nftables mode: removed the %s masquerade so that nothing is NATed "
                     "twice: %s", fam.iptables, "; ".join(done))
        fwd = run([fam.save, "-t", FILTER], check=False).stdout
        if re.search(rf"^:{FWD} ", fwd, re.M):
            log.info("nftables mode: the %s chain %s and its jump stay (they keep the "
                     "overlay forwarded where FORWARD drops; no longer resynced); to remove "
                     "them: %s", fam.iptables, FWD, "; ".join(chain_removal(fam.iptables, FILTER)))

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
                run([self.fam.restore, "-w", "5", "--noflush"],
                     input=restore_text({}, builtin, drop=tables))
            else:
                run(["nft", "delete", "table", self.fam.nft_family, self.fam.nft_table],
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



# What callers outside the firewall read here (the daemon, the CLI's --help and cleanup).
__all__ = ["FWD_REMOVAL", "Family", "MASQ_REMOVAL", "MasqError", "Previous", "REMOVAL_COMMANDS",
           "Rules", "V4", "V6", "choose_tool", "detect_tool", "family_of", "forward_rules",
           "masq_rules", "missing_tool", "nft_ruleset", "remove_all", "remove_family"]
