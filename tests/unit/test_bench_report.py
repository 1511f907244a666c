"""The bench's result shaping (no root): rows, medians, ratios and their intervals, the
table and the JSON object."""
from __future__ import annotations

import json

from dataplane.bench import report

SIZES = (64, 1400)


def _samples():
    def sized(ndr, flood, cost=None):
        d = {"ndr_pps": [v * 0.9 for v in ndr], "pdr_pps": ndr, "flood_rx_pps": flood,
             "flood_loss": [0.1, 0.2, 0.3],
             "machine_cpu_ns_per_packet": [1e9 / f for f in flood],
             "rtt_p50_us": [80, 90, 100], "rtt_p90_us": [150, 160, 170],
             "rtt_p99_us": [200, 300, 400], "rtt_p999_us": [500, 600, 700],
             "rtt_max_us": [900, 1000, 1100], "rtt_samples": [300, 300, 299],
             "generator_limited": [False, False, True], "ndr_probes": [[], [], []]}
        if cost:
            d["cpu_ns_per_packet"] = cost
            d["syscalls_per_packet"] = [2.0, 2.5, 3.0]
        return d

    def idle(gbps):
        return {"tcp_gbps": gbps, "tcp_retransmits": [0, 1, 2],
                "tcp4_gbps": [g * 2 for g in gbps], "tcp_rev_gbps": gbps,
                "rtt_p50_us": [50, 60, 70], "rtt_p99_us": [90, 95, 99]}
    return {
        "direct": {64: sized([600e3, 610e3, 620e3], [650e3] * 3),
                   1400: sized([500e3] * 3, [520e3] * 3), None: idle([8.0, 8.0, 8.0])},
        "vxlan": {64: sized([400e3, 500e3, 450e3], [480e3] * 3),
                  1400: sized([400e3] * 3, [410e3] * 3), None: idle([8.0, 9.0, 10.0])},
        "c": {64: sized([200e3, 250e3, 300e3], [260e3] * 3, cost=[3000, 4000, 5000]),
              1400: sized([200e3] * 3, [220e3] * 3, cost=[1, 2, 3]), None: idle([2.0, 2.25, 2.5])},
    }


def test_rows_shape_and_medians():
    res = report.build(_samples(), ["direct", "vxlan", "c", "python"], SIZES, {"mode": "full"})
    rows = res["rows"]
    assert len(rows) == 4 * 3
    assert all(tuple(r) == report.ROW_KEYS for r in rows)
    by = {(r["path"], r["size"]): r for r in rows}
    assert by[("vxlan", 64)]["pdr_pps"] == 450e3
    assert by[("vxlan", 64)]["ndr_pps"] == 405e3
    assert by[("vxlan", 64)]["rtt_p999_us"] == 600 and by[("vxlan", 64)]["rtt_samples"] == 300
    assert by[("c", None)]["tcp4_gbps"] == 4.5
    assert by[("c", 64)]["cpu_ns_per_packet"] == 4000
    assert by[("c", None)]["tcp_gbps"] == 2.25
    assert by[("direct", 64)]["cpu_ns_per_packet"] is None      # no forwarding process
    assert by[("direct", None)]["ndr_pps"] is None               # not a UDP size
    assert all(v is None for k, v in by[("python", 64)].items() if k not in ("path", "size"))
    det = {(d["path"], d["size"]): d for d in res["detail"]}
    assert det[("vxlan", 64)]["pdr_pps"] == {"median": 450e3, "min": 400e3, "max": 500e3,
                                             "trials": [400e3, 500e3, 450e3]}
    assert det[("c", None)]["tcp_retransmits"]["median"] == 1
    assert det[("c", 64)]["generator_limited"] == [False, False, True]


def test_ratios_from_the_same_run():
    res = report.build(_samples(), ["direct", "vxlan", "c"], SIZES, {})
    r = res["ratios"]
    assert set(r) == {"c", "vxlan"}                      # no python in this run
    assert r["c"]["vxlan"]["pdr_pps_64"] == round(250e3 / 450e3, 3)
    assert r["c"]["vxlan"]["ndr_pps_64"] == round(225e3 / 405e3, 3)
    assert r["c"]["direct"]["pdr_pps_64"] == round(250e3 / 610e3, 3)
    assert r["c"]["vxlan"]["tcp_gbps"] == 0.25
    # the whole machine's CPU per packet, engine over VXLAN (lower is better)
    assert r["c"]["vxlan"]["machine_cpu_64"] == round(480e3 / 260e3, 3)
    assert r["vxlan"]["direct"]["tcp_gbps"] == round(9 / 8, 3)
    assert set(r["c"]["vxlan"]) == {n for n, _, _ in report.RATIO_FIGURES} | {"ci95"}
    assert set(r["c"]["vxlan"]["ci95"]) == {n for n, _, _ in report.RATIO_FIGURES}
    lo, hi = r["c"]["vxlan"]["ci95"]["pdr_pps_64"]
    assert lo <= r["c"]["vxlan"]["pdr_pps_64"] <= hi and hi < 1.0


