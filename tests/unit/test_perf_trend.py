"""The soak's memory trend (dataplane.bench.trend) on synthetic RSS samples."""
from __future__ import annotations

import numpy as np
import pytest

from dataplane.bench.trend import growth, linear_trend

T = np.arange(0, 600, 5.0)          # a 10-minute soak sampled every 5 s


def test_exact_line_has_its_slope_and_no_error():
    slope, stderr = linear_trend(T, 50_000 + 0.5 * T)
    assert slope == pytest.approx(0.5) and stderr == pytest.approx(0, abs=1e-9)


def test_flat_noisy_rss_is_no_growth_as_often_as_two_standard_errors_promise():
    # A 2-standard-error band holds a flat series' slope ~95 % of the time: far fewer false alarms
    # would mean an inflated error, far more an underestimated one.
    rng = np.random.default_rng(1)
    verdicts = [growth(T, 50_000 + rng.normal(0, 200, T.size))["verdict"] for _ in range(400)]
    alarms = sum(v != "no growth detected" for v in verdicts)
    assert 5 <= alarms <= 40, alarms
    assert growth(T, 50_000 + rng.normal(0, 200, T.size))["stderr_kb_per_min"] > 0


def test_linear_growth_is_reported_with_its_uncertainty():
    rng = np.random.default_rng(2)
    g = growth(T, 50_000 + (100 / 60) * T + rng.normal(0, 200, T.size))     # 100 kB/min
    assert g["verdict"].startswith("grows ") and g["verdict"].endswith(" kB/min"), g
    assert abs(g["slope_kb_per_min"] - 100) < 3 * g["stderr_kb_per_min"]
    # OLS standard error of the slope for white noise: sigma / sqrt(Sxx), per minute
    assert g["stderr_kb_per_min"] == pytest.approx(200 / np.sqrt(np.sum((T - T.mean()) ** 2)) * 60,
                                                   rel=0.2)
    assert f"{g['slope_kb_per_min']:.1f} ± {g['stderr_kb_per_min']:.1f}" in g["verdict"]


def test_steady_release_is_not_called_growth():
    assert growth(T, 90_000 - (50 / 60) * T)["verdict"].startswith("shrinks ")


def test_missing_samples_are_skipped_and_too_few_give_no_verdict():
    rss = [50_000 + 2 * t for t in T]
    rss[3] = None                                       # the process was gone for one sample
    assert growth(T, rss)["slope_kb_per_min"] == pytest.approx(120)
    assert growth([0, 5], [1, 2])["slope_kb_per_min"] is None
    assert growth([5, 5, 5], [1, 2, 3])["verdict"] == "too few samples for a trend"
