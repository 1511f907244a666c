"""Whether each peer's IPv6 underlay carries anything back, from probes; no I/O.

The daemon (daemon/underlay_fallback.py) probes every peer whose IPv6 part goes over the IPv6
underlay and tells this module what it sent and what was answered; this module says when, whom
to probe, and when a peer's IPv6 underlay has failed or works again.

- Each peer is probed once per interval: PROBE_EVERY_S, or more where the peers are many, so
  that all of them together take at most MAX_PROBES_PER_S (a host of a 16,000-node cluster
  probes each peer every 80 s). A new peer's first probe comes at a random point of the first
  interval, so that the probes of a listing spread out.
- A probe not answered within ANSWER_WITHIN_S (at most the interval) is missed. MISSES_TO_FAIL
  missed in a row: the peer's IPv6 underlay has failed. At the defaults that is said at most
  4 x 5 s + 2 s = 22 s after the last answer, and the 30 s the operator is promised leave room
  for a busy host.
- A failed peer is still probed over the IPv6 underlay; ANSWERS_TO_RECOVER answers in a row
  and it works again (one answer in a lossy spell would make a peer flap).
"""
from __future__ import annotations

import collections
import heapq
import itertools
import random
import time
from dataclasses import dataclass
from typing import Hashable, Iterable, Optional

PROBE_EVERY_S = 5.0
MAX_PROBES_PER_S = 200
ANSWER_WITHIN_S = 2.0
MISSES_TO_FAIL = 4
ANSWERS_TO_RECOVER = 2


@dataclass
class _Peer:
    target: object                  # what the probe goes to (a change starts the peer afresh)
    misses: int = 0                 # probes missed in a row
    answers: int = 0                # probes answered in a row
    failed_at: Optional[float] = None   # wall time the IPv6 underlay was found failed
    outstanding: int = 0            # the number of the probe awaiting its answer, 0: none


@dataclass(frozen=True)
class Turn:
    """A peer whose IPv6 underlay failed (``failed``) or works again, and why."""
    key: Hashable
    failed: bool
    why: str


class UnderlayHealth:
    """The probes' bookkeeping for the peers given to :meth:`follow`, by key (the peer's IPv4
    subnet). ``clock`` is monotonic seconds; ``wall`` the time shown to operators."""

    def __init__(self, every_s: float = PROBE_EVERY_S, *, max_rate: float = MAX_PROBES_PER_S,
                 answer_within_s: float = ANSWER_WITHIN_S, misses: int = MISSES_TO_FAIL,
                 answers: int = ANSWERS_TO_RECOVER, clock=time.monotonic, wall=time.time,
                 rng=random.random):
        self.every_s = every_s
        self.max_rate = max_rate
        self.answer_within_s = answer_within_s
        self.misses_to_fail, self.answers_to_recover = misses, answers
        self._clock, self._wall, self._rng = clock, wall, rng
        self._peers: dict = {}
        # heap of (when, tie, key, peer): an entry whose peer is no longer self._peers[key]
        # (forgotten, or its target changed) is stale and dropped when due, so each peer has
        # exactly one live entry however often it is restarted
        self._due: list = []
        self._tie = itertools.count()
        self._numbers = itertools.count(1)
        self._waiting: dict = {}                # probe number -> key
        self._sent = collections.deque()        # (deadline, number), in the order sent
        self._last_send = clock()
        self._touched: set = set()              # keys answered or missed since judge()
        self.sent = self.answered = self.fallbacks = 0      # totals since start

    def interval(self) -> float:
        """How often each peer is probed now."""
        return max(self.every_s, len(self._peers) / self.max_rate)

    def follow(self, targets: dict) -> None:
        """The peers to probe from now on: {key: target}. A peer that is gone is forgotten
        (failed or not), one whose target changed starts afresh."""
        now, every = self._clock(), self.interval()
        for key in [k for k in self._peers if k not in targets]:
            self._forget(key)
        for key, target in targets.items():
            peer = self._peers.get(key)
            if peer is not None and peer.target == target:
                continue
            if peer is not None:
                self._forget(key)
            peer = self._peers[key] = _Peer(target)
            heapq.heappush(self._due, (now + self._rng() * every, next(self._tie), key, peer))

    def _forget(self, key) -> None:
        peer = self._peers.pop(key)
        self._waiting.pop(peer.outstanding, None)   # its heap entry is skipped when due

    def due(self) -> list:
        """[(key, target, probe number)] to send now, each counted as sent; at most
        max_rate per second since the last call, the rest stay due."""
        now = self._clock()
        budget = max(1, int((now - self._last_send) * self.max_rate))
        self._last_send = now
        every, out = self.interval(), []
        while self._due and self._due[0][0] <= now and len(out) < budget:
            _, _, key, peer = heapq.heappop(self._due)
            if self._peers.get(key) is not peer:
                continue                    # forgotten, or a stale entry of a restarted one
            self._miss_outstanding(key)     # sent before its answer was due: not waited for
            number = next(self._numbers)
            peer.outstanding = number
            self._waiting[number] = key
            self._sent.append((now + min(self.answer_within_s, every), number))
            heapq.heappush(self._due, (now + every, next(self._tie), key, peer))
            out.append((key, peer.target, number))
        self.sent += len(out)
        return out

    def answer(self, number: int) -> bool:
        """A probe's answer came; False for one not awaited (late, or not ours)."""
        key = self._waiting.pop(number, None)
        if key is None:
            return False
        peer = self._peers[key]
        peer.outstanding = 0
        peer.misses = 0
        peer.answers += 1
        self.answered += 1
        self._touched.add(key)
        return True

    def judge(self) -> list:
        """The peers whose IPv6 underlay failed or came back since the last call
        (:class:`Turn`), after counting the probes whose answer is overdue as missed."""
        now = self._clock()
        while self._sent and self._sent[0][0] <= now:
            _, number = self._sent.popleft()
            key = self._waiting.get(number)
            if key is not None:
                self._miss_outstanding(key)
        turns = []
        touched, self._touched = self._touched, set()
        for key in touched:
            peer = self._peers.get(key)
            if peer is None:
                continue
            if peer.failed_at is None and peer.misses >= self.misses_to_fail:
                peer.failed_at = self._wall()
                self.fallbacks += 1
                turns.append(Turn(key, True, f"{peer.misses} probes in a row unanswered"))
            elif peer.failed_at is not None and peer.answers >= self.answers_to_recover:
                peer.failed_at = None
                turns.append(Turn(key, False, f"{peer.answers} probes in a row answered"))
        return turns

    def _miss_outstanding(self, key) -> None:
        peer = self._peers[key]
        if peer.outstanding and self._waiting.pop(peer.outstanding, None) is not None:
            peer.misses += 1
            peer.answers = 0
            self._touched.add(key)
        peer.outstanding = 0

    def failed(self) -> dict:
        """{key: wall time it failed} of the peers whose IPv6 underlay failed."""
        return {k: p.failed_at for k, p in self._peers.items() if p.failed_at is not None}

    def probed(self) -> int:
        return len(self._peers)


def targets_of(leases: Iterable, over_ipv6) -> dict:
    """{IPv4 subnet: (PublicIPv6, IPv6 part)} of the ``leases`` for which ``over_ipv6(lease)``
    holds."""
    return {lease.subnet: (lease.attrs.public_ipv6, lease.ipv6_subnet)
            for lease in leases if over_ipv6(lease)}
