"""Results: rows, ratios, the table, the JSON and the plot.

(Over 450 lines as one piece: the table, the JSON and the plot read the same rows and ratios by
the same keys, defined once at its top.)

``rows`` has, per path, one row per UDP payload size (64, 1400) and one row
with ``"size": null`` for what is not a UDP size (TCP, idle latency). Every
figure is the median over the trials; ``detail`` (written to results.json, not
to ``--json``) keeps min, max and every trial's value. A path skipped (what it
needs was not given) has its rows all null, with ``"skipped"``: the reason.
Ratios carry a 95 % interval from the trials (``ratio_ci``). An inner-IPv6 path (``c6``,
``python6``, ``vxlan6``: families.py) has rows of its own, as any path, and its ratios are to its
IPv4 twin (``ratios["c6"]["c"]``: IPv6 / IPv4 of the same engine in the same run) and, for the
engines, to ``vxlan6``. That pair also has the ``*_same_forwarders`` figures (PAIRED_FIGURES):
each trial ran the IPv6 path's one TCP stream and floods beside the same of inner IPv4 through
its own forwarders, and a figure is the median of those per-trial ratios (``paired_ci`` its
interval), free of what moves between the minutes that separate a path from its twin.
"""
from __future__ import annotations

import numpy as np

from .families import IPV6_TWINS, KERNEL6

PERCENTILES = ("p50", "p90", "p99", "p999", "max")
RTT_KEYS = tuple(f"rtt_{p}_us" for p in PERCENTILES) + ("rtt_samples",)
COMMON_RTT_KEYS = tuple(f"common_rtt_{p}_us" for p in PERCENTILES)
ROW_KEYS = ("path", "size", "ndr_pps", "pdr_pps", "flood_rx_pps", "flood_loss", "tcp_gbps",
            "tcp4_gbps", "tcp_rev_gbps", *RTT_KEYS, "common_load_pps", *COMMON_RTT_KEYS,
            "machine_cpu_ns_per_packet", "cpu_ns_per_packet", "syscalls_per_packet")
METRICS = ROW_KEYS[2:]
# Figures compared between paths, as (ratio name, row size, row key).
RATIO_FIGURES = (("ndr_pps_64", 64, "ndr_pps"), ("ndr_pps_1400", 1400, "ndr_pps"),
                 ("pdr_pps_64", 64, "pdr_pps"), ("pdr_pps_1400", 1400, "pdr_pps"),
                 ("flood_rx_pps_64", 64, "flood_rx_pps"),
                 ("flood_rx_pps_1400", 1400, "flood_rx_pps"),
                 ("tcp_gbps", None, "tcp_gbps"), ("tcp4_gbps", None, "tcp4_gbps"),
                 ("tcp_rev_gbps", None, "tcp_rev_gbps"),
                 # lower is better: the whole machine's CPU per packet, at the PDR
                 ("machine_cpu_64", 64, "machine_cpu_ns_per_packet"),
                 # lower is better: the 64 B round trip's p99 under half the path's own PDR, and
                 # at the run's common load (the latency goal is stated as these ratios)
                 ("rtt_p99_64", 64, "rtt_p99_us"), ("common_rtt_p99_64", 64, "common_rtt_p99_us"))
# An inner-IPv6 path's per-trial ratios of its one TCP stream, and of its floods' received
# rate, to the same of inner IPv4 through its own forwarders right beside it (runner.py), and
# the figures that ratios() makes of them in the pair with the IPv4 twin, as (figure, row size,
# key): the median of the per-trial ratios.
PAIRED_TCP_KEY = "tcp_family_ratio"
PAIRED_FLOOD_KEY = "flood_family_ratio"
# Per trial that has a PAIRED_FLOOD_KEY ratio (None in the others): the IPv6 flood lost < 0.5 %,
# so its rate is its generator's, at most what the forwarders carry, and the ratio a lower bound.
PAIRED_FLOOD_LOWER_KEY = "flood_family_ratio_lower_bound"
PAIRED_FIGURES = (("tcp_gbps_same_forwarders", None, PAIRED_TCP_KEY),
                  ("flood_rx_pps_64_same_forwarders", 64, PAIRED_FLOOD_KEY),
                  ("flood_rx_pps_1400_same_forwarders", 1400, PAIRED_FLOOD_KEY))
