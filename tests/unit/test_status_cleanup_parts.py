"""The parts of `flannel-udp status` and `cleanup` that need no root: the screen drawn from a
status document, how a daemon's command line is recognised, the socket and TUN checks."""
from __future__ import annotations

import logging
import socket

from dataplane.cli.cleanup import attached, is_daemon_command, listening, tun_devices
from dataplane.cli.status import render
from dataplane.daemon.status import WARNINGS_KEPT, WarningRing

NOT_READY = {
    "pid": 42, "version": "0.1.0", "time": 1000.0, "ready": False,
    "checks": {"lease": None, "engine": None, "etcd_watch": None,
               "subnet_file": "/run/flannel/subnet.env does not name the lease 10.5.3.0/24"},
    "lease": {"subnet": "10.5.3.0/24", "public_ip": "192.0.2.1", "expiration": 1000.0 + 7200,
              "reservation": False},
    "subnet_file": {"path": "/run/flannel/subnet.env", "current": False,
                    "problem": "writing it failed", "write_failures": 3},
    "engine": {"engine": "c", "why": "auto: the C engine is built", "accept_from": "leases"},
    "tun": "flannel0", "queues": 2, "offloads": {"udp_gso": True, "udp_gro": False},
    "peers": 7,
    "etcd": {"endpoints": ["http://192.0.2.9:2379"], "prefix": "/coreos.com/network",
             "watches": {"subnets": {"connected": False, "reconnects": 4}}},
    "drops": {"no_route": 0, "bad_source": 5}, "packets": {"udp_rx": 9},
    "warnings": [{"time": 990.0, "level": "ERROR", "logger": "dataplane.daemon",
                  "message": "Writing the subnet file failed"}],
}


def test_the_screen_names_what_fails_and_what_matters():
    text = render(NOT_READY)
    lines = text.splitlines()
    assert lines[0].endswith("NOT READY")
    assert "  [-] subnet_file: /run/flannel/subnet.env does not name the lease" in text
    assert "[-] lease" not in text                      # passing checks are not listed
    assert "10.5.3.0/24 (PublicIP 192.0.2.1)" in text and "(in 2h00m)" in text
    assert "STALE: writing it failed (3 failed write(s) since start)" in text
    assert "subnets NOT CONNECTED (4 reconnect(s))" in text
    assert "bad_source 5" in text and "no_route" not in text   # only the drops that happened
    assert "udp_gso" in text and "udp_gro" not in text
    assert "ERROR dataplane.daemon: Writing the subnet file failed" in text


def test_the_screen_of_a_daemon_that_just_started():
    text = render({"pid": 1, "ready": False, "checks": {}, "lease": None, "engine": None,
                   "time": 1.0})
    assert "NOT READY" in text and "nothing to report yet" in text
    assert "none yet" in text and "not started yet" in text and "last warnings: none" in text


def test_an_expired_lease_says_so():
    doc = dict(NOT_READY, time=1000.0 + 7200 + 90)
    assert "EXPIRED" in render(doc) and "(1m30s ago)" in render(doc)


def test_a_dual_stack_lease_shows_its_ipv6_part_underlay_address_and_route():
    assert "ipv6 subnet" not in render(NOT_READY)
    doc = dict(NOT_READY, lease=dict(NOT_READY["lease"], ipv6_subnet="fc00:5:0:3::/64"),
               ipv6={"tun_address": "fc00:5:0:3::/128", "route": "fc00:5::/56"}, tun="flannel0")
    assert ("fc00:5:0:3::/64 (no PublicIPv6: over the IPv4 underlay); flannel0 has "
            "fc00:5:0:3::/128, route fc00:5::/56 dev flannel0") in render(doc)
    doc["lease"]["public_ipv6"] = "fd00:99::1"
    assert "fc00:5:0:3::/64 (PublicIPv6 fd00:99::1: the IPv6 underlay" in render(doc)
    # the peers with a routed IPv6 part, and each path's IPv6 packets, beside the totals
    assert "with an IPv6 part" not in render(doc) and "(IPv6" not in render(doc)
    doc.update(peers_ipv6=3, packets={"udp_rx": 9, "tun_tx": 4}, packets_ipv6={"udp_rx": 2,
                                                                               "tun_tx": 0})
    text = render(doc)
    assert "7 (3 with an IPv6 part routed)" in text and "tun_tx 4, udp_rx 9 (IPv6 2)" in text


def test_the_host_forwarding_row_says_a_family_that_is_off():
    assert "forwarding" not in render(NOT_READY)        # not checked yet (an older daemon too)
    row = [line for line in render(dict(NOT_READY, host_forwarding={"ipv4": True, "ipv6": False}))
           .splitlines() if line.lstrip().startswith("forwarding")]
    assert len(row) == 1 and "IPv4 on, IPv6 OFF (the pods' packets" in row[0], row
    text = render(dict(NOT_READY, host_forwarding={"ipv4": True}))
    assert "IPv4 on" in text and "OFF" not in text and "the pods' packets" not in text


def test_daemon_command_lines():
    assert is_daemon_command(["/usr/bin/python3", "/opt/flannel-udp/bin/flannel-udp", "run",
                              "-iface=eth1"])
    assert is_daemon_command(["python3", "-m", "dataplane", "run"])
    assert is_daemon_command(["python3", "-c", "import sys\nfrom dataplane.cli import main\n",
                              "run", "--etcd-endpoints", "http://x:2379"])
    assert not is_daemon_command(["/opt/flannel-udp/bin/flannel-udp", "cleanup", "run"])
    assert not is_daemon_command(["/opt/flannel-udp/bin/flannel-udp", "status"])
    assert not is_daemon_command(["vim", "run"])
    assert not is_daemon_command(["flanneld", "-iface=eth1"])


