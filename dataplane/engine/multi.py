"""N engines, one per queue (TUN queue fd + UDP socket), behind one Engine.

Each queue is a complete engine with its own loop thread (the C loop runs
without the GIL, so C queues run on all cores; Python queues work too, one
thread each, but share the GIL). The queues share nothing: the kernel spreads
the flows (the TUN's flow hash on the way out, the sockets' steering program
on the way in, see dataplane/host/udpsock.py) and any queue may write into the TUN.

What the wrapper decides, for callers that see one engine:

* ``set_routes`` builds the table once and ``set_table`` publishes it to
  every queue at once (the engine's ``publish_all``: every queue's copy is
  built before the first is published); ``route_swaps`` counts one per
  queue and table;
* ``stats`` sums every counter over the queues (``queue_stats`` has them one
  by one);
* ``set_icmp_limit(rate, burst)`` gives each queue rate/N and burst/N (the
  remainder to the first queues), so the host sends at most what was
  configured in total. Each queue has at least 1/s and a burst of 1 (so with
  rate < N the total is N/s): a queue with rate 0 would be unlimited. One
  sender's packets hash to one queue, so a single flow sees rate/N;
* the trace is queue 0's alone (every ring numbers its own events, and
  ``trace_events(after)`` reads one ordered stream): callers that trace run
  one queue (dataplane/host/queues.py);
* ``start``/``stop``/``close`` act on all; ``join`` waits for all;
  ``ended`` says which loops have ended and why (one ending is a failure),
  ``on_end`` calls back as soon as any one of them ends;
* ``offloads_in_use`` is the bits every queue still uses: one queue whose
  kernel answer turned UDP_GSO off makes it off for the whole engine;
* ``heartbeats`` is every queue's heartbeat, in queue order: one queue that
  hangs must be seen, so they are not summed.
"""
from __future__ import annotations

import time
from collections.abc import Mapping

from .api import ICMP_BURST_DEFAULT, STAT_NAMES, Engine


def split(total: int, n: int) -> list[int]:
    """``total`` in n shares that sum to it, the larger ones first."""
    base, rest = divmod(int(total), n)
    return [base + (1 if i < rest else 0) for i in range(n)]


