"""The command line of a child process that runs this very ``dataplane`` package.

``python -m dataplane`` puts the current directory first on sys.path, so a
daemon started from inside a source checkout would import the checkout's
sources (without the built C engine) instead of the installed package its
parent runs; PYTHONPATH cannot fix that, it comes after the current
directory. So children start with ``python -c`` and a prologue that puts the
directory the parent imported ``dataplane`` from where the current directory
was. (``-P`` would drop the current directory too, but only from Python 3.11.)
"""
from __future__ import annotations

import os
import sys

# The directory that holds the parent's ``dataplane`` (site-packages, or a checkout).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PROLOGUE = ("import sys; sys.path[:] = [{root!r}] + "
             "[p for p in sys.path if p not in ('', {root!r})]\n")


def python_argv(code: str) -> list[str]:
    """``[python, "-c", code]`` where ``import dataplane`` is the parent's package."""
    return [sys.executable, "-c", _PROLOGUE.format(root=PACKAGE_PARENT) + code]


def cli_argv(*args: str) -> list[str]:
    """``flannel-udp ARGS...`` as a child process, whatever its current directory."""
    return python_argv("sys.argv[0] = 'flannel-udp'\n"
                       "from dataplane.cli import main\n"
                       "sys.exit(main())") + [str(a) for a in args]