def test_listening_is_read_from_the_kernel_not_from_the_file(tmp_path):
    path = str(tmp_path / "s.sock")
    assert not listening(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(path)
        assert not listening(path)          # bound, not listening: a dead daemon's file
        s.listen(1)
        assert listening(path)
    finally:
        s.close()
    assert not listening(path) and not listening("")


def test_only_tun_devices_named_flannel_are_ours(tmp_path):
    for name, flags in (("flannel0", "0x1801"), ("flannel1", "0x1001"), ("flannelx", "0x1801"),
                        ("tun0", "0x1801")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tun_flags").write_text(flags + "\n")
    (tmp_path / "flannel2").mkdir()                 # not a TUN device (no tun_flags)
    assert tun_devices(str(tmp_path)) == {"flannel0": True, "flannel1": False}


def test_a_tun_with_carrier_is_held_by_a_process(tmp_path):
    for name, carrier in (("flannel0", "1"), ("flannel1", "0")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "carrier").write_text(carrier + "\n")
    (tmp_path / "flannel2").mkdir()                 # down: no carrier to read
    assert [attached(n, str(tmp_path)) for n in ("flannel0", "flannel1", "flannel2")] == \
        [True, False, False]


def test_the_warning_ring_keeps_the_last_warnings_only():
    ring = WarningRing()
    log = logging.getLogger("fu-test-ring")
    log.propagate = False
    log.addHandler(ring)
    try:
        log.info("not kept")
        for i in range(WARNINGS_KEPT + 3):
            log.warning("warning %d", i)
        log.error("the last")
    finally:
        log.removeHandler(ring)
    got = ring.records()
    assert len(got) == WARNINGS_KEPT
    assert got[-1]["message"] == "the last" and got[-1]["level"] == "ERROR"
    assert got[0]["message"] == f"warning {4}"
    assert all("not kept" != r["message"] for r in got)


def test_status_says_when_the_kernel_path_runs_without_a_daemon():
    from dataplane.cli.status import render_kernel_paths
    desc = {"dir": "/sys/fs/bpf/flannel-udp/flannel0", "own_ip": "192.168.77.1", "port": 8285,
            "programs": {"fu_egress": {"id": 7, "tag": "1fa8", "loaded_at": 1000.0,
                                       "attached": "flannel0"},
                         "fu_ingress": {"id": 8, "tag": "669d", "loaded_at": 1000.0,
                                        "attached": "eth1"}},
            "counters": {"udp_tx_packets": 5, "tun_tx_packets": 4, "drop_bad_source": 2,
                         "tx_pass_no_route": 1, "rx_pass_gso": 0}}
    text = render_kernel_paths([desc], now=1130.0)
    assert "RUNNING WITHOUT A DAEMON" in text
    assert "fu_egress   on flannel0" in text and "(2m10s ago)" in text and "tag 1fa8" in text
    assert "udp_tx_packets 5, tun_tx_packets 4" in text and "drop_bad_source 2" in text
    assert "tx_pass_no_route 1 (no engine reads them now)" in text and "rx_pass_gso" not in text
    for p in desc["programs"].values():
        p["attached"] = None
    assert "on no hook" in render_kernel_paths([desc], now=1130.0)
    assert "cannot read it (no libbpf)" in render_kernel_paths([{"dir": "/x", "error": "no libbpf"}])


def test_cleanup_reads_the_units_environment_file_under_its_own_settings(tmp_path):
    """`cleanup --env-file` (the package's removal) finds what the unit's daemon was given
    there: FLANNELD_* variables and the flags of FLANNEL_UDP_OPTIONS; its own flags and
    environment come first; a missing file is none."""
    from dataplane.cli import build_parser, flanneld_flags
    from dataplane.cli.cleanup import with_env_file
    env_file = tmp_path / "flannel-udp"
    env_file.write_text("# a comment\nFLANNELD_BPF_PINS='/sys/fs/bpf/mine'\n"
                        "FLANNELD_SUBNET_FILE=/run/x/subnet.env\nOTHER=1\n"
                        "FLANNEL_UDP_OPTIONS=--healthz-port 0 --status-socket=/run/x/s.sock\n")

    def resolved(*argv, environ=None):
        args = build_parser().parse_args(["cleanup", "--kernel-path", *argv])
        args, env = with_env_file(args, environ or {})
        return flanneld_flags.resolve(args, env)

    opts = resolved(f"--env-file={env_file}")
    assert (opts.bpf_pins, opts.subnet_file, opts.status_socket) == (
        "/sys/fs/bpf/mine", "/run/x/subnet.env", "/run/x/s.sock")
    opts = resolved(f"--env-file={env_file}", "--status-socket=/run/y.sock",
                    environ={"FLANNELD_BPF_PINS": "/sys/fs/bpf/env"})
    assert (opts.bpf_pins, opts.status_socket) == ("/sys/fs/bpf/env", "/run/y.sock")
    assert resolved(f"--env-file={tmp_path / 'none'}").bpf_pins == "/sys/fs/bpf/flannel-udp"