def test_public_object_and_table(capsys):
    res = report.build(_samples(), ["direct", "vxlan", "c"], SIZES, {"mode": "quick"})
    pub = report.public(res)
    assert set(pub) == {"rows", "ratios", "machine"}
    json.dumps(pub)                                      # serialisable as is
    report.print_table(res)
    out = capsys.readouterr().out
    assert "c / vxlan" in out and "450.0 [400.0-500.0]" in out
    assert "90/300/600/1000 (n=300)" in out        # p50/p99/p99.9/max medians, n
    md = report.markdown(res)
    assert md.count("\n| c | ") == 3
    assert "| c / vxlan | 0.56x [" in md and "95 % interval" in md


def test_generator_limited_marks_a_lower_bound():
    assert report.generator_limited({"generator_limited": [True, True, False]})
    assert not report.generator_limited({"generator_limited": [True, False, False]})
    assert not report.generator_limited({})


def test_engine_variant_paths_get_their_own_ratios():
    s = _samples()
    s["c-base"] = {k: dict(v) for k, v in s["c"].items()}
    s["c-base"][64]["pdr_pps"] = [100e3] * 3
    res = report.build(s, ["direct", "vxlan", "c-base", "c"], SIZES, {"mode": "full"})
    assert res["ratios"]["c-base"]["vxlan"]["pdr_pps_64"] == round(100e3 / 450e3, 3)
    assert res["ratios"]["c"]["vxlan"]["pdr_pps_64"] == round(250e3 / 450e3, 3)
    assert "python" not in res["ratios"]


def test_bench_rejects_unknown_paths_and_knows_the_variants():
    from dataplane.bench.paths import ALL_PATHS, ENGINE_VARIANTS
    assert {"c-base", "c-offload", "c-coalesce20", "python-coalesce20", "c-rt",
            "python-rt"} <= set(ALL_PATHS)
    for kind, extra in ENGINE_VARIANTS.values():
        assert kind in ("c", "python") and extra


def test_c_direct_is_on_request_only():
    """Issue 30's path runs two daemons over an etcd: accepted by --paths, not a default."""
    import argparse

    from dataplane.bench.paths import ALL_PATHS, DAEMON_PATHS, PATHS
    from dataplane.cli import bench as cli_bench
    p = argparse.ArgumentParser()
    cli_bench.add_arguments(p)
    assert "c-direct" in DAEMON_PATHS and "c-direct" in ALL_PATHS
    assert "c-direct" not in PATHS and "c-direct" not in p.parse_args([]).paths.split(",")
    assert "c-direct" in p.format_help()


# -- the interval of a ratio ----------------------------------------------

def test_interval_of_clearly_different_paths_excludes_one():
    ci = report.ratio_ci([50, 52, 49, 51, 50], [100, 98, 103, 101, 99])
    assert ci[0] <= 50 / 100 <= ci[1] and ci[1] < 1.0
    assert not report.straddles_one(ci)


def test_interval_of_overlapping_paths_straddles_one():
    ci = report.ratio_ci([90, 110, 100, 80, 120], [100, 85, 115, 95, 105])
    assert ci[0] < 1.0 < ci[1] and report.straddles_one(ci)


def test_interval_is_reproducible_and_needs_three_trials():
    a, b = [3.0, 4.0, 5.0, 4.5, 3.5], [4.0, 4.1, 3.9, 4.2, 3.8]
    assert report.ratio_ci(a, b) == report.ratio_ci(a, b)           # fixed seed
    assert report.ratio_ci([1.0], [2.0]) is None                     # a quick run
    assert report.ratio_ci([1.0, 2.0, None], [2.0, 2.0, 2.0]) is None
    assert report.ratio_ci([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]) is None
    # identical trials: the interval is the point
    assert report.ratio_ci([2.0] * 5, [4.0] * 5) == [0.5, 0.5]


def test_straddle_flag_in_the_ratio_text():
    assert report.ratio_text(0.9, [0.8, 1.05]) == "0.90x [0.80-1.05]~"
    assert report.ratio_text(0.5, [0.4, 0.6]) == "0.50x [0.40-0.60]"
    assert report.ratio_text(0.5, None) == "0.50x" and report.ratio_text(None, None) == "-"
    assert report.straddles_one([1.0, 1.2]) and not report.straddles_one(None)


