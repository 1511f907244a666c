"""The bench's result shaping (no root): rows, medians, ratios, the JSON object."""
from __future__ import annotations

import json

from dataplane.bench import report

SIZES = (64, 1400)


def _samples():
    def sized(ndr, flood, cost=None):
        d = {"ndr_pps": ndr, "flood_rx_pps": flood, "flood_loss": [0.1, 0.2, 0.3],
             "machine_cpu_ns_per_packet": [1e9 / f for f in flood],
             "rtt_p50_us": [80, 90, 100], "rtt_p99_us": [200, 300, 400],
             "generator_limited": [False, False, True], "ndr_probes": [[], [], []]}
        if cost:
            d["cpu_ns_per_packet"] = cost
            d["syscalls_per_packet"] = [2.0, 2.5, 3.0]
        return d

    def idle(gbps):
        return {"tcp_gbps": gbps, "tcp_retransmits": [0, 1, 2],
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
    assert by[("vxlan", 64)]["ndr_pps"] == 450e3
    assert by[("c", 64)]["cpu_ns_per_packet"] == 4000
    assert by[("c", None)]["tcp_gbps"] == 2.25
    assert by[("direct", 64)]["cpu_ns_per_packet"] is None      # no forwarding process
    assert by[("direct", None)]["ndr_pps"] is None               # not a UDP size
    assert all(v is None for k, v in by[("python", 64)].items() if k not in ("path", "size"))
    det = {(d["path"], d["size"]): d for d in res["detail"]}
    assert det[("vxlan", 64)]["ndr_pps"] == {"median": 450e3, "min": 400e3, "max": 500e3,
                                             "trials": [400e3, 500e3, 450e3]}
    assert det[("c", None)]["tcp_retransmits"]["median"] == 1
    assert det[("c", 64)]["generator_limited"] == [False, False, True]


def test_ratios_from_the_same_run():
    res = report.build(_samples(), ["direct", "vxlan", "c"], SIZES, {})
    r = res["ratios"]
    assert set(r) == {"c", "vxlan"}                      # no python in this run
    assert r["c"]["vxlan"]["ndr_pps_64"] == round(250e3 / 450e3, 3)
    assert r["c"]["direct"]["ndr_pps_64"] == round(250e3 / 610e3, 3)
    assert r["c"]["vxlan"]["tcp_gbps"] == 0.25
    # the whole machine's CPU per packet, engine over VXLAN (lower is better)
    assert r["c"]["vxlan"]["machine_cpu_64"] == round(480e3 / 260e3, 3)
    assert r["vxlan"]["direct"]["tcp_gbps"] == round(9 / 8, 3)
    assert set(r["c"]["vxlan"]) == {n for n, _, _ in report.RATIO_FIGURES}


def test_public_object_and_table(capsys):
    res = report.build(_samples(), ["direct", "vxlan", "c"], SIZES, {"mode": "quick"})
    pub = report.public(res)
    assert set(pub) == {"rows", "ratios", "machine"}
    json.dumps(pub)                                      # serialisable as is
    report.print_table(res)
    out = capsys.readouterr().out
    assert "c / vxlan" in out and "450.0 [400.0-500.0]" in out
    md = report.markdown(res)
    assert md.count("\n| c | ") == 3


def test_generator_limited_marks_a_lower_bound():
    assert report.generator_limited({"generator_limited": [True, True, False]})
    assert not report.generator_limited({"generator_limited": [True, False, False]})
    assert not report.generator_limited({})


def test_engine_variant_paths_get_their_own_ratios():
    s = _samples()
    s["c-base"] = {k: dict(v) for k, v in s["c"].items()}
    s["c-base"][64]["ndr_pps"] = [100e3] * 3
    res = report.build(s, ["direct", "vxlan", "c-base", "c"], SIZES, {"mode": "full"})
    assert res["ratios"]["c-base"]["vxlan"]["ndr_pps_64"] == round(100e3 / 450e3, 3)
    assert res["ratios"]["c"]["vxlan"]["ndr_pps_64"] == round(250e3 / 450e3, 3)
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
