"""Does a quantity sampled over time grow? A least-squares line and its
standard error, for the soak's memory trend (perf/soak.py).

The samples are treated as independent. RSS moves in steps (allocator
arenas, caches filling once), so neighbouring residuals are correlated and
the standard error is optimistic: a verdict of growth over a short run is a
reason to look at the samples, not proof of a leak.
"""
from __future__ import annotations

import numpy as np

# A slope within this many standard errors of 0 is no evidence of growth.
SIGNIFICANCE = 2.0


def linear_trend(t, y) -> tuple[float, float] | None:
    """Slope of y over t by ordinary least squares, and its standard error,
    in y units per t unit. Pairs with a missing value (None/NaN) are left
    out; None when fewer than 3 pairs remain or t does not vary (no error
    estimate is possible then)."""
    t = np.asarray([np.nan if v is None else v for v in t], dtype=float)
    y = np.asarray([np.nan if v is None else v for v in y], dtype=float)
    keep = np.isfinite(t) & np.isfinite(y)
    t, y = t[keep], y[keep]
    if t.size < 3 or np.ptp(t) == 0:
        return None
    design = np.column_stack([t, np.ones_like(t)])
    (slope, intercept), *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - (slope * t + intercept)
    # Var(slope) = sigma^2 / Sxx, with sigma^2 estimated on n - 2 degrees of freedom.
    sxx = np.sum((t - t.mean()) ** 2)
    stderr = np.sqrt(resid @ resid / (t.size - 2) / sxx)
    return float(slope), float(stderr)


def growth(t_s, values_kb) -> dict:
    """The trend of a kB quantity sampled at t_s seconds, in kB/min, with a
    verdict: "no growth detected" when the slope is within SIGNIFICANCE
    standard errors of 0, else "grows X ± Y kB/min" (or "shrinks ...")."""
    fit = linear_trend(t_s, values_kb)
    if fit is None:
        return {"slope_kb_per_min": None, "stderr_kb_per_min": None,
                "verdict": "too few samples for a trend"}
    slope, stderr = fit[0] * 60, fit[1] * 60
    if abs(slope) <= SIGNIFICANCE * stderr:
        verdict = "no growth detected"
    else:
        verdict = f"{'grows' if slope > 0 else 'shrinks'} {abs(slope):.1f} ± {stderr:.1f} kB/min"
    return {"slope_kb_per_min": round(slope, 2), "stderr_kb_per_min": round(stderr, 2),
            "verdict": verdict}
