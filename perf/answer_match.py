"""Where a slow answer's time went: each question perf/scale.py's askers timed, beside the
daemon's own clock of the same answer (daemon/answer_clock.py: from the request's arrival in the
kernel, or the status socket's accept, to the reply's last byte handed to the kernel), its
answering thread's CPU, the whole process's CPU from the accept on, and (HTTP) how long the
request waited for the accept.

    python perf/scale.py --engines c --peers 16000 --burst 5000 --runs 1 --no-direct \\
        --gil-probe /tmp/gil --json /tmp/scale.json
    python perf/answer_match.py /tmp/scale.json [--over 20]

Needs a run with ``--gil-probe`` (its sitecustomize records every answer the daemon counts) of a
tree whose daemon has the clock. A question is matched with the daemon's answer of the same
endpoint that was done within the question's own time (the harness's peer counts are /metrics
answers too, never within an asker's question unless they overlap: the nearest start wins).
Read: client - daemon = the asker's own part (its connect, its turn on the cores after the
reply); daemon - process CPU = time when no thread of the daemon ran (the machine's cores);
process CPU - own = the daemon's other threads working meanwhile (the interpreter's lock held
by them, or the engine's threads).
"""
from __future__ import annotations

import argparse
import json


def matched(run: dict) -> list:
    """[(client ms, host, window, kind, daemon's record or None)], slowest first."""
    pids, probe, windows = run["daemon_pids"], run["gil_probe"], run["windows"]
    rows = []
    for host, seen in run["asked_each"].items():
        recs = probe.get(str(pids[host]), {}).get("answers", [])
        for t0, kind, ms in seen:
            window = next((w for w, (a, b) in windows.items()
                           if a <= t0 <= b and (w == "start" or host != "h2")), None)
            if window is None or ms < 0:
                continue
            cand = [r for r in recs if r[1] == kind and t0 <= r[0] <= t0 + ms / 1e3 + 0.002]
            best = min(cand, key=lambda r: abs(r[0] - r[2] / 1e3 - t0), default=None)
            rows.append((ms, host, window, kind, best))
    return sorted(rows, key=lambda r: -r[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="perf/scale.py --json of a run with --gil-probe")
    ap.add_argument("--over", type=float, default=20.0, help="list the questions over this (ms)")
    a = ap.parse_args()
    doc = json.load(open(a.json))
    for engine, runs in doc["runs"].items():
        for i, run in enumerate(runs, 1):
            if "asked_each" not in run:
                print(f"{engine} run {i}: no questions recorded (run it with --gil-probe)")
                continue
            rows = matched(run)
            print(f"{engine} run {i}: client ms, host, window, kind | daemon ms, its thread's "
                  f"CPU ms, the process's CPU ms from the accept, ms from arrival to accept")
            for ms, host, window, kind, r in rows:
                if ms < a.over:
                    break
                print(f"  {ms:7.1f} {host} {window:5} {kind:7} | "
                      + ("no record" if r is None else
                         f"{r[2]:7.1f} {r[3]} {r[4]}" + (f" {r[5]}" if len(r) > 5 else "")))
            for kind in ("metrics", "status"):
                for window in ("burst", "start"):
                    xs = [(ms, r) for ms, h, w, k, r in rows if k == kind and w == window]
                    slow = [x for x in xs if x[0] > 50]
                    print(f"  {kind} {window}: {len(xs)} asked, {len(slow)} over 50 ms for the "
                          f"asker, {sum(1 for _, r in slow if r and r[2] > 50)} of them over 50 "
                          "ms for the daemon")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
