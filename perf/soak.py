"""Soak: two daemons that stay forward a paced stream while other hosts join and leave (root).

    python perf/soak.py [--minutes 10] [--rate 2000] [--size 200] [--churn-every 5]
                        [--engines c,python] [--out perf/results/soak.json]

::

      a (stable, engine c)   -- udpgen stream a -> b, paced, in 60 s segments -->   b (stable, python)
           |  flannel-udp run                                                      |
      -----+----- bridge, switch netns: etcd ---+---------------+------------------+-----
                                            c1 (joins)      c2 (joins) ...  every --churn-every s one
                                            pings a and b,  leaves (lease    host joins (alternating
                                            then leaves     deleted)         engines) and the oldest leaves

Why this rate: 2000 datagrams/s of 200 B (3.2 Mbit/s) is under 2 % of the slowest engine's no-drop
rate on this machine (Python, ~130 kpps, docs/design.md), so a correct overlay loses nothing to its own
limits; over 10 minutes it is 1.2 M datagrams, enough to see a loss rate of 1e-5; and it costs a few
percent of one core on a machine shared with other work.

Every few seconds it samples the stable daemons' RSS, open fds and threads (the summary's rss_trend is
the least-squares slope of RSS in kB/min with its standard error: "no growth detected" within two
standard errors of 0); around each segment their engine counters (/metrics) and the kernel's own drop
counters. Losses are attributed hop by hop:
  * a's engine found no route to b (drop_no_route at a): the control plane lost a peer that stayed;
  * a's flannel0 TX queue full / b's socket receive buffer full / softnet backlog drops: a process did
    not get the CPU in time (contention on a shared machine), not a bug of the overlay.
Prints a summary and writes everything as JSON. Stops by itself after --minutes (bounded).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import threading
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataplane.host.atomicfile import write_atomic  # noqa: E402
from dataplane.bench.build import build_udpgen  # noqa: E402
from dataplane.bench.trend import growth  # noqa: E402
from dataplane.testbed.overlay import Overlay  # noqa: E402

SINK_PORT = 9500
SAMPLE_EVERY_S = 5.0
SEGMENT_S = 60.0                 # udpgen bounds each run to 300 s: the stream is chained segments
MAX_CHURNERS = 2


def proc_sample(pid: int) -> dict:
    """RSS (kB), open fds and threads of a process, from /proc."""
    out = {"rss_kb": None, "fds": None, "threads": None}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["rss_kb"] = int(line.split()[1])
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return out


def kernel_drops(ov, host) -> dict:
    """The drop counters that mean "a process was too slow", inside the host's namespace."""
    out = {}
    snmp = ov.exec(host, ["cat", "/proc/net/snmp"]).stdout.splitlines()
    udp = [line.split()[1:] for line in snmp if line.startswith("Udp:")]
    if len(udp) == 2:
        row = dict(zip(udp[0], udp[1]))
        out["udp_rcvbuf_errors"] = int(row.get("RcvbufErrors", 0))
        out["udp_sndbuf_errors"] = int(row.get("SndbufErrors", 0))
    r = ov.exec(host, ["ip", "-s", "-j", "link", "show", "flannel0"])
    try:
        st = json.loads(r.stdout)[0]["stats64"]
        out["flannel0_tx_dropped"] = st["tx"]["dropped"]      # TUN queue full: engine read too late
        out["flannel0_rx_dropped"] = st["rx"]["dropped"]
    except (ValueError, IndexError, KeyError):
        pass
    with open("/proc/net/softnet_stat") as f:               # per CPU, machine-wide
        out["softnet_dropped"] = sum(int(line.split()[1], 16) for line in f)
    return out


def engine_counters(ov, host) -> dict:
    m = ov.metrics(host)
    out = {}
    for k, v in m.items():
        mm = re.fullmatch(r'flannel_udp_(packets|drops)_total\{\w+="(\w+)"\}', k)
        if mm:
            out[f"{mm.group(1)}:{mm.group(2)}"] = int(v)
    for k in ("flannel_udp_peers", "flannel_udp_bad_leases"):
        if k in m:
            out[k[len("flannel_udp_"):]] = int(m[k])
    return out


