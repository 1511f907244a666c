"""report.summarize: the per-figure statistics over a bench's trials."""
from __future__ import annotations

from dataplane.bench.report import summarize


def test_median_is_the_middle_trial_or_the_mean_of_the_middle_two():
    assert summarize([3, 1, 2])["median"] == 2.0
    assert summarize([4, 1, 3, 2])["median"] == 2.5
    assert summarize([7.25])["median"] == 7.25


def test_failed_trials_are_left_out_and_min_max_keep_their_values():
    s = summarize([None, 5, 1, None, 9])
    assert s == {"median": 5.0, "min": 1, "max": 9, "trials": [5, 1, 9]}
    assert type(s["median"]) is float and type(s["min"]) is int
    assert summarize([None, None]) is None and summarize([]) is None