class MultiEngine(Engine):
    """The Engine interface over ``queues`` (started together, one thread each)."""

    def __init__(self, queues):
        queues = list(queues)
        if not queues:
            raise ValueError("a MultiEngine needs at least one queue")
        q0 = queues[0]
        super().__init__(q0.tun_fd, q0.udp_fds[4], q0.tun_addr, q0.mtu, q0.batch, q0.accept_any)
        self.queues = queues
        self.name = q0.name
        self.table_type = q0.table_type
        self._closed = False

    def __len__(self) -> int:
        return len(self.queues)

    def set_table(self, table) -> None:
        type(self.queues[0]).publish_all(self.queues, table)

    def start(self) -> None:
        started = []
        try:
            for q in self.queues:
                q.start()
                started.append(q)
        except BaseException:
            for q in started:
                q.stop()
            raise

    def stop(self) -> None:
        for q in self.queues:
            q.stop()

    def join(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        done = True
        for q in self.queues:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done = q.join(left) and done
        return done

    def ended(self) -> dict:
        """{queue index: api.Ended} for the queues whose loop thread has ended
        (or never started); empty while all run."""
        out = {}
        for i, q in enumerate(self.queues):
            why = q.ended()
            if why is not None:
                out[i] = why
        return out

    def on_end(self, callback) -> None:
        """``callback(self)`` when the first queue ends (once per queue that ends)."""
        for q in self.queues:
            q.on_end(lambda _q: callback(self))

    def offloads_in_use(self) -> int:
        bits = ~0
        for q in self.queues:
            bits &= q.offloads_in_use()
        return bits

    def heartbeat(self) -> int:
        raise TypeError("a MultiEngine has one heartbeat per queue: heartbeats()")

    def heartbeats(self) -> list[int]:
        return [q.heartbeat() for q in self.queues]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for q in self.queues:       # stop all first: their loops end in parallel
            try:
                q.stop()
            except OSError:
                pass
        first = None
        for q in self.queues:
            try:
                q.close()
            except Exception as e:  # close the others anyway
                first = first or e
        if first is not None:
            raise first

    def stats(self) -> dict:
        return self.sum_stats(self.queue_stats())

    @staticmethod
    def sum_stats(per_queue) -> dict:
        total = dict.fromkeys(STAT_NAMES, 0)
        for st in per_queue:
            for k, v in st.items():
                total[k] = total.get(k, 0) + v
        return total

    def queue_stats(self) -> list[dict]:
        return [q.stats() for q in self.queues]

    def set_icmp_limit(self, rate: int, burst: int = ICMP_BURST_DEFAULT) -> None:
        rate, burst = self._check_icmp_limit(rate, burst)
        if not rate:                # unlimited everywhere; the burst does not matter
            for q in self.queues:
                q.set_icmp_limit(0, burst)
            return
        n = len(self.queues)
        for q, r, b in zip(self.queues, split(rate, n), split(burst, n)):
            q.set_icmp_limit(max(r, 1), max(b, 1))

    def set_local(self, own_subnets, addrs) -> None:
        own_subnets, addrs = list(own_subnets), list(addrs)
        for q in self.queues:
            q.set_local(own_subnets, addrs)

    def set_tun_addr(self, addr) -> None:
        for q in self.queues:
            q.set_tun_addr(addr)

    def set_coalesce(self, usecs: int) -> None:
        for q in self.queues:
            q.set_coalesce(usecs)

    def set_udp(self, version: int, fd) -> None:
        """Each queue has its own socket of each family: create(udp_fds=) hands them out."""
        raise TypeError("a MultiEngine takes one socket per queue and family: "
                        "create(udp_fds={version: [...]})")

    def set_strict_sources(self, enable: bool) -> None:
        for q in self.queues:
            q.set_strict_sources(enable)

    def set_offloads(self, flags: int) -> None:
        for q in self.queues:
            q.set_offloads(flags)

    def trace(self, enable: bool) -> None:
        self.queues[0].trace(enable)

    def trace_events(self, after: int = 0) -> list:
        return self.queues[0].trace_events(after)


def create(cls, tun_fds, udp_fds, *, icmp_rate=None, icmp_burst=ICMP_BURST_DEFAULT,
           offloads: int = 0, coalesce_us: int = 0, trace: bool = False,
           thread_init=None, **engine_kw) -> MultiEngine:
    """One ``cls`` engine per TUN fd, configured alike, not started.

    ``udp_fds``: one underlay socket per queue, in the queues' order, per IP version
    (``{4: [...], 6: [...]}``; a plain list is IPv4's alone). IPv4's go to the constructors,
    the others to set_udp (each family's sockets form a reuseport group of their own,
    steered alike). ``engine_kw`` are Engine's other constructor arguments (tun_addr, mtu,
    batch, accept_any). On failure the engines made so far are closed."""
    tun_fds = list(tun_fds)
    by_version = {v: list(fds) for v, fds in (
        udp_fds.items() if isinstance(udp_fds, Mapping) else [(4, udp_fds)])}
    for version, fds in sorted(by_version.items()):
        if len(fds) != len(tun_fds) or not tun_fds:
            raise ValueError(f"{len(tun_fds)} TUN queue(s) for {len(fds)} IPv{version} UDP "
                             "socket(s)")
    made = []
    try:
        for i, t in enumerate(tun_fds):
            made.append(cls(tun_fd=t, udp_fd=by_version[4][i], **engine_kw))
            made[-1].thread_init = thread_init
            for version, fds in by_version.items():
                if version != 4:
                    made[-1].set_udp(version, fds[i])
        multi = MultiEngine(made)
        if icmp_rate is not None:
            multi.set_icmp_limit(icmp_rate, icmp_burst)
        multi.set_offloads(offloads)
        if coalesce_us:
            multi.set_coalesce(coalesce_us)
        if trace:
            multi.trace(True)
    except BaseException:
        for e in made:
            e.close()
        raise
    return multi