GAUGES = ("peers", "bad_leases")


def delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after if k not in GAUGES}


class Churn(threading.Thread):
    """Every `every` s: a host joins (engines alternate), pings both stable hosts, and the oldest
    churner beyond MAX_CHURNERS leaves (daemon stopped with SIGTERM, lease deleted)."""

    def __init__(self, ov, stable, every: float, engines, stop: threading.Event):
        super().__init__(name="churn", daemon=True)
        self.ov, self.stable, self.every, self.engines, self.stop_ev = ov, stable, every, engines, stop
        self.events: list[dict] = []
        self.errors: list[str] = []
        self.live: list = []

    def _leave(self, h, t0):
        ev = {"t": round(time.monotonic() - t0, 1), "leave": h.name}
        try:
            d = self.ov.daemon(h)
            ev["engine"] = d.engine
            ev["rc"] = self.ov.stop_daemon(h)      # SIGTERM: 0 expected
            self.ov.remove_host(h)                  # namespace gone, lease deleted
            if ev["rc"] != 0:
                self.errors.append(f"{h.name} ({ev['engine']}) exited with {ev['rc']}")
        except Exception as e:
            self.errors.append(f"leave {h.name}: {e}")
        self.events.append(ev)

    def run(self):
        t0 = time.monotonic()
        n = 0
        while not self.stop_ev.is_set():
            start = time.monotonic()
            engine = self.engines[n % len(self.engines)]
            n += 1
            ev = {"t": round(start - t0, 1), "join": None, "engine": engine}
            try:
                h = self.ov.add_host(engine=engine, wait=True)
                ev["join"] = h.name
                ev["ready_s"] = round(time.monotonic() - start, 2)
                self.live.append(h)
                ok = all(self.ov.reachable(h, self.ov.flannel_ip(s), 10) and
                         self.ov.reachable(s, self.ov.flannel_ip(h), 10) for s in self.stable)
                ev["reachable"] = ok
                ev["reachable_s"] = round(time.monotonic() - start, 2)
                if not ok:
                    self.errors.append(f"{h.name} ({engine}) not reachable both ways within 10 s")
            except Exception as e:
                self.errors.append(f"join ({engine}): {e}")
            self.events.append(ev)
            while len(self.live) > MAX_CHURNERS:
                self._leave(self.live.pop(0), t0)
            self.stop_ev.wait(max(0.0, self.every - (time.monotonic() - start)))

    def finish(self):
        t0 = time.monotonic()
        while self.live:
            self._leave(self.live.pop(0), t0)


