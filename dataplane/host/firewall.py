"""flanneld's masquerade and forward rules, through iptables or nftables.

``--ip-masq`` (nat table, chain FLANNEL-POSTRTG, jumped to first from
POSTROUTING), for overlay network N and this host's lease subnet S::

    -m mark --mark 0x4000/0x4000        RETURN       kube-proxy's mark: no double NAT
    -s N -d N                           RETURN       overlay to overlay: never NAT
    -s N ! -d 224.0.0.0/4               MASQUERADE   overlay to the world (not multicast)
    ! -s N -d S                         RETURN       the world to our own subnet: keep
    ! -s N -d N                         MASQUERADE   the host to the overlay

MASQUERADE gets ``--random-fully`` where the iptables binary supports it
(>= 1.6.2), as flanneld. ``--iptables-forward-rules`` (filter table, chain
FLANNEL-FWD, appended to FORWARD): ACCEPT ``-s N`` and ``-d N``.

flanneld uses iptables only. When the ``iptables`` binary is missing, this
module writes the same rules as an nftables table ``ip flannel-udp`` (base
chains at priority srcnat-1 / filter-1). Caveat: an nftables ``accept`` ends
evaluation in its own base chain only, so FLANNEL-FWD there cannot override a
drop in another table's FORWARD chain.

Every rule carries a comment so it can be found; :meth:`Rules.remove`
deletes them at exit (flanneld leaves its rules; removing ours keeps a
stopped host clean). :meth:`Rules.resync` re-adds missing rules, every
``--iptables-resync`` seconds from :meth:`Rules.start_resync`.
"""
from __future__ import annotations

import ipaddress
import logging
import re
import shutil
import subprocess
import threading

log = logging.getLogger(__name__)

KUBE_PROXY_MARK = "0x4000/0x4000"
MASQ_COMMENT = "flanneld masq"
FWD_COMMENT = "flanneld forward"
POSTRTG = "FLANNEL-POSTRTG"
FWD = "FLANNEL-FWD"
NFT_TABLE = "flannel-udp"


class MasqError(RuntimeError):
    """Rules could not be installed; the message says what to do."""


def _run(argv, check=True):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise MasqError(f"`{' '.join(argv)}` failed: {p.stderr.strip() or p.stdout.strip()}")
    return p


def masq_rules(network, subnet, random_fully=True) -> list[tuple]:
    """(table, chain, args) in flanneld's order; the first is the jump (inserted)."""
    n = str(ipaddress.IPv4Network(network))
    s = str(ipaddress.IPv4Network(subnet))
    c = ["-m", "comment", "--comment", MASQ_COMMENT]
    masq = ["-j", "MASQUERADE"] + (["--random-fully"] if random_fully else [])
    return [
        ("nat", "POSTROUTING", c + ["-j", POSTRTG]),
        ("nat", POSTRTG, ["-m", "mark", "--mark", KUBE_PROXY_MARK] + c + ["-j", "RETURN"]),
        ("nat", POSTRTG, ["-s", n, "-d", n] + c + ["-j", "RETURN"]),
        ("nat", POSTRTG, ["-s", n, "!", "-d", "224.0.0.0/4"] + c + masq),
        ("nat", POSTRTG, ["!", "-s", n, "-d", s] + c + ["-j", "RETURN"]),
        ("nat", POSTRTG, ["!", "-s", n, "-d", n] + c + masq),
    ]


def forward_rules(network) -> list[tuple]:
    n = str(ipaddress.IPv4Network(network))
    c = ["-m", "comment", "--comment", FWD_COMMENT]
    return [
        ("filter", "FORWARD", c + ["-j", FWD]),
        ("filter", FWD, ["-s", n] + c + ["-j", "ACCEPT"]),
        ("filter", FWD, ["-d", n] + c + ["-j", "ACCEPT"]),
    ]


def nft_ruleset(network, subnet, masq: bool, forward: bool) -> str:
    """The same rules as an nftables table (for hosts without iptables)."""
    n = str(ipaddress.IPv4Network(network))
    s = str(ipaddress.IPv4Network(subnet))
    lines = [f"table ip {NFT_TABLE} {{"]
    if masq:
        lines += [
            "  chain FLANNEL_POSTRTG {",
            "    type nat hook postrouting priority srcnat - 1; policy accept;",
            f'    meta mark & 0x4000 == 0x4000 return comment "{MASQ_COMMENT}"',
            f'    ip saddr {n} ip daddr {n} return comment "{MASQ_COMMENT}"',
            f'    ip saddr {n} ip daddr != 224.0.0.0/4 masquerade fully-random comment "{MASQ_COMMENT}"',
            f'    ip saddr != {n} ip daddr {s} return comment "{MASQ_COMMENT}"',
            f'    ip saddr != {n} ip daddr {n} masquerade fully-random comment "{MASQ_COMMENT}"',
            "  }",
        ]
    if forward:
        lines += [
            "  chain FLANNEL_FWD {",
            "    type filter hook forward priority filter - 1; policy accept;",
            f'    ip saddr {n} accept comment "{FWD_COMMENT}"',
            f'    ip daddr {n} accept comment "{FWD_COMMENT}"',
            "  }",
        ]
    lines.append("}")
    return "\n".join(lines) + "\n"


def detect_tool(prefer=None) -> str | None:
    """'iptables', 'nft' or None. `prefer` forces one (tests)."""
    if prefer:
        return prefer if shutil.which(prefer) else None
    if shutil.which("iptables"):
        return "iptables"
    if shutil.which("nft"):
        return "nft"
    return None


