"""How long a Python process's other threads wait for the interpreter (the GIL), counted from
inside it: put this directory on PYTHONPATH and set FLANNEL_UDP_GIL_PROBE to a directory, and
every Python process started so (the daemons perf/scale.py starts, their children) writes
``<dir>/<pid>.json`` once a second and at exit.

A probe thread sleeps PERIOD_S in a loop; how late it wakes is how long it waited for the
interpreter lock that another thread held: at most the switch interval (sys.getswitchinterval)
while that thread runs bytecode, longer while it is in one C call that keeps the lock (a parse,
a garbage collection). On a shared machine it may also wake late because no core was free; so
each wait also says how much CPU the process used meanwhile (``held``: the smaller of the two,
the part of the wait another thread of ours was working, which is what holding the lock costs).
Each garbage collection is timed too (gc.callbacks). What a question to /metrics waits is a few
of these waits in a row (each syscall of its path gives the lock up and takes it back). Not part
of the daemon: a measuring tool of perf/ only.
"""
import atexit
import gc
import json
import os
import sys
import threading
import time

PERIOD_S = 0.001
LIMITS = (1, 5, 10, 20, 50)
KEPT = 40                                   # the longest waits and collections, with when
_out = os.environ.get("FLANNEL_UDP_GIL_PROBE")


def _probe(out_dir):
    waits = []                  # (held ms, late ms, wall time) of every wait late over 2 ms
    counts = {"woken": 0}
    for what in ("late", "held"):
        counts.update({f"{what}_over_{limit}ms": 0 for limit in LIMITS})
    # (ms, generation, wall time, the collecting thread's CPU ms, objects collected)
    collections = []
    started = {}
    path = os.path.join(out_dir, f"{os.getpid()}.json")

    def on_gc(phase, info):
        if phase == "start":
            started["t"], started["cpu"] = time.perf_counter(), time.thread_time()
        elif "t" in started:
            collections.append((round((time.perf_counter() - started.pop("t")) * 1e3, 3),
                                info.get("generation"), time.time(),
                                round((time.thread_time() - started.pop("cpu")) * 1e3, 3),
                                info.get("collected")))

    def dump():
        doc = {"argv": sys.argv, "pid": os.getpid(),
               "switch_interval_s": sys.getswitchinterval(), "counts": counts,
               "waits": sorted(waits, reverse=True)[:KEPT],
               "all_waits_over_2ms": waits,
               "gc": sorted(collections, reverse=True)[:KEPT],
               "gc_total_ms": round(sum(c[0] for c in collections), 3),
               "gc_count": len(collections), "answers": answers}
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)

    def loop():
        last = time.monotonic()
        while True:
            t0, c0 = time.perf_counter(), time.process_time()
            time.sleep(PERIOD_S)
            late = (time.perf_counter() - t0 - PERIOD_S) * 1e3
            held = min(late, (time.process_time() - c0) * 1e3)
            counts["woken"] += 1
            for limit in LIMITS:
                counts[f"late_over_{limit}ms"] += late > limit
                counts[f"held_over_{limit}ms"] += held > limit
            if late > 2:
                waits.append((round(held, 3), round(late, 3), time.time()))
            if time.monotonic() - last > 1.0:
                last = time.monotonic()
                dump()

    # (wall time done, endpoint, daemon ms, its thread's CPU ms, the process's CPU ms from the
    # accept, ms from the request's arrival to the accept or None)
    answers = []

    def watch_answers():
        """Each answer the daemon's clock counts (daemon/answer_clock.py), once it is imported:
        to be matched with the askers' own times of the same questions."""
        while "dataplane.daemon.answer_clock" not in sys.modules:
            time.sleep(0.01)
        clock = sys.modules["dataplane.daemon.answer_clock"].CLOCK
        done = clock.done

        def counted(endpoint, since, own_cpu=None):
            took = done(endpoint, since, own_cpu)
            answers.append((time.time(), endpoint, round(took * 1e3, 3),
                            None if own_cpu is None else round(own_cpu * 1e3, 3),
                            round((time.process_time() - since[1]) * 1e3, 3),
                            round((since[2] - since[0]) * 1e3, 3) if len(since) > 2 else None))
            return took
        clock.done = counted

    gc.callbacks.append(on_gc)
    atexit.register(dump)
    threading.Thread(target=loop, name="gil-probe", daemon=True).start()
    threading.Thread(target=watch_answers, name="gil-probe-answers", daemon=True).start()


if _out:
    _probe(_out)