CI_KEY = "ci95"                 # ratios[path][ref][CI_KEY][figure] = [low, high] or None
LOWER_KEY = "lower_bounds"      # ratios[path][ref][LOWER_KEY]: figures that are lower bounds
CI_RESAMPLES = 2000
CI_SEED = 2544                  # fixed: the same trials always give the same interval
CI_MIN_TRIALS = 3               # fewer trials per path: no interval (a quick run has one)


def summarize(values) -> dict | None:
    """Median, min and max of the trials that produced a value. The median
    is the 50th percentile by linear interpolation (numpy's "linear"
    method): the middle trial, or the mean of the middle two; always a float."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    a = np.asarray(vals, dtype=float)
    return {"median": float(np.percentile(a, 50, method="linear")), "min": min(vals), "max": max(vals),
            "trials": vals}


def build(samples: dict, paths, sizes, machine: dict, skipped: dict | None = None) -> dict:
    """``samples[path][size][metric]`` = list of per-trial values (size None
    for the TCP/idle row); ``skipped[path]`` = why a path did not run.
    Returns {"rows", "ratios", "machine", "detail"}."""
    skipped = skipped or {}
    rows, detail = [], []
    for path in paths:
        for size in list(sizes) + [None]:
            per = samples.get(path, {}).get(size, {})
            row = {"path": path, "size": size}
            det = {"path": path, "size": size}
            for key in METRICS:
                s = summarize(per.get(key, []))
                row[key] = _round(s["median"]) if s else None
                if s:
                    det[key] = {k: (_round(v) if k != "trials" else [_round(x) for x in v])
                                for k, v in s.items()}
            for key, vals in per.items():
                if key not in METRICS:
                    s = summarize(vals) if all(
                        (isinstance(v, (int, float)) and not isinstance(v, bool)) or v is None
                        for v in vals) else None
                    det[key] = ({k: (_round(v) if k != "trials" else [_round(x) for x in v])
                                 for k, v in s.items()} if s else vals)
            if path in skipped:
                row["skipped"] = det["skipped"] = skipped[path]
            rows.append(row)
            detail.append(det)
    return {"rows": rows, "ratios": ratios(rows, detail), "machine": machine, "detail": detail}


def _round(v):
    if isinstance(v, float):
        return round(v, 4) if abs(v) < 10 else round(v, 1)
    return v


def _get(rows, path, size, key):
    for r in rows:
        if r["path"] == path and r["size"] == size:
            return r.get(key)
    return None


def ratios(rows, detail=None) -> dict:
    """{engine: {"vxlan": {figure: x, ..., "ci95": {figure: [lo, hi] | None}}, "direct": ...},
    "vxlan": {"direct": ...}}: each path's figure divided by the reference path's, from the
    same run, with its interval from the trials in ``detail`` (``ratio_ci``). An inner-IPv6
    path's references are its IPv4 twin and, for an engine, ``vxlan6``: {"c6": {"c": ...,
    "vxlan6": ...}, "vxlan6": {"vxlan": ...}}."""
    out = {}
    rows = [r for r in rows if not r.get("skipped")]
    trials = {(d["path"], d["size"]): d for d in detail or []}
    present = {r["path"] for r in rows}
    order = list(dict.fromkeys(r["path"] for r in rows))
    engines = [p for p in order if p not in ("direct", "vxlan") and p not in IPV6_TWINS]
    pairs = [(p, ref) for p in engines for ref in ("vxlan", "direct")]
    pairs.append(("vxlan", "direct"))
    for p in (p for p in order if p in IPV6_TWINS):
        pairs += [(p, IPV6_TWINS[p])] + ([(p, KERNEL6)] if p != KERNEL6 else [])
    for path, ref in pairs:
        # the figures of an IPv6 path beside its own IPv4 need no twin in the run
        if path not in present or (ref not in present and IPV6_TWINS.get(path) != ref):
            continue
        figs, cis = {}, {}
        for name, size, key in RATIO_FIGURES:
            num, den = _get(rows, path, size, key), _get(rows, ref, size, key)
            figs[name] = round(num / den, 3) if num is not None and den else None
            cis[name] = ratio_ci(_trials(trials.get((path, size)), key),
                                 _trials(trials.get((ref, size)), key))
        if IPV6_TWINS.get(path) == ref:
            for name, size, key in PAIRED_FIGURES:
                det = trials.get((path, size))
                per_trial = [v for v in _trials(det, key) if v is not None]
                if per_trial:           # none in a path run before the bench measured them
                    figs[name] = round(float(np.median(per_trial)), 3)
                    cis[name] = paired_ci(per_trial)
                    # a median of values some of which are lower bounds is one too
                    # (flags are kept as the trials' list: build() summarizes numbers only)
                    flags = (det or {}).get(PAIRED_FLOOD_LOWER_KEY) or []
                    if key == PAIRED_FLOOD_KEY and any(f is True for f in flags):
                        figs.setdefault(LOWER_KEY, []).append(name)
        figs[CI_KEY] = cis
        out.setdefault(path, {})[ref] = figs
    return out


def _trials(det: dict | None, key: str) -> list:
    s = (det or {}).get(key)
    return list(s["trials"]) if isinstance(s, dict) else []


def ratio_ci(num_trials, den_trials, *, resamples: int = CI_RESAMPLES,
             seed: int = CI_SEED) -> list[float] | None:
    """95 % interval of median(num) / median(den): a percentile bootstrap of the ratio of
    medians, each path's trials resampled on their own (trial i of two paths ran minutes
    apart: nothing pairs them), ``resamples`` times with a fixed seed.

    Why this: the ratio reported is of medians, which one stalled trial on a shared machine
    does not move; the bootstrap interval is of that same statistic and assumes no
    distribution of the trials. A t interval on log values would be about the ratio of
    geometric means (which that stalled trial drags) and assumes log-normal trials. Its
    limit: with 5 trials a resampled median can only be one of the trials' values, so the
    interval is coarse and rather narrow than wide; one clear of 1.0 is evidence, not proof.
    None with fewer than CI_MIN_TRIALS trials on either side or a zero denominator."""
    a, b = _values(num_trials), _values(den_trials)
    if a.size < CI_MIN_TRIALS or b.size < CI_MIN_TRIALS:
        return None
    rng = np.random.default_rng(seed)
    med_a, med_b = _boot_medians(a, rng, resamples), _boot_medians(b, rng, resamples)
    keep = med_b != 0
    if not keep.any():
        return None
    return _interval(med_a[keep] / med_b[keep])


def paired_ci(per_trial, *, resamples: int = CI_RESAMPLES, seed: int = CI_SEED
              ) -> list[float] | None:
    """95 % interval of the median of per-trial ratios, each trial's two figures measured
    side by side (so, unlike ratio_ci's, the trials are resampled as pairs): the same
    percentile bootstrap, with the same limits. None with fewer than CI_MIN_TRIALS."""
    a = _values(per_trial)
    if a.size < CI_MIN_TRIALS:
        return None
    return _interval(_boot_medians(a, np.random.default_rng(seed), resamples))


def _values(trials) -> np.ndarray:
    return np.asarray([v for v in trials if v is not None], dtype=float)


def _boot_medians(a: np.ndarray, rng, resamples: int) -> np.ndarray:
    """The medians of ``resamples`` resamples of ``a`` (with replacement, its own size)."""
    return np.median(a[rng.integers(0, a.size, (resamples, a.size))], axis=1)


def _interval(stats: np.ndarray) -> list[float]:
    """The percentile bootstrap's 95 % interval of resampled statistics."""
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return [round(float(lo), 3), round(float(hi), 3)]


def straddles_one(ci) -> bool:
    """The interval includes 1.0: the run shows no difference between the two paths."""
    return ci is not None and ci[0] <= 1.0 <= ci[1]


def ratio_text(value, ci, lower: bool = False) -> str:
    """``0.55x [0.48-0.61]``; a trailing ``~`` when the interval includes 1.0, a leading
    ``>=`` when the ratio is a lower bound."""
    if value is None:
        return "-"
    text = (">=" if lower else "") + f"{value:.2f}x"
    if ci is None:
        return text
    return text + f" [{ci[0]:.2f}-{ci[1]:.2f}]" + ("~" if straddles_one(ci) else "")


def ratio_figures(figs: dict) -> list[tuple[str, float | None, list | None]]:
    """(figure, ratio, interval) of one pair, in RATIO_FIGURES order, then the paired ones
    where the pair has them."""
    cis = figs.get(CI_KEY) or {}
    names = [n for n, _, _ in RATIO_FIGURES] + [n for n, _, _ in PAIRED_FIGURES if n in figs]
    return [(n, figs.get(n), cis.get(n)) for n in names]


def _ratio_cells(figs: dict) -> list[tuple[str, str]]:
    """(figure, text) of one pair, as ratio_figures orders them."""
    lower = set(figs.get(LOWER_KEY) or ())
    return [(n, ratio_text(v, ci, n in lower)) for n, v, ci in ratio_figures(figs)]


def public(result: dict) -> dict:
    """The object of ``bench --json``: exactly rows, ratios and machine."""
    return {"rows": result["rows"], "ratios": result["ratios"], "machine": result["machine"]}


# -- the table ------------------------------------------------------------

def _spread(det: dict, key: str, scale: float, fmt: str) -> str:
    s = det.get(key)
    if not isinstance(s, dict):
        return "-"
    med = format(s["median"] * scale, fmt)
    if len(s["trials"]) > 1:
        return f"{med} [{format(s['min'] * scale, fmt)}-{format(s['max'] * scale, fmt)}]"
    return med


def _mostly(flags) -> bool:
    return sum(1 for f in flags if f) * 2 > len(flags)


def generator_limited(det: dict) -> bool:
    """True when most trials' floods lost < 0.5 %: the PDR is then the generator's limit, a
    lower bound for the path."""
    return _mostly(det.get("generator_limited") or [])


def ndr_generator_limited(det: dict) -> bool:
    """True when most trials' floods lost nothing at all: the NDR is a lower bound too."""
    loss = det.get("flood_loss")
    return _mostly([v <= 0 for v in loss["trials"]]) if isinstance(loss, dict) else False


def _median(det: dict, key: str):
    s = det.get(key)
    return s["median"] if isinstance(s, dict) else None


def _rtt_cell(det: dict, prefix: str) -> str:
    """Medians of p50/p99/p99.9/max, and the round trips they rest on when known."""
    vals = [_median(det, f"{prefix}{p}_us") for p in TABLE_PERCENTILES]
    if all(v is None for v in vals):
        return "-"
    text = "/".join("-" if v is None else f"{v:.0f}" for v in vals)
    n = _median(det, f"{prefix}samples")
    return text + (f" (n={n:.0f})" if n is not None else "")


TABLE_PERCENTILES = ("p50", "p99", "p999", "max")


def table_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    head = ["path", "size", "NDR kpps", "PDR kpps", "flood rx kpps", "flood loss %",
            "TCP Gbit/s", "TCP retr", "TCP x4 Gbit/s", "TCP rev Gbit/s",
            "RTT us p50/p99/p99.9/max", "common kpps", "common RTT us p50/p99/p99.9/max",
            "machine CPU ns/pkt", "engines CPU ns/pkt", "syscalls/pkt"]
    body = []
    for det in result["detail"]:
        size = "tcp+idle" if det["size"] is None else f"{det['size']} B"
        if det.get("skipped"):
            body.append([det["path"], size, "skipped"] + ["-"] * (len(head) - 3))
            continue
        body.append([
            det["path"], size,
            (">=" if ndr_generator_limited(det) else "") + _spread(det, "ndr_pps", 1e-3, ".1f"),
            (">=" if generator_limited(det) else "") + _spread(det, "pdr_pps", 1e-3, ".1f"),
            _spread(det, "flood_rx_pps", 1e-3, ".1f"),
            _spread(det, "flood_loss", 100, ".1f"), _spread(det, "tcp_gbps", 1, ".2f"),
            _spread(det, "tcp_retransmits", 1, ".0f"),
            _spread(det, "tcp4_gbps", 1, ".2f"), _spread(det, "tcp_rev_gbps", 1, ".2f"),
            _rtt_cell(det, "rtt_"),
            _spread(det, "common_load_pps", 1e-3, ".1f"),
            _rtt_cell(det, "common_rtt_"),
            _spread(det, "machine_cpu_ns_per_packet", 1, ".0f"),
            _spread(det, "cpu_ns_per_packet", 1, ".0f"),
            _spread(det, "syscalls_per_packet", 1, ".2f"),
        ])
    return head, body


def legend_lines(result: dict) -> list[str]:
    lines = ["NDR: highest offered rate with nothing lost; PDR: < 0.5 % lost (RFC 2544 / "
             "FD.io CSIT); RTT: medians over the trials of each percentile (nearest rank), "
             "n round trips each, under load at half the path's PDR; common: at the lowest "
             "NDR of the run, the same offered load for every path"]
    six = [p for p in dict.fromkeys(d["path"] for d in result["detail"]) if p in IPV6_TWINS]
    if six:
        lines.append(f"{', '.join(six)}: inner IPv6 over the same underlay, each beside its IPv4 "
                     "twin (a dual-stack config); the size is the UDP payload, so an IPv6 packet "
                     "is 20 bytes longer; X6 / X is IPv6 / IPv4 of the same path in this run; "
                     "*_same_forwarders: the median over the trials of X6's figure (one TCP "
                     "stream, a flood's received rate) over the same of inner IPv4 through X6's "
                     "own forwarders beside it; a flood pair counts when the IPv4 flood lost "
                     ">= 0.5 % (the forwarders' limit), and the ratio is marked >= (a lower "
                     "bound) when the IPv6 flood lost less (its generator's limit)")
    if any(generator_limited(d) or ndr_generator_limited(d) for d in result["detail"]):
        lines.append(">= : the flood lost < 0.5 % (PDR) or nothing (NDR), so the generator was "
                     "the limit and the rate is a lower bound")
    cis = [ci for refs in result["ratios"].values() for figs in refs.values()
           for _, _, ci in ratio_figures(figs) if ci is not None]
    if cis:
        lines.append("[lo-hi]: 95 % interval of the ratio (percentile bootstrap of the ratio "
                     "of medians over the trials)" + ("; ~ : the interval includes 1.0x, "
                                                      "no difference shown"
                                                      if any(map(straddles_one, cis)) else ""))
    return lines


def ratio_lines(result: dict) -> list[str]:
    lines = []
    for path, reason in dict.fromkeys((d["path"], d["skipped"]) for d in result["detail"]
                                      if d.get("skipped")):
        lines.append(f"{path}: skipped: {reason}")
    lines += legend_lines(result)
    for path, refs in result["ratios"].items():
        for ref, figs in refs.items():
            parts = [f"{n}={text}" for n, text in _ratio_cells(figs)]
            lines.append(f"{path} / {ref}: " + "  ".join(parts))
    return lines


def markdown(result: dict) -> str:
    head, body = table_rows(result)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in body]
    out.append("")
    out.append("| ratio | " + " | ".join(n for n, _, _ in RATIO_FIGURES) + " |")
    out.append("|" + "---|" * (len(RATIO_FIGURES) + 1))
    for path, refs in result["ratios"].items():
        for ref, figs in refs.items():
            out.append(f"| {path} / {ref} | " + " | ".join(
                text for _, text in _ratio_cells(figs)) + " |")
    out.append("")
    for line in legend_lines(result):
        out += [line, ""]
    return "\n".join(out)


