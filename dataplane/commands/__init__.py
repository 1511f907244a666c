"""One module per `flannel-udp` subcommand (see dataplane/cli.py)."""
from __future__ import annotations

import sys


def missing_extra(command: str, extra: str, modules: tuple[str, ...]) -> bool:
    """Whether a module of the ``extra`` that ``command`` needs is not installed;
    if so, say which extra to install (the daemon's own install has none)."""
    from importlib.util import find_spec
    missing = [m for m in modules if find_spec(m) is None]
    if missing:
        print(f"flannel-udp {command}: {', '.join(missing)} not installed; install the "
              f"'{extra}' extra: pip install 'flannel-udp[{extra}]'", file=sys.stderr)
    return bool(missing)
