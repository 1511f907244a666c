"""Our lease while the daemon runs: the lease manager that renews it, and when the host moves.

The lease manager's thread says when it re-acquired a lease lost in etcd (:meth:`on_lease_change`);
SIGHUP asks for a new lease manager, which acquires again (:attr:`LeaseKeeper.reacquire`). Both
are applied on the serve loop's tick (:meth:`tick`): the move itself is daemon/lease_move.py's,
then the rest of the host follows the lease (the IPv6 routes, subnet.env, the state file). A
move that failed is tried again on the next tick, a SIGHUP whose acquisition failed every 5 s.
"""
from __future__ import annotations

import logging
import threading

from ..control.recurring import Recurring
from . import lease_move, listing_ahead, startup
from .startup import StartupError, Stopped
from .timefmt import when

log = logging.getLogger(__name__)


class LeaseKeeper:
    """The lease of the daemon whose DaemonState is ``state``. ``move_host()`` is what a move
    changes (lease_move.Host), ``routed6()`` our IPv6 underlay for the routes (PeerRoutes
    follow_lease), ``public6()`` our PublicIPv6 for the lease, ``wait(s)`` the daemon's
    (raises Stopped); ``save_state()`` rewrites the state file."""

    def __init__(self, state, peer_routes, *, move_host, routed6, public6, wait, save_state):
        self.state = state
        self.registry = None                  # the daemon's, once made (start step 2)
        self.pending = None                   # the lease to move to on the next tick (state.lock)
        self.reacquire = threading.Event()    # SIGHUP
        self._peer_routes = peer_routes
        self._move_host, self._routed6, self._public6 = move_host, routed6, public6
        self._wait, self._save_state = wait, save_state
        self._failing = Recurring(log, "Re-acquiring the lease (SIGHUP)", level=logging.ERROR)

    def new_manager(self, prev=None, ahead=None):
        """A lease manager for our PublicIP(s), preferring the subnet ``prev``; not started;
        ``ahead``: its first listing (daemon/listing_ahead.py)."""
        st = self.state
        registry = listing_ahead.registry_for(self.registry, ahead)
        return startup.make_lease_manager(st.opts, registry, st.ext, st.config,
                                          self.on_lease_change, prev=prev,
                                          public6=self._public6())

    def on_lease_change(self, lease):
        """LeaseManager callback (its thread): our lease was lost in etcd (deleted, expired,
        taken) and it acquired one again. The main thread applies it."""
        log.warning("Our lease was lost in etcd and re-acquired: %s (PublicIP %s), expires %s",
                    lease.subnet, lease.public_ip, when(lease.expiration))
        with self.state.lock:
            self.pending = lease

    def tick(self, stop: threading.Event) -> bool:
        """The serve loop's: a pending lease, then a SIGHUP's, moved to. False once the daemon
        is stopped meanwhile."""
        with self.state.lock:
            pending, self.pending = self.pending, None
        if pending is not None:
            self.move_to(pending)
        if self.reacquire.is_set():
            self.reacquire.clear()
            try:
                self.move_to(self._reacquired())
                self._failing.ok()
            except Stopped:
                return False
            except StartupError as e:
                self._failing.fail(str(e), "retrying every 5 s", key="sighup")
                self.reacquire.set()
                if stop.wait(5):
                    return False
        return True

    def _reacquired(self):
        """SIGHUP: a new lease manager acquires again (the same lease if etcd still holds it for
        our PublicIP); returns the lease to move to."""
        st = self.state
        current = st.current_lease()
        try:
            st.lease_manager.stop()
        except Exception as e:
            log.debug("stopping the lease manager: %s", e)
        st.lease_manager = self.new_manager(prev=current.subnet)
        new = startup.acquire_lease(st.lease_manager, self.registry, self._wait)
        st.lease_manager.take_listing()       # the peer watch runs already: not held on to
        st.lease_manager.start()
        return new

    def move_to(self, lease) -> None:
        """Adopt ``lease``, moving the host to its subnet if that is another one
        (daemon/lease_move.py); a move that failed is tried again on the next tick, unless the
        lease manager has handed over a newer lease meanwhile."""
        st = self.state
        with st.lock:
            old = st.lease
        if not lease_move.move(old, lease, self._move_host(), st.move_failures):
            with st.lock:
                if self.pending is None:
                    self.pending = lease
            return
        with st.lock:
            st.lease = lease
        self._peer_routes.follow_lease(st.config.ipv6_network, lease.ipv6_subnet,
                                       self._routed6())
        if (lease.subnet, lease.ipv6_subnet) != (old.subnet, old.ipv6_subnet):
            st.subnet_env.want(startup.parts(st.config, lease), st.ext.tun_mtu)
        self._save_state()
