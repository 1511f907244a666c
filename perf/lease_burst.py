"""Lease bursts in a large cluster: how fast two running daemons absorb 1,000 lease puts and deletes
when N peer leases are already in etcd, and what the burst does to a new host and to forwarding.

    python perf/lease_burst.py [--engines c,python] [--peers 0,1000,5000,10000] [--burst 1000]
                               [--timeout 400] [--json perf/results/lease_burst.json]

As root, on the project's testbed (dataplane/testbed): an etcd in the switch namespace, N peer leases
written straight into it in flanneld's format (subnets 10.1.0.0/24 upwards, PublicIPs in 172.16/12 that
never see a packet), then two real daemons h0 and h1 with the engine under test. Per (engine, N):

* start: from the daemons' start to subnet.env, and to READY=1 (sent once the routes to the listed
  peers are in); idle RSS and idle CPU of h0 over 5 s (CPU with its children: the Python engine's
  daemon runs its peer watch in a child process; the child's proportional set size is given apart);
* put burst: 1,000 new leases, each its own put (8 writers at once, so each its own revision and watch
  event); until each daemon's /metrics counts them all (polled every 50 ms from inside its host), and
  the CPU each daemon (with its children) burned meanwhile (per event: CPU / burst);
* a new host h2 started as soon as the writes are acknowledged: from its lease's acquisition (its log
  line) until h0 and h1 reach it and it reaches h0 (pings every 20 ms from before h2 starts; its
  subnet.env names the subnet it takes);
* ping h0 -> h1 every 2 ms throughout (at 10 ms the cores fall into deep idle between pings and the
  idle RTT doubles, 0.4-0.6 ms instead of 0.1-0.2; and a burst's window holds ~25 pings, not ~150):
  RTT while idle, during the same burst written under a prefix
  no daemon watches (what the writer, etcd and the pollers alone cost this machine: the baseline),
  during the put burst, during the deletes;
* delete burst: the same 1,000 leases deleted one by one; until each daemon has N + 2 peers;
* log lines h0 wrote for the put and delete bursts (until 2 s after each was absorbed).

Every wait is bounded by --timeout (a figure that did not finish is printed as "> T s"); every process
is started through the testbed, tracked by PID and removed with it. A 2-core machine shared with other
work gives noisy figures: run the large N a few times and read the spread.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataplane.testbed.overlay import Overlay  # noqa: E402
from dataplane.testbed.peer_count import PeerCount  # noqa: E402

CONFIG = {"Network": "10.0.0.0/8", "SubnetLen": 24, "SubnetMin": "10.250.0.0",
          "SubnetMax": "10.250.255.0", "Backend": {"Type": "udp"}}
DIRECT_CONFIG = dict(CONFIG, Backend={"Type": "udp", "DirectRouting": True})
PRELOAD_BASE = int(ipaddress.IPv4Address("10.1.0.0"))      # N peers: 10.1.0.0/24 upwards
BURST_BASE = int(ipaddress.IPv4Address("10.128.0.0"))      # the burst: 10.128.0.0/24 upwards
FAKE_PEER_BASE = int(ipaddress.IPv4Address("172.16.0.1"))
NEW_HOST_SUBNET = ipaddress.IPv4Network("10.250.200.0/24")   # h0, h1 take random ones in 10.250/16
UNWATCHED_PREFIX = "/bench-unwatched/network"
PING_INTERVAL = 0.002
REACH_INTERVAL = 0.02
LOG_SETTLE_S = 2.0
_TICK = os.sysconf("SC_CLK_TCK")


def compiled() -> str:
    """The byte code of the ``dataplane`` package the daemons run, written now: the installed
    package has it (its postinst compiles it), and a start measured without it compiles ~55
    modules, ~0.15 s of every start at 16,000 leases (perf/README.md#answers-during-start). Its
    directory."""
    import compileall
    import dataplane
    root = os.path.dirname(os.path.abspath(dataplane.__file__))
    compileall.compile_dir(root, quiet=1)
    return root


def leases(base: int, first: int, count: int) -> dict:
    """{subnet: PublicIP} for ``count`` /24s from ``base``; the PublicIPs are distinct and unused."""
    return {ipaddress.IPv4Network((base + (i << 8), 24)): str(ipaddress.IPv4Address(FAKE_PEER_BASE + first + i))
            for i in range(count)}


def children(pid: int) -> list[int]:
    """The daemon's child processes (with the Python engine: its peer watch process)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def cpu_s(pid: int) -> float:
    """CPU seconds of the daemon and its children."""
    total = 0
    for p in [pid] + children(pid):
        with open(f"/proc/{p}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


def runnable_waits_s(pid: int) -> float:
    """Seconds the daemon's threads (and its children's) have spent runnable but not running:
    waiting for a core (/proc/<pid>/task/<tid>/schedstat, its second field, in ns). A thread
    that ended meanwhile is not counted."""
    return _schedstat(pid, 1) / 1e9


def timeslices(pid: int) -> int:
    """How many times the daemon's threads (and its children's) were put on a core (schedstat's
    third field): each wake-up of a thread is one, so a handoff between threads costs two."""
    return _schedstat(pid, 2)


def _schedstat(pid: int, field: int) -> int:
    total = 0
    for p in [pid] + children(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except FileNotFoundError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[field])
            except (FileNotFoundError, ProcessLookupError):
                pass
    return total


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^VmRSS:\s+(\d+)", f.read(), re.M).group(1))


def pss_kb(pid: int) -> int:
    """The process's share of memory: the pages it shares with the daemon (libpython, gRPC's
    library) counted half."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return int(re.search(r"^Pss:\s+(\d+)", f.read(), re.M).group(1))


class Lines:
    """A child's stdout lines, each with the time it was read, collected by a thread."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append((time.time(), line.rstrip("\n")))
                self._cond.notify_all()

    def wait_for(self, predicate, timeout: float):
        """The first line for which ``predicate(line)`` holds, or None after ``timeout``."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for t, line in self.lines[seen:]:
                    if predicate(line):
                        return t, line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.5))


def ping(ov: Overlay, src, dst_ip: str, interval: float, seconds: float) -> Lines:
    return Lines(ov.tb.popen(src, ["ping", "-n", "-D", "-i", str(interval), "-W", "1",
                                   "-w", str(int(seconds)), dst_ip]))


_REPLY = re.compile(r"^\[(\d+\.\d+)\] .* time=([\d.]+) ms")


def replies(pinger: Lines) -> list[tuple[float, float]]:
    """(receive time, RTT ms) of each reply so far."""
    out = []
    for _, line in list(pinger.lines):
        m = _REPLY.match(line)
        if m:
            out.append((float(m.group(1)), float(m.group(2))))
    return out


def rtt_in(rs, start: float, end: float) -> dict:
    window = [r for t, r in rs if start <= t <= end]
    if not window:
        return {"replies": 0}
    window.sort()
    return {"replies": len(window), "avg_ms": round(sum(window) / len(window), 3),
            "p50_ms": window[len(window) // 2], "max_ms": window[-1]}


def wait_file(path: str, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return time.monotonic()
        time.sleep(0.005)
    return None


def log_lines(ov: Overlay, host) -> int:
    return ov.daemon(host).log_text().count("\n")


def since(t, t0):
    return None if t is None or t0 is None else round(t - t0, 3)


def burst_phase(ov, daemons, cmp, target, do, timeout):
    """Run ``do()`` (the writes) while pollers watch each daemon; seconds until each had ``target``."""
    pollers = [PeerCount(ov, d.host, cmp, target, timeout) for d in daemons]
    for p in pollers:                        # their first answer: the count before
        p.wait_first()
    cpu0 = [cpu_s(d.pid) for d in daemons]
    wait0 = [runnable_waits_s(d.pid) for d in daemons]
    slices0 = [timeslices(d.pid) for d in daemons]
    logs0 = log_lines(ov, daemons[0].host)
    res = do()
    t_first = res["t_first"]
    done = [p.reached(timeout) for p in pollers]
    cpu1 = [cpu_s(d.pid) for d in daemons]
    wait1 = [runnable_waits_s(d.pid) for d in daemons]
    slices1 = [timeslices(d.pid) for d in daemons]
    time.sleep(LOG_SETTLE_S)                 # a burst's last summary comes within a second
    return res, {
        "writes_s": round(res["t_last"] - t_first, 3),
        "absorbed_s": [since(t, t_first) for t in done],
        "cpu_s": [round(b - a, 2) for a, b in zip(cpu0, cpu1)],
        "runnable_wait_s": [round(b - a, 3) for a, b in zip(wait0, wait1)],
        "timeslices": [b - a for a, b in zip(slices0, slices1)],
        "log_lines_h0": log_lines(ov, daemons[0].host) - logs0,
        "window": (t_first, max([t for t in done if t is not None], default=time.time())),
    }


def first_replies(ov, pairs, timeout) -> dict:
    """{name: wall-clock time of the first reply} for pings ``{name: (src host, dst ip)}`` sent
    at once, every REACH_INTERVAL s."""
    out: dict = {}

    def one(name, src, dst):
        out[name] = ov.first_reply(src, dst, timeout, REACH_INTERVAL)
    threads = [threading.Thread(target=one, args=(name, *pair)) for name, pair in pairs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def run_case(engine: str, n: int, burst: int, timeout: float, verbose: int) -> dict:
    args = (f"-v={verbose}",) if verbose else ()
    out: dict = {"engine": engine, "peers": n, "burst": burst}
    with Overlay(hosts=0, engine=engine, config=CONFIG, daemon_args=args) as ov:
        writer = ov.lease_writer()
        if n:
            writer.put(leases(PRELOAD_BASE, 0, n), txn=100)
        h0, h1 = ov.add_host(wait=False), ov.add_host(wait=False)
        daemons = [ov.daemon(h0), ov.daemon(h1)]
        env_at = [wait_file(d.subnet_file, 60) for d in daemons]
        for d in daemons:
            ov.wait_ready(d.host, timeout=120)
        out["start_to_subnet_env_s"] = [since(t, d.started) for t, d in zip(env_at, daemons)]
        out["start_to_ready_s"] = [since(d.ready_at, d.started) for d in daemons]
        time.sleep(2.0)
        pid = daemons[0].pid
        c0 = cpu_s(pid)
        time.sleep(5.0)
        out["idle_cpu_pct"] = round((cpu_s(pid) - c0) / 5.0 * 100, 2)
        out["idle_rss_kb"] = rss_kb(pid)
        out["idle_pss_children_kb"] = sum(pss_kb(c) for c in children(pid))

        stable = ping(ov, h0, ov.flannel_ip(h1), PING_INTERVAL, 2 * timeout + 120)
        t_idle = time.time()
        time.sleep(3.0)
        # The same burst where no daemon looks: what the writer, etcd and the measurement (the
        # /metrics pollers) alone cost the machine.
        unwatched = leases(BURST_BASE, 100_000, burst)
        pollers = [PeerCount(ov, d.host, "ge", n + burst + 1, timeout) for d in daemons]
        for p in pollers:
            p.wait_first()
        res = writer.put(unwatched, prefix=UNWATCHED_PREFIX)
        control = (res["t_first"], res["t_last"] + 0.05)
        for p in pollers:
            p.close()
        writer.delete(unwatched, prefix=UNWATCHED_PREFIX)
        time.sleep(1.0)

        new = leases(BURST_BASE, 100_000, burst)
        h2 = ov.add_host(start=False)
        ov.prefer_subnet(h2, NEW_HOST_SUBNET)
        ip2 = str(NEW_HOST_SUBNET.network_address)
        reach: dict = {}
        pingers = threading.Thread(target=lambda: reach.update(first_replies(ov, {
            "h0->h2": (h0, ip2), "h1->h2": (h1, ip2), "h2->h0": (h2, ov.flannel_ip(h0))}, timeout)))

        def put_then_start_h2():
            res = writer.put(new)
            pingers.start()                   # pinging h2 before it even has a lease
            ov.start_daemon(h2, wait=False)   # right after the burst's writes
            return res

        res, put = burst_phase(ov, daemons, "ge", n + burst + 1, put_then_start_h2, timeout)
        out["put"] = {k: v for k, v in put.items() if k != "window"}
        pingers.join()
        d2 = ov.daemon(h2)
        t_lease = ov.lease_acquired_at(h2)
        out["new_host_reach_s"] = {k: since(t, t_lease) for k, t in sorted(reach.items())}
        ov.wait_ready(h2, timeout=timeout)

        _, dele = burst_phase(ov, daemons, "le", n + 2, lambda: writer.delete(new), timeout)
        out["delete"] = {k: v for k, v in dele.items() if k != "window"}
        time.sleep(0.5)
        ov.tb.kill(stable.proc, sig=signal.SIGINT)
        rs = replies(stable)
        out["rtt_idle"] = rtt_in(rs, t_idle, control[0])
        out["rtt_unwatched_puts"] = rtt_in(rs, *control)
        out["rtt_put"] = rtt_in(rs, *put["window"])
        out["rtt_delete"] = rtt_in(rs, *dele["window"])
        errors = [line for d in (*daemons, d2) for line in d.log_text().splitlines()
                  if " ERROR " in line or "Traceback" in line]
        out["daemon_errors"] = errors[:5]
    return out


def fmt(v, timeout):
    if v is None:
        return f"> {timeout:g} s"
    return f"{v:g}"


def table(results: list[dict], timeout: float) -> str:
    """The issue's table, one column per (engine, N)."""
    cols = [f"{r['engine']} N={r['peers']}" for r in results]
    rows = [
        ("start to subnet.env / READY (h0)", lambda r: f"{fmt(r['start_to_subnet_env_s'][0], timeout)} / "
                                                    f"{fmt(r['start_to_ready_s'][0], timeout)} s"),
        ("idle RSS (+ its children's PSS), idle CPU (h0)",
         lambda r: f"{r['idle_rss_kb'] / 1024:.1f} MB (+ {r.get('idle_pss_children_kb', 0) / 1024:.1f}), "
                   f"{r['idle_cpu_pct']} %"),
        ("puts: writes / until h0, h1 have them", lambda r: f"{r['put']['writes_s']} / " + ", ".join(
            fmt(x, timeout) for x in r['put']['absorbed_s']) + " s"),
        ("CPU per daemon on the puts (h0, h1)", lambda r: ", ".join(map(str, r['put']['cpu_s'])) + " s"),
        ("CPU per put event (h0), i.e. events/s per core", lambda r: _per_event(r['put']['cpu_s'][0], r['burst'])),
        ("new host: until h0 / h1 reach it, it reaches h0", lambda r: " / ".join(
            fmt(v, timeout) for v in r['new_host_reach_s'].values()) + " s"),
        ("ping h0->h1 RTT median / avg / max: idle", lambda r: _rtt(r.get('rtt_idle'))),
        ("same, during as many puts nobody watches", lambda r: _rtt(r.get('rtt_unwatched_puts'))),
        ("same, during the puts", lambda r: _rtt(r.get('rtt_put'))),
        ("same, during the deletes", lambda r: _rtt(r.get('rtt_delete'))),
        ("deletes: until h0, h1 have applied them", lambda r: ", ".join(
            fmt(x, timeout) for x in r['delete']['absorbed_s']) + " s"),
        ("CPU per daemon on the deletes (h0, h1)", lambda r: ", ".join(map(str, r['delete']['cpu_s'])) + " s"),
        ("log lines h0 wrote: puts / deletes", lambda r: f"{r['put']['log_lines_h0']} / "
                                                       f"{r['delete']['log_lines_h0']}"),
    ]
    lines = ["| | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, cell in rows:
        lines.append(f"| {name} | " + " | ".join(cell(r) for r in results) + " |")
    return "\n".join(lines)


def _rtt(w) -> str:
    if w is None:
        return "not measured"
    if not w.get("replies"):
        return "no replies"
    return f"{w['p50_ms']} / {w['avg_ms']} / {w['max_ms']} ms ({w['replies']})"


def _per_event(cpu_s: float, events: int) -> str:
    if not cpu_s:
        return "< 0.01 ms"
    return f"{cpu_s / events * 1e3:.2f} ms, {events / cpu_s:,.0f}/s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="c,python")
    ap.add_argument("--peers", default="0,1000,5000,10000")
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=400.0, help="bound of every wait, seconds")
    ap.add_argument("-v", type=int, default=0, help="the daemons' -v")
    ap.add_argument("--json", default=None, help="write the results here too")
    ap.add_argument("--table", default=None, metavar="JSON", help="only print the table of a saved run")
    a = ap.parse_args()
    if a.table:
        with open(a.table) as f:
            saved = json.load(f)
        print(table(saved["results"], a.timeout))
        return 0
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    results = []
    for engine in a.engines.split(","):
        for n in (int(x) for x in a.peers.split(",")):
            t = time.monotonic()
            r = run_case(engine, n, a.burst, a.timeout, a.v)
            r["case_s"] = round(time.monotonic() - t, 1)
            print(json.dumps(r), flush=True)
            results.append(r)
    print()
    print(table(results, a.timeout))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "argv": sys.argv[1:], "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
