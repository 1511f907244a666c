"""Every script in perf/ still imports and parses its arguments: they import the bench's modules,
and a module moved or renamed there breaks them without any other test noticing."""
from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "perf", "*.py")))


def test_there_are_scripts():
    assert len(SCRIPTS) >= 5, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_help(script):
    r = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage:" in r.stdout
