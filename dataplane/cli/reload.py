"""`flannel-udp reload`: the unit's ExecReload. Replaces the running daemon by the installed
flannel-udp with the command line and FLANNELD_* environment given to this command, through the
handover socket (daemon/handover.py request_reload), and waits until the new process forwards."""
from __future__ import annotations

import os
import sys

from . import flanneld_flags

HELP = ("replace the running daemon by the installed flannel-udp with these `run` flags and this "
        "FLANNELD_* environment, without losing packets (the unit's ExecReload)")
DESCRIPTION = """\
Replace the running daemon (found on --handover-socket) by the installed
flannel-udp, run with the flags given here and the FLANNELD_* variables of
this command's environment: systemd reads the unit's EnvironmentFile= anew for
each command it starts, so with

  ExecReload=/opt/flannel-udp/bin/flannel-udp reload $FLANNEL_UDP_OPTIONS

`systemctl reload flannel-udp` applies an edited /etc/default/flannel-udp.
The flags are checked first (a bad one: exit 1, the daemon untouched); then
the new process takes flannel0 and the sockets over (docs/restarts-and-upgrades.md).
Exits 0 once it forwards, 1 when it did not take over (the old one forwards on).
"""


def add_arguments(parser) -> None:
    # `run`'s own flags and parser (Go's syntax), so that what would not start is refused here;
    # what was given is kept as written for the new process's command line
    flanneld_flags.add_arguments(parser)
    base = parser.__class__

    class _Keeping(base):
        def parse_known_args(self, args=None, namespace=None):
            ns, extras = super().parse_known_args(args, namespace)
            ns._given = list(sys.argv[1:] if args is None else args)
            return ns, extras

    parser.__class__ = _Keeping


def main(args) -> int:
    from ..daemon import handover
    prog = "flannel-udp reload"
    try:
        opts = flanneld_flags.resolve(args)
    except flanneld_flags.FlagError as e:
        print(f"{prog}: error: {e}; the running daemon is left as it is", file=sys.stderr)
        return 1
    if not opts.handover_socket:
        print(f"{prog}: error: --handover-socket is empty: no daemon to reload", file=sys.stderr)
        return 1
    env = {k: v for k, v in os.environ.items() if k.startswith(handover.RELOAD_ENV_PREFIX)}
    try:
        pid = handover.request_reload(
            opts.handover_socket, ["run", *args._given], env,
            started=lambda pid: print(f"{prog}: pid {pid} takes over", flush=True))
    except handover.ReloadError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    print(f"{prog}: pid {pid} forwards now", flush=True)
    return 0
