"""A host moved from flanneld v0.28.9 to flannel-udp with v0.28.9's unit file and network config
unchanged (root, namespaces, real etcd and TUN; docs/flannel-compat.md#flanneld-v0-28).

::

      wf ── hf (v0.28.9's leftovers, then flannel-udp) ══ overlay ══ hp (flannel-udp) ── wp

The network config is one a v0.28.9 cluster runs: ``"EnableNFTables": true``. hf's unit file is
below, its ExecStart read the way systemd reads it (continuation lines joined, ``${VAR}`` taken
from its EnvironmentFile) and only the binary replaced: v0.28.9's own flags
(``--ip-masq-fully-random-disable``, ``--ip-blackhole-route``) and a renew margin of 1439 minutes
included. What v0.28.9 leaves on hf after it stops is staged first, from its behaviour as
docs/flannel-compat.md describes it: its lease (found again by PublicIP), its subnet.env, and its
nftables table ``ip flannel-ipv4`` (chains ``postrtg`` and ``forward``, no comments, fully-random
masquerade). flannel-udp must take the same subnet, replace that table by the same table with
v0.28.9's rules and no ``fully-random``, install no iptables masquerade beside it, keep a
blackhole route for the subnet that does not shadow the workload's bridge route, and forward.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest

from dataplane.demo import lab
from tests.conftest import wait_until
from tests.integration.conftest import overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]

NET = "10.5.0.0/16"
SUBNET = "10.5.200.0/24"              # never one a fresh host picks (10.5.1-100)
CONFIG = {"Network": NET, "EnableNFTables": True, "Backend": {"Type": "udp"}}
TTL = 86400
SUBNET_ENV = ("FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.200.1/24\nFLANNEL_MTU=1472\n"
              "FLANNEL_IPMASQ=true\n")

UNIT = r"""[Unit]
Description=flannel overlay (udp backend)
After=network-online.target
Wants=network-online.target

[Service]
Type=notify
EnvironmentFile=/etc/default/flanneld
ExecStart=/usr/local/bin/flanneld \
  --etcd-endpoints=${FLANNEL_ETCD} \
  --etcd-prefix=${FLANNEL_ETCD_PREFIX} \
  --iface=${FLANNEL_IFACE} \
  --subnet-file=${FLANNEL_SUBNET_FILE} \
  --ip-masq \
  --ip-masq-fully-random-disable \
  --ip-blackhole-route \
  --iptables-forward-rules=true \
  --iptables-resync=5 \
  --subnet-lease-renew-margin=1439 \
  --healthz-ip=127.0.0.1 \
  --healthz-port=${FLANNEL_HEALTHZ_PORT}
Restart=always

