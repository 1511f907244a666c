"""The daemon's log lines for journald and log pipelines (root, namespaces, a real etcd; the last
test a real systemd with journald: tests/integration/systemd_box.py).

* stderr is the journal's stream (``$JOURNAL_STREAM`` names its device and inode, which is all
  the daemon reads): every line starts with its syslog priority and has no time of its own;
* ``--log-format json``: every line is one JSON object, the lease and peer events with their
  fields (subnet, public_ip, reason);
* under systemd with journald: ``journalctl -p warning -u flannel-udp.service`` shows the
  warnings and nothing below them.

The peers see a lease key holding garbage (a WARNING, written by the peer watch's child process
with the Python engine) and the other host's lease (``Subnet added: <subnet>``, flanneld's words,
INFO).
"""
from __future__ import annotations

import datetime
import json
import os
import re

import pytest

from tests.conftest import require, wait_until
from tests.integration.conftest import overlay_of

pytestmark = [pytest.mark.root, pytest.mark.etcd]

BAD_KEY = "subnets/10.5.250.0-24"
# a line as the journal wants it: the priority, the level, the logger, the message; no time
JOURNAL_LINE = re.compile(r"<([2-7])>(CRITICAL|ERROR|WARNING|INFO|DEBUG) [\w.]+: ")


@pytest.fixture(scope="module")
def ov():
    """h0 (the peer everyone sees) and a garbage lease key, in one overlay for the module."""
    for overlay in overlay_of("c", ("c",)):
        overlay.put(BAD_KEY, "not json")
        yield overlay


def _log_file(ov, h) -> str:
    """The daemon's log file (its stdout and stderr), made before it starts: its inode is what
    JOURNAL_STREAM names."""
    path = os.path.join(os.path.dirname(ov.subnet_file(h)), "daemon.log")
    open(path, "wb").close()                # a host of the same name may have run before
    return path


def _stream_of(path: str) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def _run(ov, engine: str, args=(), env=None):
    """A daemon on a new host until it has logged the garbage key and h0's lease; its log lines."""
    h = ov.add_host(start=False)
    path = _log_file(ov, h)
    env = {k: (_stream_of(path) if v is None else v) for k, v in (env or {}).items()}
    try:
        ov.start_daemon(h, engine=engine, args=args, env=env)
        peer = str(ov.subnet(ov.hosts[0]))
        d = ov.daemon(h)
        wait_until(lambda: "Skipping subnet lease" in d.log_text() and
                   f"Subnet added: {peer}" in d.log_text(), 10, 0.05,
                   lambda: f"the garbage key and {peer} in the log: {d.log_text()[-2000:]}")
        subnet = str(ov.subnet(h))
    finally:
        ov.remove_host(h)
    with open(path, errors="replace") as f:
        return f.read().splitlines(), peer, (subnet, h.ip)


def test_on_the_journal_stream_each_line_carries_its_priority_and_no_time(ov):
    lines, peer, _ = _run(ov, "c", ["--vmodule", "peers=2"], {"JOURNAL_STREAM": None})
    assert lines and all(JOURNAL_LINE.match(line) for line in lines), lines
    assert any(line.startswith("<4>WARNING ") and "--vmodule is accepted for compatibility "
               "and ignored" in line for line in lines), lines
    assert any(line.startswith(f"<6>INFO dataplane.daemon.peer_log: Subnet added: {peer} ")
               for line in lines), lines
    assert any(line.startswith("<4>WARNING ") and "Skipping subnet lease" in line
               for line in lines), lines


def test_json_lines_each_parse_and_carry_the_events_fields(ov):
    """With the Python engine, whose peer watch runs in a child process: its records cross to
    the daemon with their fields. JOURNAL_STREAM names another file (stderr redirected since
    systemd started the process): no priority prefix."""
    elsewhere = _stream_of(os.path.join(os.path.dirname(ov.subnet_file(ov.hosts[0])),
                                        "subnet.env"))
    lines, peer, subnet = _run(ov, "python", ["--log-format", "json"],
                               {"JOURNAL_STREAM": elsewhere})
    objs = [json.loads(line) for line in lines]          # every line: one object
    for o in objs:
        assert {"time", "level", "logger", "message"} <= o.keys(), o
        assert datetime.datetime.fromisoformat(o["time"]).tzinfo is not None, o
    added = [o for o in objs if o["message"].startswith(f"Subnet added: {peer} ")]
    assert added and added[0]["subnet"] == peer and added[0]["level"] == "info", objs
    assert added[0]["public_ip"] == ov.hosts[0].ip, added
    skipped = [o for o in objs if o.get("event") == "lease_skipped"]
    assert skipped and skipped[0]["level"] == "warning", objs
    assert skipped[0]["key"].endswith(BAD_KEY) and skipped[0]["reason"], skipped
    # a new subnet, or the one a host of the same name had before (its subnet.env is there)
    acquired = [o for o in objs if o.get("event") in ("lease_allocated", "lease_reused")]
    assert [(o["subnet"], o["public_ip"]) for o in acquired] == [subnet], objs


def test_journalctl_priority_filter_under_systemd(ov):
    """The unit as shipped (its output to the journal) in a box with journald."""
    from tests.integration import systemd_box
    from tests.integration.systemd_unit import UNIT, Unit
    require(systemd_box.missing() is None, f"a systemd box: {systemd_box.missing()}")
    h = ov.add_host(start=False)
    peer = str(ov.subnet(ov.hosts[0]))
    try:
        with systemd_box.SystemdBox() as box:
            box.start_journal()
            u = Unit(ov, h, box, "c")
            u.options("--queues 1 --vmodule peers=2")
            with open(os.path.join(box.units, f"{UNIT}.d", "zz-journal.conf"), "w") as f:
                f.write("[Service]\nStandardOutput=journal\nStandardError=inherit\n")
            box.systemctl("daemon-reload")
            try:
                u.systemctl("start")

                def entries(*args):
                    out = box.journalctl("-u", UNIT, "-o", "json", *args)
                    return [json.loads(line) for line in out.splitlines()]

                wait_until(lambda: any(f"Subnet added: {peer}" in e.get("MESSAGE", "")
                                       for e in entries()), 10, 0.1, "h0's lease in the journal")
                wait_until(lambda: any("Skipping subnet lease" in e.get("MESSAGE", "")
                                       for e in entries()), 10, 0.1, "the garbage key")
            finally:
                u.systemctl("stop", check=False)
            # the daemon's lines, not systemd's about the unit
            ours = [e for e in entries() if e.get("_SYSTEMD_UNIT") == UNIT]
            warned = [e for e in entries("-p", "warning") if e.get("_SYSTEMD_UNIT") == UNIT]
    finally:
        ov.tb.remove_host(h)
        for subnet, ip in ov.leases().items():
            if ip == h.ip:
                ov.delete_lease(subnet)
    for e in ours:       # journald took the prefix as the priority; the journal has the time
        assert not e["MESSAGE"].startswith("<") and not re.match(r"\d{4}-", e["MESSAGE"]), e
    assert {e["PRIORITY"] for e in ours} >= {"4", "6"}, ours
    assert any(f"Subnet added: {peer}" in e["MESSAGE"] for e in ours)
    assert warned and all(int(e["PRIORITY"]) <= 4 for e in warned), warned
    said = [e["MESSAGE"] for e in warned]
    assert any("--vmodule is accepted for compatibility and ignored" in m for m in said), said
    assert any("Skipping subnet lease" in m for m in said), said
    assert not any("Subnet added" in m for m in said), said
