"""The daemon's install has no extras: `run` never imports what only the demo
(rich) or the bench (rich, matplotlib) needs, and those two commands name the
extra to install, exit 2 and print no traceback when it is missing."""
from __future__ import annotations

import subprocess

import pytest

from dataplane.host.child import python_argv

EXTRA_MODULES = ("rich", "matplotlib")


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(python_argv(code), capture_output=True, text=True, timeout=60)


def test_the_daemon_and_run_help_import_no_extra():
    code = ("import contextlib, io\n"
            "import dataplane.daemon.main\n"
            "from dataplane import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    cli.main(['run', '--help'])\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {EXTRA_MODULES!r}))\n")
    r = _child(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# The bench's arguments are refused right after the extras check: were that check gone, the
# test fails on the message instead of starting a run.
@pytest.mark.parametrize("argv,extra,hidden", [
    (["demo"], "demo", "rich"),
    (["bench", "--paths", "none-such"], "bench", "rich"),
    (["bench", "--paths", "none-such"], "bench", "matplotlib"),
])
def test_a_missing_extra_is_named(argv, extra, hidden):
    # A None entry in sys.modules makes the module unimportable, as if not installed.
    code = (f"sys.modules[{hidden!r}] = None\n"
            "from dataplane import cli\n"
            f"sys.exit(cli.main({argv!r}))\n")
    r = _child(code)
    assert r.returncode == 2, r
    assert hidden in r.stderr and f"pip install 'flannel-udp[{extra}]'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
