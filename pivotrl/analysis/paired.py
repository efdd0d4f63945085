"""Methods against one baseline, paired by seed: each seed's difference, its t-interval, Holm's correction.

Runs of a comparison that share a seed share the data order, the sampling draws up to where the
methods diverge, and the held-out evaluation's problems and seed, so the difference of two methods
is taken seed by seed, and its spread is the spread of those differences (often much smaller than
either method's spread across seeds). Several methods against one baseline are several tests: Holm's
step-down correction keeps the chance of any false claim at α.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PairedDifference:
    """mean(method − baseline) over the seeds both have, its 95% t-interval, and the two-sided p-value."""

    seeds: int
    mean: float
    low: float
    high: float
    p_value: float
    sd: float  # of the per-seed differences


def paired_difference(method: dict[int, float], baseline: dict[int, float], confidence: float = 0.95) -> PairedDifference:
    """The paired t-interval of method − baseline over the seeds both have (values by seed)."""
    from scipy import stats

    seeds = sorted(set(method) & set(baseline))
    diffs = [method[s] - baseline[s] for s in seeds]
    n = len(diffs)
    if n == 0:
        return PairedDifference(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    mean = sum(diffs) / n
    if n < 2:
        return PairedDifference(n, mean, math.nan, math.nan, math.nan, math.nan)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd == 0:
        return PairedDifference(n, mean, mean, mean, 0.0 if mean else 1.0, 0.0)
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    p = 2 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1)
    return PairedDifference(n, mean, mean - half, mean + half, float(p), sd)


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (each compared with α as it is): the k-th smallest of m is
    multiplied by m − k + 1, and the adjusted values are made non-decreasing in that order."""
    order = sorted(p_values, key=lambda name: p_values[name])
    m, running, out = len(order), 0.0, {}
    for k, name in enumerate(order):
        running = max(running, min(1.0, (m - k) * p_values[name]))
        out[name] = running
    return out


def detectable_difference(sd_of_differences: float, seeds: int, *, alpha: float = 0.05, power: float = 0.8,
                          tests: int = 1) -> float:
    """The smallest true mean difference a paired two-sided t-test over `seeds` seeds detects with `power`,
    at level alpha / tests (Holm's first step, the strictest), given the per-seed differences' sd."""
    from scipy import stats

    df = seeds - 1
    return (stats.t.ppf(1 - alpha / (2 * tests), df) + stats.t.ppf(power, df)) * sd_of_differences / math.sqrt(seeds)