def test_table_flags_a_ratio_whose_interval_includes_one(capsys):
    s = _samples()
    s["c"][None]["tcp_gbps"] = [7.0, 8.5, 9.5]          # vs direct's 8.0: no difference
    res = report.build(s, ["direct", "vxlan", "c"], SIZES, {"mode": "full"})
    assert report.straddles_one(res["ratios"]["c"]["direct"]["ci95"]["tcp_gbps"])
    report.print_table(res)
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("c / direct"))
    assert "tcp_gbps=1.06x [" in line and line.split("tcp_gbps=")[1].split()[1].endswith("~")
    assert "~ : the interval includes 1.0x" in out


def test_ndr_lower_bound_when_the_flood_lost_nothing():
    assert report.ndr_generator_limited({"flood_loss": {"trials": [0.0, 0.0, 0.01]}})
    assert not report.ndr_generator_limited({"flood_loss": {"trials": [0.0, 0.001, 0.01]}})
    assert not report.ndr_generator_limited({})


def test_common_load_latency_in_the_rows_and_the_table(capsys):
    s = _samples()
    for path in ("direct", "vxlan", "c"):
        s[path][64].update(common_load_pps=[225e3] * 3, common_rtt_p50_us=[70, 75, 80],
                           common_rtt_p99_us=[300, 310, 320], common_rtt_p999_us=[400] * 3,
                           common_rtt_max_us=[500] * 3, common_rtt_samples=[2000] * 3)
    res = report.build(s, ["direct", "vxlan", "c"], SIZES, {"mode": "full"})
    by = {(r["path"], r["size"]): r for r in res["rows"]}
    assert by[("c", 64)]["common_load_pps"] == 225e3 and by[("c", 64)]["common_rtt_p99_us"] == 310
    assert by[("c", 1400)]["common_load_pps"] is None
    report.print_table(res)
    assert "75/310/400/500 (n=2000)" in capsys.readouterr().out


def _with_ipv6(s):
    """c6 and vxlan6 beside c and vxlan: c6's 64 B rates 0.9x c's, its TCP half."""
    s = dict(s)
    s["c6"] = {k: {m: list(v) for m, v in d.items()} for k, d in s["c"].items()}
    s["c6"][64]["pdr_pps"] = [v * 0.9 for v in s["c"][64]["pdr_pps"]]
    s["c6"][None]["tcp_gbps"] = [g / 2 for g in s["c"][None]["tcp_gbps"]]
    s["vxlan6"] = {k: {m: list(v) for m, v in d.items()} for k, d in s["vxlan"].items()}
    return s


def test_inner_ipv6_paths_are_divided_by_their_ipv4_twin():
    paths = ["direct", "vxlan", "vxlan6", "c", "c6"]
    res = report.build(_with_ipv6(_samples()), paths, SIZES, {"mode": "full"})
    r = res["ratios"]
    # IPv6 / IPv4 of the same path in the same run, and the engine beside the kernel's IPv6
    assert set(r["c6"]) == {"c", "vxlan6"} and set(r["vxlan6"]) == {"vxlan"}
    assert r["c6"]["c"]["pdr_pps_64"] == 0.9 and r["c6"]["c"]["tcp_gbps"] == 0.5
    assert r["c6"]["vxlan6"]["pdr_pps_64"] == round(225e3 / 450e3, 3)
    assert r["vxlan6"]["vxlan"]["pdr_pps_64"] == 1.0
    assert r["c6"]["c"]["ci95"]["pdr_pps_64"] is not None       # three trials each
    # the IPv4 paths' ratios are what they were without the IPv6 paths
    plain = report.build(_samples(), ["direct", "vxlan", "c"], SIZES, {"mode": "full"})
    assert {p: r[p] for p in ("c", "vxlan")} == plain["ratios"]
    assert [row for row in res["rows"] if row["path"] in ("direct", "vxlan", "c")] \
        == plain["rows"]
    assert all(tuple(row) == report.ROW_KEYS for row in res["rows"])


def test_the_table_says_what_the_ipv6_rows_are(capsys):
    res = report.build(_with_ipv6(_samples()), ["vxlan", "vxlan6", "c", "c6"], SIZES, {})
    report.print_table(res)
    out = capsys.readouterr().out
    assert "c6 / c: ndr_pps_64=" in out and "vxlan6 / vxlan: " in out
    assert "c6 / vxlan6: " in out and "inner IPv6 over the same underlay" in out
    plain = report.build(_samples(), ["vxlan", "c"], SIZES, {})
    report.print_table(plain)
    assert "inner IPv6" not in capsys.readouterr().out


