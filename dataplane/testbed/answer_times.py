"""How long a daemon takes to answer /metrics and `flannel-udp status`, asked every ~100 ms from
inside its host, for as long as a scenario runs.

/metrics listens in the host's namespace and the status socket is root's; a process per question
would measure Python's start, not the daemon. So :class:`AnswerTimes` runs one small child in the
host that asks both in turn, every ``period`` seconds, and prints one line per question:
``<time.time() sent> <metrics|status> <milliseconds, or -1: no answer>``. A question is bounded
(``ASK_TIMEOUT_S``); one that found nothing listening yet (a daemon still starting) counts as
"not up", not as an answer time. The status question reads the same document over the same
socket as `flannel-udp status` (daemon/status.py ``query``), without the CLI's own start.
"""
from __future__ import annotations

import sys
import threading

from .cpu_weight import CpuGroup

PERIOD_S = 0.1
ASK_TIMEOUT_S = 5.0

_CHILD = r"""
import socket, sys, time, urllib.request
url, status_path, period, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
def metrics():
    urllib.request.urlopen(url, timeout=timeout).read()
def status():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect(status_path)
        got = b""
        while True:
            data = s.recv(65536)
            if not data:
                break
            got += data
        if not got:
            raise ConnectionError("no answer")
    finally:
        s.close()
while True:
    for name, ask in (("metrics", metrics), ("status", status)):
        t0 = time.time()
        try:
            ask()
            ms = (time.time() - t0) * 1e3
        except Exception as e:
            # nothing listens yet (urllib wraps the refusal)
            up = not isinstance(getattr(e, "reason", e), (ConnectionRefusedError, FileNotFoundError))
            ms = -1.0 if up else None
        if ms is not None:
            print(t0, name, round(ms, 3), flush=True)
    time.sleep(period)
"""


class AnswerTimes:
    """Asks the daemon of ``host`` on an :class:`~dataplane.testbed.overlay.Overlay` until
    :meth:`close`; :meth:`summary` gives the answer times of a time window."""

    def __init__(self, overlay, host, period: float = PERIOD_S, cpu_weight: int | None = None):
        self.seen: list[tuple[float, str, float]] = []      # (wall-clock time sent, kind, ms)
        self._lock = threading.Lock()
        self._tb = overlay.tb
        url = f"http://127.0.0.1:{overlay.healthz_port}/metrics"
        argv = [sys.executable, "-c", _CHILD, url, overlay.status_socket(host), str(period),
                str(ASK_TIMEOUT_S)]
        self._group = CpuGroup(cpu_weight) if cpu_weight is not None else None
        self.proc = overlay.tb.popen(host, argv, wrap=self._group and self._group.wrap)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            t, kind, ms = line.split()
            with self._lock:
                self.seen.append((float(t), kind, float(ms)))

    def asked(self, start: float, end: float) -> list[tuple[str, float]]:
        """(kind, ms; -1: failed) of the questions sent within [start, end] (wall-clock)."""
        with self._lock:
            return [(kind, ms) for t, kind, ms in self.seen if start <= t <= end]

    def summary(self, start: float, end: float) -> dict:
        """:func:`summary` of the questions sent within [start, end]."""
        return summary(self.asked(start, end))

    def close(self) -> None:
        """Stop asking (the child is killed by PID)."""
        self._tb.kill(self.proc)
        if self._group is not None:
            self._group.close()


def summary(asked) -> dict:
    """{kind: {"asked", "failed", "median_ms", "p99_ms", "max_ms"}} of questions (kind, ms), of one daemon or
    several; a failed question (no answer within ASK_TIMEOUT_S, an error) counts apart, not in
    the times."""
    out = {}
    for kind in ("metrics", "status"):
        times = sorted(ms for k, ms in asked if k == kind and ms >= 0)
        failed = sum(1 for k, ms in asked if k == kind and ms < 0)
        out[kind] = {"asked": len(times) + failed, "failed": failed,
                     "median_ms": times[len(times) // 2] if times else None,
                     "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] if times else None,
                     "max_ms": times[-1] if times else None}
    return out


def daemon_answers(ov, host) -> dict:
    """{endpoint: {le: answers (cumulative)}} of the daemon's own clock
    (flannel_udp_answer_seconds: accept -> its reply's last byte handed to the kernel); empty
    when the daemon has none (a checkout from before it)."""
    out: dict = {}
    try:
        samples = ov.metrics(host)
    except Exception:                       # gone, or not answering: nothing to say
        return out
    for key, value in samples.items():
        if key.startswith("flannel_udp_answer_seconds_bucket{"):
            labels = dict(part.split("=", 1) for part in key[key.index("{") + 1:-1].split(","))
            le = labels["le"].strip('"')
            out.setdefault(labels["endpoint"].strip('"'), {})[float(le)] = value
    return out


def daemon_over(before: list, after: list, endpoint: str, bound_s: float = 0.05) -> dict:
    """{"answers", "over"}: the daemons' answers of ``endpoint`` between two lists of
    :func:`daemon_answers` (one a daemon, in the same order; a daemon missing before counts
    from 0), and how many of them took over ``bound_s`` by the daemon's own clock."""
    answers = over = 0
    for b, a in zip(before, after):
        hist_a, hist_b = a.get(endpoint, {}), b.get(endpoint, {})
        if not hist_a:
            continue
        total = hist_a[float("inf")] - hist_b.get(float("inf"), 0)
        within = hist_a.get(bound_s, 0) - hist_b.get(bound_s, 0)
        answers, over = answers + total, over + total - within
    return {"answers": int(answers), "over": int(over)}