def run_segment(ov, udpgen, a, b, *, rate: int, size: int, seconds: float) -> dict:
    tag = random.getrandbits(31)
    dst, src = ov.flannel_ip(b), ov.flannel_ip(a)
    sink = ov.tb.popen(b, [udpgen, "sink", "--bind", f"{dst}:{SINK_PORT}", "--tag", str(tag),
                           "--deadline", f"{seconds + 20:.0f}", "--idle-ms", "500",
                           "--batch", "64"], text=True)
    try:
        if sink.stdout.readline().strip() != "READY":
            raise RuntimeError(f"sink did not start: {sink.stderr.read()}")
        count = int(rate * seconds)
        r = ov.exec(a, [udpgen, "send", "--dst", f"{dst}:{SINK_PORT}", "--src", src, "--size",
                        str(size), "--rate", str(rate), "--count", str(count), "--duration",
                        f"{seconds + 5:.0f}", "--tag", str(tag), "--batch", "32"],
                    timeout=seconds + 30)
        sent = json.loads(r.stdout.strip().splitlines()[-1])
        sink.send_signal(signal.SIGUSR1)
        out, _ = sink.communicate(timeout=15)
        got = json.loads(out.strip().splitlines()[-1])
    finally:
        ov.tb.kill(sink)
    return {"sent": sent["sent"], "send_errors": sent["errors"], "received": got["received"],
            "rate_pps": sent["rate_pps"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=int, default=2000, help="datagrams/s of the stream (<= 20000)")
    p.add_argument("--size", type=int, default=200, help="UDP payload bytes")
    p.add_argument("--churn-every", type=float, default=5.0, help="seconds between joins")
    p.add_argument("--engines", default="c,python", help="stable a,b engines (churners alternate)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "results", "soak.json"))
    o = p.parse_args(argv)
    if os.geteuid() != 0:
        print("soak: needs root (network namespaces, TUN devices)", file=sys.stderr)
        return 2
    if not 1 <= o.rate <= 20000 or not 0 < o.minutes <= 120:
        print("soak: --rate 1..20000 and --minutes up to 120 (bounded on purpose)", file=sys.stderr)
        return 2
    ea, eb = (o.engines.split(",") + ["python"])[:2]
    udpgen = str(build_udpgen())
    total_s = o.minutes * 60
    started = datetime.now(timezone.utc)
    result = {"started": started.isoformat(timespec="seconds"), "args": vars(o), "samples": [],
              "segments": [], "churn": [], "errors": []}
    stop = threading.Event()
    with Overlay(hosts=0) as ov:
        a = ov.add_host(engine=ea, wait=False)
        b = ov.add_host(engine=eb, wait=False)
        for h in (a, b):
            ov.wait_ready(h)
        pids = {"a": ov.daemon(a).pid, "b": ov.daemon(b).pid}
        t0 = time.monotonic()

        def sample():
            s = {"t": round(time.monotonic() - t0, 1), "loadavg": os.getloadavg()[0]}
            for k, pid in pids.items():
                s[k] = proc_sample(pid)
            result["samples"].append(s)

        def sampler():
            while not stop.wait(SAMPLE_EVERY_S):
                sample()

        sample()
        threading.Thread(target=sampler, name="sampler", daemon=True).start()
        churn = Churn(ov, [a, b], o.churn_every, [ea, eb], stop)
        churn.start()
        try:
            while True:
                left = total_s - (time.monotonic() - t0)
                if left < 5:
                    break
                seg_s = min(SEGMENT_S, left - 2)
                before = {h.name: (engine_counters(ov, h), kernel_drops(ov, h)) for h in (a, b)}
                seg = {"t": round(time.monotonic() - t0, 1)}
                try:
                    seg.update(run_segment(ov, udpgen, a, b, rate=o.rate, size=o.size,
                                           seconds=seg_s))
                except Exception as e:      # the run ends, its figures so far still written
                    result["errors"].append(f"segment at {seg['t']} s: {e!r}")
                    print(f"soak: segment at {seg['t']} s failed, stopping: {e!r}", flush=True)
                    break
                for h in (a, b):
                    eng, kern = engine_counters(ov, h), kernel_drops(ov, h)
                    seg[h.name] = {"engine": delta(eng, before[h.name][0]),
                                   "kernel": delta(kern, before[h.name][1]),
                                   "peers": eng.get("peers")}
                seg["lost"] = seg["sent"] - seg["received"]
                result["segments"].append(seg)
                print(f"[{seg['t']:6.0f} s] sent {seg['sent']} received {seg['received']} lost "
                      f"{seg['lost']}; a no_route {seg[a.name]['engine'].get('drops:no_route', 0)}; "
                      f"RSS a/b {result['samples'][-1]['a']['rss_kb']}/"
                      f"{result['samples'][-1]['b']['rss_kb']} kB; churn events "
                      f"{len(churn.events)}", flush=True)
        finally:
            stop.set()
            churn.join(60)
            churn.finish()
            sample()
        result["churn"] = churn.events
        result["errors"] += churn.errors
        for k, h in (("a", a), ("b", b)):
            d = ov.daemon(h)
            text = d.log_text()
            result[f"{k}_daemon"] = {"host": h.name, "engine": d.engine, "running": d.running(),
                                     "tracebacks": text.count("Traceback"),
                                     "errors": sum(" ERROR " in line for line in text.splitlines())}
    result["summary"] = summarize(result)
    os.makedirs(os.path.dirname(o.out) or ".", exist_ok=True)
    write_atomic(o.out, json.dumps(result, indent=1))
    for k, v in result["summary"].items():
        print(f"{k}: {json.dumps(v, ensure_ascii=False)}")
    print(f"written: {o.out}")
    return 0 if result["summary"]["ok"] else 1


def summarize(r: dict) -> dict:
    segs, samples = r["segments"], r["samples"]
    sent = sum(s["sent"] for s in segs)
    lost = sum(s["lost"] for s in segs)
    ha, hb = r["a_daemon"]["host"], r["b_daemon"]["host"]

    def tot(host, part, key):
        return sum(s[host][part].get(key, 0) for s in segs)
    no_route = tot(ha, "engine", "drops:no_route")
    contention = {"a_flannel0_tx_dropped": tot(ha, "kernel", "flannel0_tx_dropped"),
                  "b_udp_rcvbuf_errors": tot(hb, "kernel", "udp_rcvbuf_errors"),
                  "softnet_dropped (machine)": tot(ha, "kernel", "softnet_dropped")}
    first, last = samples[0], samples[-1]
    joins = [e for e in r["churn"] if "join" in e]
    summary = {
        "duration_s": last["t"], "stream_sent": sent, "stream_lost": lost,
        "loss_ratio": round(lost / sent, 7) if sent else None,
        "segments_with_loss": sum(1 for s in segs if s["lost"]),
        "lost_to_missing_route_at_a": no_route,
        "contention_drops": contention,
        "engine_drops": {h: {k: tot(h, "engine", k) for k in sorted({k for s in segs
                                                                     for k in s[h]["engine"]})
                             if k.startswith("drops:") and tot(h, "engine", k)}
                         for h in (ha, hb)},
        # the stream's own hops; the churners' pings add a few packets to these deltas
        "hops": {"a_tun_rx": tot(ha, "engine", "packets:tun_rx"),
                 "a_udp_tx": tot(ha, "engine", "packets:udp_tx"),
                 "b_udp_rx": tot(hb, "engine", "packets:udp_rx"),
                 "b_tun_tx": tot(hb, "engine", "packets:tun_tx")},
        "rss_kb": {k: [first[k]["rss_kb"], last[k]["rss_kb"]] for k in ("a", "b")},
        "fds": {k: [first[k]["fds"], last[k]["fds"]] for k in ("a", "b")},
        "threads": {k: [first[k]["threads"], last[k]["threads"]] for k in ("a", "b")},
        "rss_kb_max": {k: max(s[k]["rss_kb"] or 0 for s in samples) for k in ("a", "b")},
        # first/last alone would read one allocator step as a leak: a line through every sample
        "rss_trend": {k: growth([s["t"] for s in samples], [s[k]["rss_kb"] for s in samples])
                      for k in ("a", "b")},
        "churn_joins": len(joins),
        "churn_unreachable": sum(1 for e in joins if e.get("reachable") is False),
        "churn_ready_s_max": max((e.get("ready_s", 0) for e in joins), default=None),
        "churn_nonzero_exits": [e for e in r["churn"] if e.get("rc") not in (None, 0)],
        "stable_daemons": {k: r[f"{k}_daemon"] for k in ("a", "b")},
        "errors": r["errors"],
        "loadavg": [first["loadavg"], last["loadavg"], max(s["loadavg"] for s in samples)],
    }
    # Each hop's count must follow from the previous one and the drops between them; the churners'
    # pings (one request and one reply per stable host and join) are the only other traffic.
    h = summary["hops"]
    slack = 4 * len(joins) + 8
    drops_a = sum(summary["engine_drops"][ha].values())
    drops_b = sum(summary["engine_drops"][hb].values())
    summary["counters_consistent"] = (
        h["a_tun_rx"] >= sent and abs(h["a_tun_rx"] - h["a_udp_tx"] - drops_a) <= slack
        and abs(h["b_udp_rx"] - h["b_tun_tx"] - drops_b) <= slack
        and h["b_tun_tx"] + slack >= sent - lost)
    summary["ok"] = (all(d["running"] and not d["tracebacks"] for d in summary["stable_daemons"].values())
                     and not r["errors"] and no_route == 0 and summary["counters_consistent"]
                     and not summary["churn_nonzero_exits"])
    return summary


if __name__ == "__main__":
    sys.exit(main())
