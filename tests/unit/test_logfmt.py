"""The daemon's log lines (dataplane/host/logfmt.py): syslog priority prefixes when stderr is the
journal's stream, text with a zone in its time, json objects with the event's fields."""
from __future__ import annotations

import datetime
import io
import json
import logging
import os
import re
import sys
import time
from ipaddress import IPv4Network

import pytest

from dataplane.cli import build_parser, flanneld_flags
from dataplane.host import logfmt

TEXT_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"


def record(level=logging.WARNING, msg="Lease %s lost", args=("10.5.1.0/24",), extra=None,
           exc_info=None) -> logging.LogRecord:
    rec = logging.getLogger("dataplane.test").makeRecord(
        "dataplane.test", level, __file__, 1, msg, args, exc_info, extra=extra)
    return rec


def failed() -> logging.LogRecord:
    try:
        raise ValueError("boom")
    except ValueError:
        return record(logging.ERROR, "the watch failed", (), exc_info=sys.exc_info())


@pytest.mark.parametrize("level,prio", [(logging.CRITICAL, 2), (logging.ERROR, 3),
                                        (logging.WARNING, 4), (logging.INFO, 6),
                                        (logging.DEBUG, 7), (5, 7)])
def test_journal_lines_start_with_the_syslog_priority_and_have_no_time(level, prio):
    line = logfmt.TextFormatter(journal=True).format(record(level))
    assert line == f"<{prio}>{logging.getLevelName(level)} dataplane.test: Lease 10.5.1.0/24 lost"
    assert logfmt.JsonFormatter(journal=True).format(record(level)).startswith(f"<{prio}>{{")


def test_every_line_of_a_traceback_carries_the_priority():
    """A line without a prefix would get the unit's default priority (info) in the journal."""
    lines = logfmt.TextFormatter(journal=True).format(failed()).split("\n")
    assert len(lines) > 3 and all(line.startswith("<3>") for line in lines), lines
    assert lines[-1] == "<3>ValueError: boom"


def test_text_time_has_the_zone(monkeypatch):
    monkeypatch.setenv("TZ", "IST-5:30")            # a zone whose offset is not a whole hour
    time.tzset()
    try:
        rec = record()
        line = logfmt.TextFormatter().format(rec)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert re.match(TEXT_TIME + " WARNING dataplane.test: Lease 10.5.1.0/24 lost$", line), line
    stamp = datetime.datetime.fromisoformat(line[:29])
    assert stamp.utcoffset() == datetime.timedelta(hours=5, minutes=30)
    assert abs(stamp.timestamp() - rec.created) < 0.001


def test_json_is_one_object_with_time_zone_level_logger_message_and_fields():
    rec = record(extra={"subnet": "10.5.1.0/24", "public_ip": "192.168.1.2", "reason": "gone",
                        "network": IPv4Network("10.5.0.0/16")})
    obj = json.loads(logfmt.JsonFormatter().format(rec))
    stamp = datetime.datetime.fromisoformat(obj.pop("time"))
    assert stamp.tzinfo is not None and abs(stamp.timestamp() - rec.created) < 0.001
    assert obj == {"level": "warning", "logger": "dataplane.test",
                   "message": "Lease 10.5.1.0/24 lost", "subnet": "10.5.1.0/24",
                   "public_ip": "192.168.1.2", "reason": "gone", "network": "10.5.0.0/16"}


def test_json_keeps_a_traceback_inside_its_one_line():
    text = logfmt.JsonFormatter().format(failed())
    assert "\n" not in text
    obj = json.loads(text)
    assert obj["level"] == "error" and obj["exception"].endswith("ValueError: boom")


def test_the_journal_is_recognised_by_device_and_inode(tmp_path):
    with open(tmp_path / "a", "w") as a, open(tmp_path / "b", "w") as b:
        st = os.fstat(a.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert logfmt.journal_stream(a, env)
        assert not logfmt.journal_stream(b, env)      # stderr redirected since: not the journal
        assert not logfmt.journal_stream(a, {})
        assert not logfmt.journal_stream(a, {"JOURNAL_STREAM": "garbage"})
        assert not logfmt.journal_stream(io.StringIO(), env)


def test_setup_formats_the_stderr_handler_only():
    root = logging.getLogger()
    saved = root.handlers[:]
    stream, capture = logging.StreamHandler(io.StringIO()), logging.Handler()
    root.handlers[:] = [stream, capture]
    try:
        logfmt.setup("json")
        assert isinstance(stream.formatter, logfmt.JsonFormatter)
        assert capture.formatter is None
    finally:
        root.handlers[:] = saved


def test_the_peer_watch_child_forwards_the_fields():
    """Its records are written by the daemon's handlers: the fields must cross the link."""
    from dataplane.control.peer_process import _Forward
    fwd = _Forward()
    fwd.emit(record(extra={"subnet": IPv4Network("10.5.1.0/24"), "reason": "bad"}))
    kind, attrs = fwd.queue.get_nowait()
    rec = logging.makeLogRecord(attrs)
    assert kind == "log" and logfmt.fields(rec) == {"subnet": "10.5.1.0/24", "reason": "bad"}
    assert json.loads(logfmt.JsonFormatter().format(rec))["subnet"] == "10.5.1.0/24"


def test_the_flag_and_its_variable():
    def resolve(argv, env=None):
        return flanneld_flags.resolve(build_parser().parse_args(["run", *argv]), env or {})

    assert resolve([]).log_format == "text"
    assert resolve(["-log-format=json"]).log_format == "json"
    assert resolve([], {"FLANNELD_LOG_FORMAT": "json"}).log_format == "json"
    with pytest.raises(SystemExit):
        resolve(["--log-format", "xml"])