def print_table(result: dict, file=None) -> None:
    """The table on stdout: rich when it is a terminal, plain text otherwise."""
    import sys
    file = file or sys.stdout
    head, body = table_rows(result)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None
    if Console is not None and file.isatty():
        t = Table(title="flannel-udp bench (median [min-max])")
        for h in head:
            t.add_column(h, justify="left" if h in ("path", "size") else "right")
        for r in body:
            t.add_row(*r)
        con = Console(file=file)
        con.print(t)
        for line in ratio_lines(result):
            con.print(line)
        return
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{'<' if i < 2 else '>'}{w}}}" for i, w in enumerate(widths))
    print(fmt.format(*head), file=file)
    for r in body:
        print(fmt.format(*r), file=file)
    print(file=file)
    for line in ratio_lines(result):
        print(line, file=file)


# -- the plot -------------------------------------------------------------

COLORS = {"direct": "#4c72b0", "vxlan": "#55a868", "c": "#dd8452", "python": "#c44e52",
          "c-base": "#937860", "c-offload": "#da8bc3", "flanneld": "#8172b3",
          "vxlan6": "#9fd4a8", "c6": "#f0b48a", "python6": "#e09295"}
OTHER_COLOR = "#8c8c8c"          # a path without a colour of its own


def plot(result: dict, path: str) -> str:
    """Three panels: PDR, NDR and flood rates per path and size, TCP, latency."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    det = {(d["path"], d["size"]): d for d in result["detail"]}
    paths = list(dict.fromkeys(d["path"] for d in result["detail"] if not d.get("skipped")))
    sizes = sorted({d["size"] for d in result["detail"] if d["size"] is not None})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8), gridspec_kw={"width_ratios": [2, 1, 1.6]})

    def med(d, key):
        s = d.get(key) if d else None
        return (s["median"], s["median"] - s["min"], s["max"] - s["median"]) \
            if isinstance(s, dict) else (0.0, 0.0, 0.0)

    ax = axes[0]
    w = 0.8 / max(len(paths), 1)
    for i, p in enumerate(paths):
        xs = [j + (i - (len(paths) - 1) / 2) * w for j in range(len(sizes))]
        pd = [med(det.get((p, s)), "pdr_pps") for s in sizes]
        nd = [med(det.get((p, s)), "ndr_pps") for s in sizes]
        fl = [med(det.get((p, s)), "flood_rx_pps") for s in sizes]
        ax.bar(xs, [v[0] / 1e3 for v in pd], w, color=COLORS.get(p, OTHER_COLOR), label=p,
               yerr=[[v[1] / 1e3 for v in pd], [v[2] / 1e3 for v in pd]], capsize=3)
        ax.plot(xs, [v[0] / 1e3 for v in nd], "k_", markersize=12,
                label="NDR (nothing lost)" if i == 0 else None)
        ax.plot(xs, [v[0] / 1e3 for v in fl], "kv", markersize=6,
                label="flood rx" if i == 0 else None)
    ax.set_xticks(range(len(sizes)), [f"{s} B" for s in sizes])
    ax.set_ylabel("kpps (bars: PDR, <0.5% loss)")
    ax.set_title("UDP packet rate")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)

    ax = axes[1]
    tc = [med(det.get((p, None)), "tcp_gbps") for p in paths]
    ax.bar(paths, [v[0] for v in tc], color=[COLORS.get(p, OTHER_COLOR) for p in paths],
           yerr=[[v[1] for v in tc], [v[2] for v in tc]], capsize=3)
    ax.plot(paths, [med(det.get((p, None)), "tcp4_gbps")[0] for p in paths], "k^",
            label="4 streams")
    ax.plot(paths, [med(det.get((p, None)), "tcp_rev_gbps")[0] for p in paths], "kx",
            label="reverse")
    ax.set_ylabel("Gbit/s")
    ax.set_title("TCP (iperf3; bars: one stream)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)

    ax = axes[2]
    groups = [("idle", None)] + [(f"load {s} B", s) for s in sizes]
    w = 0.8 / max(len(paths), 1)
    for i, p in enumerate(paths):
        xs = [j + (i - (len(paths) - 1) / 2) * w for j in range(len(groups))]
        p50 = [med(det.get((p, s)), "rtt_p50_us")[0] for _, s in groups]
        p99 = [med(det.get((p, s)), "rtt_p99_us")[0] for _, s in groups]
        p999 = [med(det.get((p, s)), "rtt_p999_us")[0] for _, s in groups]
        ax.bar(xs, p50, w, color=COLORS.get(p, OTHER_COLOR), label=p)
        ax.plot(xs, p99, "k_", markersize=10, label="p99" if i == 0 else None)
        ax.plot(xs, p999, "k.", markersize=6, label="p99.9" if i == 0 else None)
    ax.set_xticks(range(len(groups)), [g for g, _ in groups])
    ax.set_yscale("log")
    ax.set_ylabel("round trip, us (bars p50, dash p99, dot p99.9)")
    ax.set_title("UDP request/response latency")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)

    m = result.get("machine", {})
    fig.suptitle(f"flannel-udp bench, {m.get('date_utc', '')}, {m.get('mode', '')} run, "
                 f"{m.get('trials', '?')} trial(s), {m.get('cpus', '?')} CPUs", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
