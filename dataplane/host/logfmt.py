"""How the daemon's log lines look on its stderr: text, or one JSON object per line.

* text (the default): ``<time with zone> LEVEL logger: message``, for a terminal or a file;
* under systemd, when stderr is the journal's stream (``$JOURNAL_STREAM`` names its device and
  inode, as systemd.exec(5) documents), each line starts with its syslog priority (``<3>``
  error, ``<4>`` warning, ``<6>`` info, ``<7>`` debug) and carries no time: journald reads the
  prefix as the entry's priority, so ``journalctl -p warning`` filters on it, and stamps each
  entry itself;
* json (``--log-format json``): ``time`` (ISO 8601 with the zone), ``level``, ``logger``,
  ``message``, then the event's fields the log call passed with ``extra=`` (``subnet``,
  ``public_ip``, ``reason``...), so that a pipeline need not parse the message; under the
  journal with the priority prefix too.

In the host layer because the control plane's child process (control/peer_process.py) forwards
its records with their fields (:func:`fields`) to the daemon, whose handlers write them.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import sys

FORMATS = ("text", "json")

# syslog's priorities (RFC 5424), which journald reads from a "<N>" prefix
_PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))
DEBUG_PRIORITY = 7

# what every record has: anything else on a record came from a log call's extra=
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def priority(levelno: int) -> int:
    for level, prio in _PRIORITIES:
        if levelno >= level:
            return prio
    return DEBUG_PRIORITY


def fields(record: logging.LogRecord) -> dict:
    """The event's fields: what the log call passed with ``extra=``."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


def iso_time(created: float) -> str:
    """A record's time in the host's zone, with its offset: unambiguous across hosts and DST."""
    return datetime.datetime.fromtimestamp(created).astimezone().isoformat(timespec="milliseconds")


def journal_stream(stream, environ=None) -> bool:
    """Whether ``stream`` is the journal's: systemd sets ``$JOURNAL_STREAM`` to ``DEV:INODE`` of
    the stream it connected; a process whose stderr was redirected since inherits the variable
    but not the stream, hence the comparison."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not sep:
        return False
    try:
        st = os.fstat(stream.fileno())
        return st.st_dev == int(dev) and st.st_ino == int(ino)
    except (AttributeError, OSError, ValueError):   # no fd (a StringIO), closed, a bad value
        return False


def _prefixed(text: str, record: logging.LogRecord) -> str:
    # every line of a traceback too: journald gives a line without a prefix the unit's default
    # priority (info), which would drop the rest of an error from `journalctl -p err`
    prefix = f"<{priority(record.levelno)}>"
    return "\n".join(prefix + line for line in text.split("\n"))


class TextFormatter(logging.Formatter):
    def __init__(self, journal: bool = False):
        super().__init__("%(levelname)s %(name)s: %(message)s" if journal
                         else "%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.journal = journal

    def formatTime(self, record, datefmt=None) -> str:
        return iso_time(record.created).replace("T", " ", 1)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return _prefixed(text, record) if self.journal else text


class JsonFormatter(logging.Formatter):
    def __init__(self, journal: bool = False):
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        obj = {"time": iso_time(record.created), "level": record.levelname.lower(),
               "logger": record.name, "message": record.getMessage()}
        for k, v in fields(record).items():
            obj.setdefault(k, v)
        if record.exc_info:
            obj["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:                       # forwarded already formatted
            obj["exception"] = record.exc_text
        if record.stack_info:
            obj["stack"] = self.formatStack(record.stack_info)
        # default=str: a field that is an address or a network object is written as it reads
        text = json.dumps(obj, default=str, ensure_ascii=False)
        return _prefixed(text, record) if self.journal else text


def formatter(fmt: str, journal: bool = False) -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"{fmt!r} is not one of {', '.join(FORMATS)}")
    return JsonFormatter(journal) if fmt == "json" else TextFormatter(journal)


def setup(fmt: str = "text") -> None:
    """Give the process's stderr handlers (``logging.basicConfig``'s, or a new one) the format,
    with priority prefixes where stderr is the journal's stream. Other handlers (a test's
    capture) are left as they are."""
    root = logging.getLogger()
    mine = [h for h in root.handlers if type(h) is logging.StreamHandler]
    if not root.handlers:
        mine = [logging.StreamHandler(sys.stderr)]
        root.addHandler(mine[0])
    for h in mine:
        h.setFormatter(formatter(fmt, journal_stream(h.stream)))
