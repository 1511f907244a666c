"""The bench's rate searches, latency figures, common load and iperf3 parsing, against fakes
(no root, no traffic): a path is a function from offered rate to what arrived."""
from __future__ import annotations

import json

import pytest

from dataplane.bench import measure, runner


class FakePath:
    """Loses nothing up to ``clean``, a little (< 0.5 %) up to ``partial``, then much more;
    the generator reaches at most ``gen_max``."""

    def __init__(self, clean, partial, gen_max=1e9):
        self.clean, self.partial, self.gen_max = clean, partial, gen_max
        self.rates = []

    def __call__(self, rate):
        self.rates.append(rate)
        offered = min(rate, self.gen_max)
        sent = int(offered)
        if offered <= self.clean:
            lost = 0
        elif offered <= self.partial:
            lost = max(1, int(sent * 0.001))
        else:
            lost = int(sent * 0.2)
        return {"sent": sent, "received": sent - lost, "lost": lost, "tx_pps": offered,
                "loss": lost / sent, "machine_cpu_ns": 1000 * (sent - lost)}


FLOOD = {"tx_pps": 400e3, "rx_pps": 200e3}


def test_pass_criteria_of_the_two_rates():
    one_lost = {"sent": 100_000, "received": 99_999, "loss": 1e-5}
    assert measure.passes(one_lost, measure.PDR_LOSS)
    assert not measure.passes(one_lost, measure.NDR_LOSS)          # one datagram fails the NDR
    whole = {"sent": 10, "received": 10, "loss": 0.0}
    assert measure.passes(whole, measure.NDR_LOSS)
    assert not measure.passes({"sent": 0, "received": 0, "loss": 1.0}, measure.NDR_LOSS)
    assert not measure.passes({"sent": 1000, "received": 995, "loss": 0.005}, measure.PDR_LOSS)


def test_pdr_and_ndr_found_by_bisection_within_bounded_probes():
    path = FakePath(clean=100e3, partial=250e3)
    res = measure.pdr_ndr(path, flood_res=FLOOD, steps=6, ndr_steps=4)
    assert 200e3 <= res["pdr_pps"] <= 250e3 * 1.01
    assert 50e3 <= res["ndr_pps"] <= 100e3
    assert res["ndr_pps"] <= res["pdr_pps"]
    assert len(res["pdr_probes"]) <= 6 + 4 and len(res["ndr_probes"]) <= 4 + 4
    assert len(path.rates) == len(res["pdr_probes"]) + len(res["ndr_probes"])
    # every NDR probe lies at or below the PDR: the NDR search never climbs above it
    assert all(p["target"] <= res["pdr_pps"] + 1 for p in res["ndr_probes"])
    assert all(p["loss"] == 0 for p in res["ndr_probes"] if p["ok"])
    assert res["machine_cpu_ns_per_packet"] == 1000                 # at the PDR's best probe


def test_ndr_needs_no_probe_when_the_pdr_lost_nothing():
    path = FakePath(clean=1e9, partial=1e9, gen_max=180e3)          # the generator is the limit
    res = measure.pdr_ndr(path, flood_res=FLOOD, steps=6, ndr_steps=4)
    assert res["ndr_probes"] == [] and res["ndr_pps"] == res["pdr_pps"] == 180e3
    assert len(res["pdr_probes"]) == 1


def test_a_flood_that_lost_nothing_is_the_rate_and_no_paced_probe_runs():
    """A paced generator offers less than a flood: a flood that passed already shows the rate."""
    path = FakePath(clean=1e9, partial=1e9, gen_max=250e3)          # pacing reaches 250 kpps
    flood = {"tx_pps": 355e3, "rx_pps": 356e3, "sent": 3_550_000, "received": 3_550_000,
             "lost": 0, "loss": 0.0, "machine_cpu_ns": 4e9}
    res = measure.pdr_ndr(path, flood_res=flood, steps=6, ndr_steps=4)
    assert res["pdr_pps"] == res["ndr_pps"] == 355e3 and path.rates == []
    assert res["pdr_probes"][0]["offered"] == 355e3 and res["ndr_probes"] == []
    one_lost = dict(flood, received=flood["sent"] - 1, lost=1, loss=1 / flood["sent"])
    res = measure.pdr_ndr(path, flood_res=one_lost, steps=6, ndr_steps=4)
    assert res["pdr_pps"] == 355e3                      # < 0.5 % lost: the PDR is the flood's
    assert 0 < res["ndr_pps"] <= 250e3 and path.rates   # the NDR needs paced probes


