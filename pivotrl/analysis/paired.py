"""Methods against one baseline, paired by seed: each seed's difference, its t-interval, Holm's correction.

Runs of a comparison that share a seed share the data order, the sampling draws up to where the
methods diverge, and the held-out evaluation's problems and seed, so the difference of two methods
is taken seed by seed, and its spread is the spread of those differences (often much smaller than
either method's spread across seeds). Several methods against one baseline are several tests: Holm's
step-down correction keeps the chance of any false claim at α.

A family of arms with few seeds each (two give a paired test one degree of freedom) is compared
instead with the runs' spread pooled over every arm (:func:`pooled_difference`, one-way ANOVA's
within-arm variance), on the assumption, reported with each arm's own spread, that the training seed
moves every method's result alike.
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


@dataclass(frozen=True)
class PooledDifference:
    """mean(method) − mean(baseline), its 95% t-interval and two-sided p-value, from the pooled runs' sd."""

    seeds: int
    baseline_seeds: int
    mean: float
    low: float
    high: float
    p_value: float
    sd: float  # of one run's result about its arm's mean, pooled over every arm
    df: int


def pooled_sd(arms: list[list[float]]) -> tuple[float, int]:
    """The within-arm sd pooled over `arms` (each arm's results by seed) and its degrees of freedom, Σ(n − 1)."""
    df = sum(len(a) - 1 for a in arms if a)
    squares = sum(sum((x - sum(a) / len(a)) ** 2 for x in a) for a in arms if a)
    return (math.sqrt(squares / df) if df > 0 else math.nan), df


def pooled_difference(method: list[float], baseline: list[float], arms: list[list[float]],
                      confidence: float = 0.95) -> PooledDifference:
    """method − baseline (each a list of results by seed) with the sd pooled over `arms`, the family's every arm."""
    from scipy import stats

    sd, df = pooled_sd(arms)
    n, m = len(method), len(baseline)
    mean = sum(method) / n - sum(baseline) / m
    if not df or not math.isfinite(sd):
        return PooledDifference(n, m, mean, math.nan, math.nan, math.nan, sd, df)
    se = sd * math.sqrt(1 / n + 1 / m)
    if se == 0:
        return PooledDifference(n, m, mean, mean, mean, 0.0 if mean else 1.0, 0.0, df)
    half = stats.t.ppf(0.5 + confidence / 2, df) * se
    p = 2 * stats.t.sf(abs(mean) / se, df)
    return PooledDifference(n, m, mean, mean - half, mean + half, float(p), sd, df)


def pooled_detectable_difference(sd: float, seeds: int, baseline_seeds: int, df: int, *, alpha: float = 0.05,
                                 power: float = 0.8, tests: int = 1) -> float:
    """The smallest true difference the pooled two-sided t-test detects with `power` at level alpha / tests,
    given the pooled sd, the two arms' seeds and the pooled degrees of freedom."""
    from scipy import stats

    se = sd * math.sqrt(1 / seeds + 1 / baseline_seeds)
    return (stats.t.ppf(1 - alpha / (2 * tests), df) + stats.t.ppf(power, df)) * se
