"""The host's forwarding sysctls as the daemon reads and says them (host/forwarding.py,
daemon/host_forwarding.py): never written, said once with the fix, reminded, said when on."""
from __future__ import annotations

import logging
import os

from dataplane.daemon.host_forwarding import HostForwarding
from dataplane.host import forwarding


def _proc(tmp_path, **keys):
    for key, value in keys.items():
        path = tmp_path / key.replace(".", "/")
        os.makedirs(path.parent, exist_ok=True)
        path.write_text(f"{value}\n")
    return str(tmp_path)


def test_read_from_proc_sys(tmp_path):
    root = _proc(tmp_path, **{"net.ipv4.ip_forward": 1, "net.ipv6.conf.all.forwarding": 0})
    assert forwarding.enabled(4, root) is True and forwarding.enabled(6, root) is False
    assert forwarding.enabled(6, str(tmp_path / "none")) is None


def test_ipv6_fix_names_accept_ra_first_on_the_interfaces_that_take_advertisements():
    fix = forwarding.fix(6, ["eth1", "eth2"])
    assert fix.index("net.ipv6.conf.eth1.accept_ra=2") < fix.index(
        "net.ipv6.conf.eth2.accept_ra=2") < fix.index("net.ipv6.conf.all.forwarding=1"), fix
    assert fix.startswith("sysctl -w net.ipv6.conf.eth1.accept_ra=2; ") and "on eth1, eth2" in fix
    plain = forwarding.fix(6)
    assert plain.startswith("sysctl -w net.ipv6.conf.all.forwarding=1 (") and "eth" not in plain
    assert forwarding.fix(4, ["eth1"]) == "sysctl -w net.ipv4.ip_forward=1"


def test_said_once_with_the_fix_then_when_on(caplog):
    on = {4: True, 6: False}
    asked = []
    hf = HostForwarding(read=lambda v: on[v], ra_interfaces=lambda: asked.append(1) or ["eth1"])
    with caplog.at_level(logging.INFO, logger="dataplane.daemon.host_forwarding"):
        hf.want(ipv6=True)
        for _ in range(5):
            hf.check()
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1, warned
        msg = warned[0].getMessage()
        assert "net.ipv6.conf.all.forwarding is 0" in msg and "IPv6" in msg, msg
        assert "sysctl -w net.ipv6.conf.eth1.accept_ra=2" in msg and "ip_forward" not in msg, msg
        assert len(asked) == 1          # the interfaces are asked for the first line only
        assert hf.status() == {"ipv4": True, "ipv6": False}
        on[6] = True
        hf.check()
    assert hf.status() == {"ipv4": True, "ipv6": True}
    assert "recovered" in caplog.records[-1].getMessage()


def test_ipv4_only_config_reads_ipv4_alone(caplog):
    read = []
    hf = HostForwarding(read=lambda v: read.append(v) or True)
    hf.want(ipv6=False)
    assert read == [4] and hf.status() == {"ipv4": True}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