def test_find_rate_takes_the_loss_limit():
    strict = measure.find_rate(FakePath(clean=100e3, partial=250e3), flood_res=FLOOD, steps=6,
                                loss_limit=measure.NDR_LOSS)
    loose = measure.find_rate(FakePath(clean=100e3, partial=250e3), flood_res=FLOOD, steps=6,
                               loss_limit=measure.PDR_LOSS)
    assert strict["pps"] <= 100e3 < 200e3 <= loose["pps"]


def test_a_path_that_loses_at_every_rate_gets_zero_after_a_bounded_search():
    path = FakePath(clean=-1, partial=-1)
    res = measure.pdr_ndr(path, flood_res=FLOOD, steps=3, ndr_steps=2)
    assert res["pdr_pps"] == res["ndr_pps"] == 0.0
    assert len(res["pdr_probes"]) == 3 + 4 and res["ndr_probes"] == []


def test_ndr_seed_from_the_pdr_probes():
    pdr = {"pps": 240e3, "probes": [
        {"target": 200e3, "offered": 199e3, "loss": 0.001, "ok": True,
         "machine_cpu_ns_per_packet": 5},
        {"target": 300e3, "offered": 300e3, "loss": 0.2, "ok": False,
         "machine_cpu_ns_per_packet": 6},
        {"target": 100e3, "offered": 100e3, "loss": 0.0, "ok": True,
         "machine_cpu_ns_per_packet": 7}]}
    seed = measure.ndr_seed(pdr)
    assert seed == {"lo": 100e3, "hi": 200e3, "best": 100e3, "best_cpu": 7}


def test_rtt_figures_from_the_probe():
    rr = {"sent": 300, "received": 298, "lost": 2, "p50_us": 50.0, "p90_us": 70.0,
          "p99_us": 90.0, "p999_us": 120.0, "min_us": 40.0, "max_us": 130.0, "mean_us": 55.0}
    assert measure.rtt_figures(rr) == {"rtt_p50_us": 50.0, "rtt_p90_us": 70.0,
                                       "rtt_p99_us": 90.0, "rtt_p999_us": 120.0,
                                       "rtt_max_us": 130.0, "rtt_samples": 298}
    assert measure.rtt_figures({"p50_us": 1.0}, "common_rtt_")["common_rtt_p999_us"] is None


def test_common_load_is_the_lowest_ndr_of_the_paths_that_ran():
    samples = {"vxlan": {64: {"ndr_pps": [300e3, 320e3, 310e3]}, 1400: {"ndr_pps": [200e3]}},
               "c": {64: {"ndr_pps": [100e3, 90e3, 140e3]}, 1400: {"ndr_pps": [250e3]}},
               "python": {64: {"ndr_pps": [120e3]}, 1400: {"ndr_pps": [210e3]}}}
    assert runner.common_load(samples, (64, 1400)) == {64: 100e3, 1400: 200e3}
    assert runner.common_load({"c": samples["c"]}, (64, 1400)) == {}        # one path
    samples["python"][1400]["ndr_pps"] = [0.0]                   # nothing whole at 1400 B
    assert runner.common_load(samples, (64, 1400)) == {64: 100e3}
    del samples["python"][64]
    assert runner.common_load(samples, (64,)) == {}


def _iperf3_json(gbps, retr):
    return json.dumps({"end": {"sum_received": {"bits_per_second": gbps * 1e9},
                               "sum_sent": {"retransmits": retr}}})


def test_iperf3_variants_argv_and_result():
    from types import SimpleNamespace
    topo = SimpleNamespace(a=SimpleNamespace(app_ip="10.5.1.1"),
                           b=SimpleNamespace(app_ip="10.5.2.1"))
    tools = measure.Tools(udpgen="u", iperf3="iperf3")
    one = measure.iperf3_client_argv(topo, tools, seconds=2)
    assert "-P" not in one and "-R" not in one
    four = measure.iperf3_client_argv(topo, tools, seconds=2, streams=4)
    assert four[four.index("-P") + 1] == "4"
    assert "-R" in measure.iperf3_client_argv(topo, tools, seconds=2, reverse=True)
    assert measure.iperf3_result(_iperf3_json(2.5, 7)) == {"gbps": 2.5, "retransmits": 7,
                                                           "sender_cpu": None}
    with pytest.raises(measure.MeasureError, match="busy"):
        measure.iperf3_result(json.dumps({"error": "busy"}))
    with pytest.raises(measure.MeasureError):
        measure.iperf3_result("not json", "iperf3: boom")
