"""Being replaced: the running daemon's side of a handover and of a restart.

The handover socket (daemon/handover.py) is handed a :class:`Succession`, not the daemon: the
daemon's state (daemon/state.py DaemonState) whose fds it offers and whose document
(inherited.state_of) it sends, whether our engine is stopped for a switch, and the calls of the
protocol: stop reconciling, handed over, forward again after a failed switch. The state file in
systemd's fd store (daemon/takeover.py) is kept here too: rewritten when the peers changed, left
to the next process at exit.
"""
from __future__ import annotations

import logging
import threading

from . import inherited, takeover
from .systemd import sd_notify

log = logging.getLogger(__name__)


class Succession:
    """What a successor needs of the daemon whose DaemonState is ``state``. ``stop()`` ends the
    daemon (its serve loop), ``make_engine()`` makes a new engine on our fds with the routes of
    the known peers (not started), ``free_ports()`` closes our HTTP servers."""

    def __init__(self, state, peer_routes, *, stop, make_engine, free_ports):
        self.state = state
        self.stop = stop
        self._peer_routes = peer_routes
        self._make_engine = make_engine
        self._free_ports = free_ports
        self.state_file = None                # inherited.StateFile in systemd's fd store
        self.handing_over = False             # our engine is stopped for a new daemon
        self.successor = None                 # the pid we handed over to
        self.let_go = threading.Event()       # another daemon holds the host: stop_reconciling
        self._let_go_lock = threading.Lock()

    def resume_engine(self):
        """A switch failed after our engine stopped: forward again, on the same fds."""
        st = self.state
        with st.lock:
            old = st.engine
        old.close()
        self._make_engine()
        with st.lock:
            st.engine.start()
            self.handing_over = False

    def stop_reconciling(self):
        """Another daemon holds the host from now on (it took over, or starts afresh once we
        exit): nothing of ours may put back what it changes, as the firewall's resync would (a
        start without EnableIPv6 removes the IPv6 rules), nor the direct routes (the host's
        route watch, the peer watch), the lease (its renewal takes our key back), the blackhole
        route or subnet.env (the serve loop's tick). The handover runs it before the new daemon
        goes on; the shutdown runs it first. Once: a second call waits for the first."""
        st = self.state
        with self._let_go_lock:
            if self.let_go.is_set():
                return
            self.let_go.set()
            steps([
                ("stop the peer watch", lambda: st.peer_watcher and st.peer_watcher.stop()),
                ("stop watching the host's routes (the direct routes stay)",
                 self._peer_routes.close),
                ("stop the lease renewal", lambda: st.lease_manager and st.lease_manager.stop()),
                ("stop the iptables resync (the rules stay)", lambda: st.rules and st.rules.stop()),
            ])

    def handed_over(self, pid: int):
        """The new daemon forwards: free our HTTP ports for it and exit. Under systemd it is
        the unit's main process from now on. It may change what we set up from now on: we
        stop reconciling first (the handover says "released" after this returns)."""
        self.stop_reconciling()
        self.successor = pid
        sd_notify(f"MAINPID={pid}")
        self._free_ports()
        self.stop()

    # ------------------------------------------------------------------ the state file
    def keep_for_restart(self):
        """The fds and the state into systemd's fd store, when it keeps fds (daemon/takeover.py)."""
        self.state_file = takeover.keep_for_restart(self.state_file, self.state.dataplane,
                                                    lambda: inherited.state_of(self.state))

    def save_state(self):
        takeover.save(self.state_file, lambda: inherited.state_of(self.state))

    def leave_to_next(self):
        """In systemd's fd store: the newest state (`systemctl stop` closes the store, and
        flannel0 with it)."""
        if self.state_file is not None and self.successor is None:
            self.save_state()


def steps(steps) -> None:
    """(what, fn) in order; a step that fails is said and the next one runs."""
    for what, fn in steps:
        try:
            fn()
        except Exception as e:
            log.warning("while shutting down, could not %s: %s", what, e)
