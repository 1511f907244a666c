"""`flannel-udp` / `python -m dataplane`: one subcommand per module in this package.

* ``run.py``, ``reload.py``, ``forward.py``, ``demo.py``, ``bench.py``, ``status.py``,
  ``cleanup.py``: the subcommands. Each has ``HELP``
  (one line), ``add_arguments(parser)`` and ``main(args) -> int``; heavy imports stay inside
  ``main`` so that ``--help`` is fast;
* ``flanneld_flags.py``: `run`'s flag table, flanneld's flags with their names, defaults and
  FLANNELD_* variables, resolved into the daemon's Options;
* ``interrupt.py``: SIGTERM and SIGHUP taken as Ctrl-C by the commands that build testbeds
  (demo, bench), so that their teardown runs whichever way they are stopped.

How to start this package as a child process is ``dataplane/host/child.py``: the layers below
use it too.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .. import __version__

# (subcommand, module in this package)
COMMANDS = [
    ("run", "run"),
    ("reload", "reload"),
    ("forward", "forward"),
    ("demo", "demo"),
    ("bench", "bench"),
    ("status", "status"),
    ("cleanup", "cleanup"),
]


def missing_extra(command: str, extra: str, modules: tuple[str, ...]) -> bool:
    """Whether a module of the ``extra`` that ``command`` needs is not installed;
    if so, say which extra to install (the daemon's own install has none)."""
    from importlib.util import find_spec
    missing = [m for m in modules if find_spec(m) is None]
    if missing:
        print(f"flannel-udp {command}: {', '.join(missing)} not installed; install the "
              f"'{extra}' extra: pip install 'flannel-udp[{extra}]'", file=sys.stderr)
    return bool(missing)


def _load(module: str):
    try:
        return importlib.import_module(f"dataplane.cli.{module}")
    except ModuleNotFoundError as e:
        if e.name == f"dataplane.cli.{module}":
            return None  # not written yet
        raise


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flannel-udp",
        description="A userspace UDP/TUN overlay: a drop-in for flanneld's udp backend, "
                    "with a batched C fast path and a pure-Python engine.")
    p.add_argument("--version", action="version", version=f"flannel-udp {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS:
        mod = _load(module)
        if mod is None:
            continue
        sp = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(sp)
        sp.set_defaults(_main=mod.main)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                            stream=sys.stderr)
    # argv None: this is the process's own command line (console script, python -m, a child);
    # a caller that passes argv (a test) gets the status back, whatever the subcommand.
    args._whole_process = argv is None
    return int(args._main(args) or 0)
