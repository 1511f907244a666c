"""`flannel-udp run`: the daemon, a drop-in for `flanneld` with the udp backend."""
from __future__ import annotations

import logging
import os
import sys

from . import flanneld_flags

HELP = "run the overlay daemon (flanneld-compatible flags; a drop-in for flanneld's udp backend)"
DESCRIPTION = """\
Run the overlay daemon: a drop-in for flanneld with the udp backend.

Takes flanneld's flags, with flanneld's names, meanings and defaults, written
as --flag, --flag=value, -flag or -flag=value (Go style), each also settable
as a FLANNELD_<FLAG> environment variable when not on the command line
(FLANNELD_ETCD_ENDPOINTS, FLANNELD_IFACE, FLANNELD_IP_MASQ, ...).

Example (the same command line as flanneld's):
  flannel-udp run -etcd-endpoints=http://10.0.0.1:2379 -iface=eth0 -ip-masq
"""


class _AtLeastInfo(logging.Logger):
    """A logger whose level never goes below INFO (pyroute2's import sets it to NOTSET)."""

    def setLevel(self, level) -> None:
        super().setLevel(max(logging._checkLevel(level), logging.INFO))


def add_arguments(parser) -> None:
    flanneld_flags.add_arguments(parser)
    parser.set_defaults(_parser=parser)


def main(args) -> int:
    if getattr(args, "_version", False):
        flanneld_flags.print_version()
        return 0
    try:
        opts = flanneld_flags.resolve(args)
    except flanneld_flags.FlagError as e:
        prog = args._parser.prog if getattr(args, "_parser", None) else "flannel-udp run"
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1  # flanneld's exit code for a flag it cannot use
    from ..host import logfmt
    logfmt.setup(opts.log_format)
    root = logging.getLogger()
    if opts.v >= 2:
        root.setLevel(logging.DEBUG)
        # -v=2 is the daemon's debug, not its libraries': pyroute2 dumps every netlink
        # message at DEBUG. Not imported for that (~0.2 s; a start no longer needs it), so its
        # logger keeps INFO through the NOTSET its import sets, whenever that comes.
        quiet = logging.getLogger("pyroute2")
        quiet.__class__ = _AtLeastInfo
        quiet.setLevel(logging.INFO)
    for w in opts.warnings:
        logging.getLogger("dataplane.daemon").warning("%s", w)
    # glibc's thresholds fixed before the daemon's imports (a few large blocks freed among
    # them would raise them): freed blocks given back, not kept as heap fragments
    from ..host import malloc
    malloc.fix_thresholds()
    # the kernel path's programs load while the daemon's modules import (daemon/early_load.py)
    from ..daemon import early_load
    early = early_load.begin(opts)
    from ..daemon.main import Daemon
    rc = Daemon(opts, early=early).run()
    if not getattr(args, "_whole_process", False):
        return rc
    # Everything is closed: skip the interpreter's teardown (its threads and atexit work take a
    # tenth of a second), since under systemd's fd store the next process starts only once
    # this one has exited, and nobody forwards meanwhile.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
