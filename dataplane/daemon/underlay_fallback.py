"""--ipv6-underlay-fallback: a peer whose IPv6 underlay carries nothing back gets its pods' IPv6
over the IPv4 underlay until it does again (docs/operating.md#ipv6-underlay-fallback).

Watching what the engines receive cannot tell: where only our way to the peer is dropped (a
firewall opened for the port on IPv4 only), we still receive the peer's datagrams over IPv6 and
the peer receives nothing. So a thread of the daemon asks each peer whose IPv6 part goes over
the IPv6 underlay (not those routed directly: no engine carries them) with a probe through the
overlay itself (host/underlay_probe.py: an ICMPv6 echo from our flannel0 to the peer's, sent on
the engines' IPv6 socket) and takes the answer, which comes back over the IPv6 underlay too:
every host routes each such peer's flannel0 address over it whatever the part does
(control/routes.py Ipv6Parts.probe_route). An answer proves both ways; when the probes go
unanswered (control/underlay_health.py says how many, how often), the part's route names the
peer's PublicIP instead (daemon/peer_routes.py set_fallback), and the probes go on over IPv6
until they are answered again. Each turn is logged once; `flannel-udp status` and /metrics read
:meth:`UnderlayFallback.report`. The engines do nothing more per packet.

The probe interval is PROBE_EVERY_S (5 s), or FLANNEL_UDP_PROBE_EVERY_S for tests.
"""
from __future__ import annotations

import logging
import os
import select
import threading
import time

from ..control.recurring import Recurring
from ..control.underlay_health import PROBE_EVERY_S, UnderlayHealth, targets_of
from ..host.family import V6
from ..host import underlay_probe

log = logging.getLogger(__name__)

PROBE_EVERY_ENV = "FLANNEL_UDP_PROBE_EVERY_S"
TICK_S = 0.25                   # how often due probes go out and overdue answers are judged
RELIST_EVERY_S = 5.0            # the probed peers taken again at least this often


def _probe_every() -> float:
    try:
        value = float(os.environ.get(PROBE_EVERY_ENV, PROBE_EVERY_S))
    except ValueError:
        return PROBE_EVERY_S
    return value if value > 0 else PROBE_EVERY_S


class UnderlayFallback:
    """The probes of the daemon whose DaemonState is ``state``, sent on ``sock6`` (one socket
    of the IPv6 underlay), its routes changed through ``peer_routes``."""

    def __init__(self, state, peer_routes, sock6):
        self.state, self.peer_routes, self.sock6 = state, peer_routes, sock6
        self.health = UnderlayHealth(_probe_every())
        self.prober = underlay_probe.Prober()
        self.answers = underlay_probe.AnswerSocket()
        self._stop = threading.Event()
        self._seen = None               # the peers6 snapshot the probed peers come from
        self._relisted = 0.0
        self._failing = Recurring(log, "A round of the IPv6 underlay probes", level=logging.ERROR)
        self._lock = threading.Lock()   # the health's counts, read by the reports
        self._thread = threading.Thread(target=self._run, name="underlay-probe", daemon=True)

    def start(self) -> "UnderlayFallback":
        log.info("IPv6 underlay fallback is on: each peer whose IPv6 part goes over the IPv6 "
                 "underlay is probed every %.0f s or more (at most %d probes a second in all); "
                 "one that answers none of %d in a row gets its IPv6 part over IPv4 until it "
                 "answers again", self.health.every_s, self.health.max_rate,
                 self.health.misses_to_fail)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.answers.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
                self._failing.ok()
            except Exception as e:      # one bad round must not end the probes
                self._failing.fail(f"{type(e).__name__}: {e}", "tried again every second")
                self._stop.wait(1)
            try:
                select.select([self.answers], [], [], TICK_S)
            except (OSError, ValueError):
                return                  # closed under us: shutting down

    def _round(self) -> None:
        st, v6 = self.state, self.peer_routes.ipv6
        now = time.monotonic()
        with st.lock:
            peers6, lease = st.peers[6], st.lease
            # DirectRouting's decisions change without a peer change too: taken again too
            relist = peers6 is not self._seen or now - self._relisted >= RELIST_EVERY_S
            direct6 = set(st.direct.direct[V6]) if relist else ()
        if lease is None or lease.ipv6_subnet is None:
            return
        with self._lock:
            h = self.health
            if relist:
                self._seen, self._relisted = peers6, now
                h.follow(targets_of(peers6.peers.values(), lambda le: le.subnet not in direct6
                                    and v6.why_not(le) is None
                                    and v6.probe_route(le.ipv6_subnet, le, 0) is not None))
            for message in self.answers.read():
                number = self.prober.number(message)
                if number is not None:
                    h.answer(number)
            src = lease.ipv6_subnet.network_address
            port = st.config.backend_port
            for _key, (pub6, part), number in h.due():
                underlay_probe.send(self.sock6, self.prober.request(src, part.network_address,
                                                                    number), pub6, port)
            turns = h.judge()
            # a peer forgotten (gone, or its PublicIPv6 changed) leaves the routes' set too
            failed = frozenset(h.failed()) if turns or relist else v6.fallback
        if failed != v6.fallback:
            self.peer_routes.set_fallback(failed)
        for turn in turns:
            self._say(turn, peers6.peers.get(turn.key))

    def _say(self, turn, lease) -> None:
        if lease is None:
            return
        if turn.failed:
            log.warning("Subnet %s: the IPv6 underlay to %s carries nothing back (%s): its IPv6 "
                        "part %s goes over IPv4 to %s until probes over IPv6 are answered again",
                        lease.subnet, lease.attrs.public_ipv6, turn.why, lease.ipv6_subnet,
                        lease.public_ip)
        else:
            log.info("Subnet %s: the IPv6 underlay to %s works again (%s): its IPv6 part %s "
                     "goes over it again", lease.subnet, lease.attrs.public_ipv6, turn.why,
                     lease.ipv6_subnet)

    def report(self) -> dict:
        """For `flannel-udp status` and /metrics: the peers whose IPv6 part goes over IPv4
        because their IPv6 underlay failed, and the probes' totals."""
        with self._lock:
            failed = self.health.failed()
            h = self.health
            counts = {"probed": h.probed(), "interval_s": h.interval(), "probes_sent": h.sent,
                      "probes_answered": h.answered, "fallbacks": h.fallbacks}
        peers = self.state.peers[6].peers
        on_ipv4 = []
        for subnet, since in sorted(failed.items()):
            lease = peers.get(subnet)
            if lease is not None:
                on_ipv4.append({"subnet": str(subnet), "public_ipv6": str(lease.attrs.public_ipv6),
                                "public_ip": str(lease.public_ip), "since": since})
        return {**counts, "on_ipv4": on_ipv4}


def start(state, peer_routes, socks6):
    """The probes, when --ipv6-underlay-fallback is on and this host has an IPv6 underlay
    (``socks6``); None otherwise, or (said) when the answers' socket cannot be opened."""
    if not state.opts.ipv6_underlay_fallback or not socks6:
        return None
    try:
        fallback = UnderlayFallback(state, peer_routes, socks6[0])
    except OSError as e:
        log.warning("IPv6 underlay fallback is off: cannot open a raw ICMPv6 socket for "
                    "the probes' answers (%s; it needs CAP_NET_RAW): a peer whose IPv6 underlay "
                    "carries nothing is not noticed", e)
        return None
    peer_routes.ipv6.probe_routes = True
    state.underlay_fallback = fallback
    return fallback.start()