[Install]
WantedBy=multi-user.target
"""

# What v0.28.9 in nftables mode leaves: its table, its rules (no comments).
V028_TABLE = f"""table ip flannel-ipv4 {{
  chain postrtg {{
    type nat hook postrouting priority srcnat; policy accept;
    meta mark 0x4000 return
    ip saddr {SUBNET} ip daddr {NET} return
    ip saddr {NET} ip daddr {SUBNET} return
    ip saddr != {NET} ip daddr {SUBNET} return
    ip saddr {NET} ip daddr != 224.0.0.0/4 masquerade fully-random
    ip saddr != {NET} ip daddr {NET} masquerade fully-random
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    ip saddr {NET} accept
    ip daddr {NET} accept
  }}
}}
"""
# v0.28.9's masquerade rules in its order, as `nft list` prints them (comments dropped)
WANT_POSTRTG = [
    "meta mark & 0x00004000 == 0x00004000 return",
    f"ip saddr {SUBNET} ip daddr {NET} return",
    f"ip saddr {NET} ip daddr {SUBNET} return",
    f"ip saddr != {NET} ip daddr {SUBNET} return",
    f"ip saddr {NET} ip daddr != 224.0.0.0/4 masquerade",
    f"ip saddr != {NET} ip daddr {NET} masquerade",
]


def exec_start(unit: str, env: dict) -> list[str]:
    """The ExecStart of a unit file as systemd reads it: continuation lines joined, ``${VAR}``
    replaced from the environment file, split into words; the binary left out."""
    text = re.sub(r"\\\n", " ", unit)
    line = next(l for l in text.splitlines() if l.startswith("ExecStart="))
    words = shlex.split(line[len("ExecStart="):])
    return [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], w) for w in words[1:]]


def nft_chain(ov, host, chain: str) -> list[str]:
    """The rules of a chain of ``ip flannel-ipv4``, without handles and comments."""
    r = ov.exec(host, ["nft", "list", "chain", "ip", "flannel-ipv4", chain], check=True)
    rules = []
    for line in r.stdout.splitlines():
        line = re.sub(r'\s+comment "[^"]*"', "", line.strip())
        if line and not line.startswith(("table", "chain", "type", "}")):
            rules.append(line)
    return rules


def blackholes(ov, host) -> list[str]:
    r = ov.exec(host, ["ip", "-4", "route", "show", "type", "blackhole"], check=True)
    return [l.strip() for l in r.stdout.splitlines() if l.strip()]


@pytest.fixture
def ov(engine_kind):
    # overlay_of puts the Overlay's own default config; this test's config goes in before any
    # host starts
    for overlay in overlay_of(engine_kind, ()):
        overlay.put_config(CONFIG)
        overlay.add_host(engine=engine_kind)
        yield overlay


def test_host_moves_from_a_flanneld_v028_unit_file(ov):
    hp = ov.hosts[0]
    hf = ov.add_host(start=False)
    wp = lab.add_workload(ov, hp, "wp", ov.subnet_env(hp))
    wf = None
    try:
        # what v0.28.9 leaves on hf: its lease, subnet.env and nftables table
        net, plen = SUBNET.split("/")
        lease_id = ov.etcdctl("lease", "grant", str(TTL)).stdout.split()[1]
        ov.etcdctl("put", f"--lease={lease_id}", f"{ov.prefix}/subnets/{net}-{plen}",
                   input=json.dumps({"PublicIP": hf.ip, "PublicIPv6": None}).encode())
        with open(ov.subnet_file(hf), "w") as f:
            f.write(SUBNET_ENV)
        r = ov.exec(hf, ["nft", "-f", "-"], input=V028_TABLE)
        assert r.returncode == 0, r.stderr
        wf = lab.add_workload(ov, hf, "wf", ov.subnet_env(hf))

        env = {"FLANNEL_ETCD": ov.etcd_url, "FLANNEL_ETCD_PREFIX": ov.prefix,
               "FLANNEL_IFACE": hf.iface, "FLANNEL_SUBNET_FILE": ov.subnet_file(hf),
               "FLANNEL_HEALTHZ_PORT": str(ov.healthz_port)}
        argv = exec_start(UNIT, env)
        assert "--ip-masq-fully-random-disable" in argv and "--ip-blackhole-route" in argv
        d = ov.start_daemon(hf, args=argv)

        # the same lease, found by PublicIP
        assert ov.subnet(hf).with_prefixlen == SUBNET
        log = d.log_text()
        assert "EnableNFTables is true in the network config" in log, log[-3000:]
        # every flag of the unit taken, none ignored
        assert "ignored" not in "\n".join(l for l in log.splitlines() if "flag" in l), log[-3000:]

        # the table v0.28.9 left, replaced by the same names with v0.28.9's rules, no fully-random
        assert nft_chain(ov, hf, "postrtg") == WANT_POSTRTG
        assert nft_chain(ov, hf, "forward") == [f"ip saddr {NET} accept", f"ip daddr {NET} accept"]
        nat = ov.exec(hf, ["iptables-save", "-t", "nat"], check=True).stdout
        assert "FLANNEL-POSTRTG" not in nat, nat
        tables = ov.exec(hf, ["nft", "list", "tables"], check=True).stdout
        assert "flannel-udp" not in tables, tables

        # the blackhole route of the lease, one, and the workload's bridge route still wins
        holes = blackholes(ov, hf)
        assert [h.split()[1] for h in holes] == [SUBNET], holes
        got = ov.exec(hf, ["ip", "-4", "route", "get", wf.ip], check=True).stdout
        assert "blackhole" not in got and wf.host_iface in got, got
        # (the bridge route covers the subnet; the blackhole takes over when it is gone:
        # tests/integration/test_blackhole_route.py)

        # the workloads reach each other through both engines' hosts, both ways
        for src, dst in ((wf, wp), (wp, wf)):
            wait_until(lambda: src.run(["ping", "-c", "1", "-W", "1", dst.ip]).returncode == 0,
                       15, 0.2, f"{src.name} to ping {dst.name}")
        # ready once its peer watch says it is connected too (with the Python engine a child
        # process reports that every 0.1 s, so the first pings may come before it)
        wait_until(lambda: ov.healthz(hf, "/readyz")[0] == 200, 10, 0.2, "/readyz to say ready")
    finally:
        for w in (wf, wp):
            if w is not None:
                lab.remove_workload(w)