def test_ipv6_paths_are_chosen_by_name():
    from dataplane.bench.families import IPV6_TWINS, family
    from dataplane.bench.paths import ALL_PATHS
    from dataplane.cli.bench import choose_paths
    assert choose_paths("c,c6,python,python6,vxlan,vxlan6", None)[1::2] == \
        ["c6", "python6", "vxlan6"]
    assert set(IPV6_TWINS) <= set(ALL_PATHS) and set(IPV6_TWINS.values()) <= set(ALL_PATHS)
    assert (family("c6"), family("c"), family("c-base")) == (6, 4, 4)


def test_an_ipv6_paths_figures_are_also_divided_by_ipv4_through_its_own_forwarders(capsys):
    """runner._tcp_beside_ipv4's per-trial ratios: their median in the pair with the twin,
    with an interval that resamples the trials as pairs, and nowhere else."""
    s = _with_ipv6(_samples())
    s["c6"][None][report.PAIRED_TCP_KEY] = [0.97, 0.88, 1.02]
    s["c6"][None]["tcp_ipv4_same_gbps"] = [2.1, 2.4, 2.2]
    s["c6"][64][report.PAIRED_FLOOD_KEY] = [1.01, 0.93, 0.95]
    res = report.build(s, ["vxlan", "vxlan6", "c", "c6"], SIZES, {})
    r = res["ratios"]
    assert r["c6"]["c"]["tcp_gbps_same_forwarders"] == 0.97
    assert r["c6"]["c"]["tcp_gbps"] == 0.5                     # the twin's ratio as before
    assert r["c6"]["c"]["flood_rx_pps_64_same_forwarders"] == 0.95
    assert "flood_rx_pps_1400_same_forwarders" not in r["c6"]["c"]      # no such trials
    lo, hi = r["c6"]["c"]["ci95"]["tcp_gbps_same_forwarders"]
    assert 0.88 <= lo <= 0.97 <= hi <= 1.02
    assert "tcp_gbps_same_forwarders" not in r["c6"]["vxlan6"]
    assert "tcp_gbps_same_forwarders" not in r["vxlan6"]["vxlan"]   # vxlan6 has no such trials
    assert r["c"]["vxlan"] == report.build(_samples(), ["vxlan", "c"], SIZES, {})[
        "ratios"]["c"]["vxlan"]
    # without the twin in the run: the twin's ratios are None, those beside IPv4 still there
    alone = report.build({"c6": s["c6"]}, ["c6"], SIZES, {})["ratios"]["c6"]
    assert set(alone) == {"c"} and alone["c"]["tcp_gbps"] is None
    assert alone["c"]["tcp_gbps_same_forwarders"] == 0.97
    report.print_table(res)
    out = capsys.readouterr().out
    assert "tcp_gbps_same_forwarders=0.97x [" in out and "own forwarders" in out
    assert "flood_rx_pps_64_same_forwarders=0.95x [" in out


def test_a_paired_flood_ratio_with_a_generator_limited_ipv6_flood_is_a_lower_bound(capsys):
    s = _with_ipv6(_samples())
    s["c6"][64][report.PAIRED_FLOOD_KEY] = [1.01, None, 0.95]
    s["c6"][64][report.PAIRED_FLOOD_LOWER_KEY] = [True, None, False]
    s["c6"][1400][report.PAIRED_FLOOD_KEY] = [1.0, 0.9, 0.95]
    s["c6"][1400][report.PAIRED_FLOOD_LOWER_KEY] = [False, False, False]
    r = report.build(s, ["c", "c6"], SIZES, {})["ratios"]["c6"]["c"]
    assert r["flood_rx_pps_64_same_forwarders"] == 0.98
    assert r[report.LOWER_KEY] == ["flood_rx_pps_64_same_forwarders"]
    s["c6"][64][report.PAIRED_FLOOD_LOWER_KEY] = [False, None, False]
    assert report.LOWER_KEY not in report.build(s, ["c", "c6"], SIZES, {})["ratios"]["c6"]["c"]
    s["c6"][64][report.PAIRED_FLOOD_LOWER_KEY] = [True, None, False]
    report.print_table(report.build(s, ["c", "c6"], SIZES, {}))
    out = capsys.readouterr().out
    assert "flood_rx_pps_64_same_forwarders=>=0.98x" in out
    assert "flood_rx_pps_1400_same_forwarders=0.95x" in out


def test_a_paired_interval_needs_three_trials():
    assert report.paired_ci([0.9, 1.0]) is None
    assert report.paired_ci([0.9, 0.9, 0.9]) == [0.9, 0.9]