def _iptables_random_fully() -> bool:
    p = _run(["iptables", "--version"], check=False)
    m = re.search(r"v(\d+)\.(\d+)\.(\d+)", p.stdout)
    return bool(m) and tuple(map(int, m.groups())) >= (1, 6, 2)


class Rules:
    """Install, resync and remove the rules for one (network, subnet)."""

    def __init__(self, network, subnet, masq: bool, forward: bool, tool: str | None = None):
        self.network = ipaddress.IPv4Network(network)
        self.subnet = ipaddress.IPv4Network(subnet)
        self.masq = masq
        self.forward = forward
        self.tool = detect_tool(tool)
        self._lock = threading.Lock()   # guards install/remove/resync
        self._stop = threading.Event()
        self._thread = None
        self._installed = False
        if self.tool is None:
            if masq:
                raise MasqError("--ip-masq needs iptables or nftables and neither `iptables` nor "
                                "`nft` was found: install one (apt-get install iptables) or run "
                                "without --ip-masq")
            if forward:
                log.warning("iptables not found: FORWARD accept rules for %s not added "
                            "(--iptables-forward-rules); install iptables or add them yourself",
                            self.network)
        self._random_fully = self.tool == "iptables" and _iptables_random_fully()

    # --- iptables
    def _ipt_rules(self):
        rules = []
        if self.masq:
            rules += masq_rules(self.network, self.subnet, self._random_fully)
        if self.forward:
            rules += forward_rules(self.network)
        return rules

    @staticmethod
    def _ipt(table, *args, check=True):
        return _run(["iptables", "-w", "5", "-t", table, *args], check=check)

    def _ipt_present(self) -> bool:
        return all(self._ipt(t, "-C", ch, *a, check=False).returncode == 0
                   for t, ch, a in self._ipt_rules())

    def _ipt_install(self):
        for table, chain in {(t, POSTRTG if t == "nat" else FWD) for t, _, _ in self._ipt_rules()}:
            self._ipt(table, "-N", chain, check=False)   # exists already: fine
        for table, chain, args in self._ipt_rules():
            if self._ipt(table, "-C", chain, *args, check=False).returncode == 0:
                continue
            if chain == "POSTROUTING":
                self._ipt(table, "-I", chain, "1", *args)  # before anything else (as flanneld)
            else:
                self._ipt(table, "-A", chain, *args)

    def _ipt_remove(self):
        for table, chain, args in self._ipt_rules():
            if chain in ("POSTROUTING", "FORWARD"):
                while self._ipt(table, "-D", chain, *args, check=False).returncode == 0:
                    pass
        if self.masq:
            self._ipt("nat", "-F", POSTRTG, check=False)
            self._ipt("nat", "-X", POSTRTG, check=False)
        if self.forward:
            self._ipt("filter", "-F", FWD, check=False)
            self._ipt("filter", "-X", FWD, check=False)

    # --- nftables
    def _nft_present(self) -> bool:
        return _run(["nft", "list", "table", "ip", NFT_TABLE], check=False).returncode == 0

    def _nft_install(self):
        _run(["nft", "delete", "table", "ip", NFT_TABLE], check=False)
        p = subprocess.run(["nft", "-f", "-"], input=nft_ruleset(self.network, self.subnet,
                                                                  self.masq, self.forward),
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise MasqError(f"nft could not load the flannel-udp table: {p.stderr.strip()}")

    def _nft_remove(self):
        _run(["nft", "delete", "table", "ip", NFT_TABLE], check=False)

    # --- public
    def install(self) -> None:
        if self.tool is None or not (self.masq or self.forward):
            return
        with self._lock:
            if self.tool == "iptables":
                self._ipt_install()
            else:
                self._nft_install()
            self._installed = True
        what = " and ".join(w for w, on in (("masquerade (FLANNEL-POSTRTG)", self.masq),
                                           ("forward (FLANNEL-FWD)", self.forward)) if on)
        log.info("Installed %s rules for %s with %s", what, self.network, self.tool)

    def resync(self) -> bool:
        """Re-add rules that someone removed; True if anything was missing."""
        if not self._installed:
            return False
        with self._lock:
            present = self._ipt_present() if self.tool == "iptables" else self._nft_present()
            if present:
                return False
            log.warning("Some %s rules for %s were missing; adding them again", self.tool,
                        self.network)
            if self.tool == "iptables":
                self._ipt_remove()
                self._ipt_install()
            else:
                self._nft_install()
            return True

    def start_resync(self, period_s: float) -> None:
        if not self._installed or self._thread is not None:
            return

        def loop():
            while not self._stop.wait(period_s):
                try:
                    self.resync()
                except Exception as e:  # keep the daemon up; the next period retries
                    log.warning("iptables resync failed: %s", e)

        self._thread = threading.Thread(target=loop, name="ipmasq-resync", daemon=True)
        self._thread.start()

    def remove(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not self._installed:
            return
        with self._lock:
            if self.tool == "iptables":
                self._ipt_remove()
            else:
                self._nft_remove()
            self._installed = False
        log.info("Removed the %s rules for %s", self.tool, self.network)

    def update_subnet(self, subnet) -> None:
        """After a re-acquired lease with a new subnet: swap the rules."""
        subnet = ipaddress.IPv4Network(subnet)
        if subnet == self.subnet:
            return
        installed = self._installed
        if installed:
            self.remove()
            self._stop.clear()
            self._thread = None
        self.subnet = subnet
        if installed:
            self.install()
