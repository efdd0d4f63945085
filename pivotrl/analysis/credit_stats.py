"""The statistics of `pivotrl credit`: functions of their arguments alone, no model and no files.

Which positions get a ground truth (`entropy_deciles`, `select_positions`, on torch tensors),
and how an estimator's advantages A compare with A* (on numpy arrays): rank correlations,
sign agreement, the share of |A| on the tokens of largest |A*|, mean |A*| per entropy decile,
and percentile bootstrap intervals over responses. ALGORITHMS.md, section "Credit ground
truth", defines every metric.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

#: The metrics reported per estimator, in report order.
METRICS = ("spearman", "within_response_spearman", "sign_agreement", "sign_agreement_significant", "top10_mass")
#: The share of tokens, those of largest |A*|, on which top10_mass measures an estimator's share of |A|.
TOP_SHARE = 0.10
#: |A*| above Z95 standard errors is significant (sign_agreement_significant).
Z95 = 1.96


# -- positions and entropy deciles ----------------------------------------------------------------------


def entropy_deciles(entropies: Tensor, mask: Tensor) -> Tensor:
    """(N,T) int64 decile 0..9 of every valid token's entropy (equal counts by rank; -1 on padding)."""
    flat = entropies[mask].double().cpu()
    ranks = torch.empty(len(flat), dtype=torch.long)
    ranks[torch.argsort(flat, stable=True)] = torch.arange(len(flat))
    out = torch.full(mask.shape, -1, dtype=torch.long)
    out[mask.cpu()] = (10 * ranks) // max(len(flat), 1)
    return out


def select_positions(mask: Tensor, deciles: Tensor, per_decile: int | None, generator: torch.Generator) -> Tensor:
    """(M,2) (row, t) sorted: every valid position, or at most `per_decile` drawn at random from each decile."""
    valid = mask.cpu().nonzero()
    if per_decile is None:
        return valid
    if per_decile < 1:
        raise ValueError(f"positions per entropy decile must be >= 1, got {per_decile}")
    d = deciles[valid[:, 0], valid[:, 1]]
    picks = []
    for decile in range(10):
        members = (d == decile).nonzero().squeeze(1)
        picks.append(members[torch.randperm(len(members), generator=generator)[:per_decile]])
    chosen = valid[torch.cat(picks).sort().values]
    return chosen


# -- the metrics ----------------------------------------------------------------------------------------


def average_ranks(x: np.ndarray) -> np.ndarray:
    """0-based ranks of x, ties sharing their average rank (what Spearman's rho needs)."""
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    new_run = np.r_[True, ordered[1:] != ordered[:-1]]
    starts = np.flatnonzero(new_run)
    ends = np.r_[starts[1:], len(x)]
    ranks = np.empty(len(x))
    ranks[order] = ((starts + ends - 1) / 2.0)[np.cumsum(new_run) - 1]
    return ranks


def correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; NaN (undefined) when either side is constant or there are < 2 values."""
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan
    xc, yc = x - x.mean(), y - y.mean()
    return float((xc @ yc) / math.sqrt(float(xc @ xc) * float(yc @ yc)))


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either side is constant."""
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan
    return correlation(average_ranks(x), average_ranks(y))


def centre_per_response(x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """x minus its response's mean; tokens come in contiguous runs of `lengths`.

    A response whose values are all equal gets exactly 0 (not the float rounding of
    x - mean(x)), so a per-response constant such as GRPO's advantage leaves nothing.
    """
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    means = np.add.reduceat(x, starts) / lengths
    constant = np.maximum.reduceat(x, starts) == np.minimum.reduceat(x, starts)
    out = x - np.repeat(means, lengths)
    out[np.repeat(constant, lengths)] = 0.0
    return out


#: |A| at most this share of the estimator's largest |A| counts as 0 (float noise around an exact 0).
ZERO_TOLERANCE = 1e-6


def sign_agreement(a: np.ndarray, star: np.ndarray, zero: float = 0.0) -> float:
    """Share of tokens where sign(A) = sign(A*), among tokens where |A| > zero and A* != 0; NaN if none."""
    both = (np.abs(a) > zero) & (star != 0)
    return float(np.mean(np.sign(a[both]) == np.sign(star[both]))) if both.any() else math.nan


def top_weights(star: np.ndarray, share: float = TOP_SHARE) -> np.ndarray:
    """Weights in [0,1] selecting the share of tokens with the largest |A*| (ties at the cut share the rest)."""
    size = abs(star)
    m = share * len(star)
    if len(star) == 0:
        return np.zeros(0)
    cut = np.sort(size)[::-1][max(math.ceil(m) - 1, 0)]
    above, tied = size > cut, size == cut
    weights = above.astype(float)
    weights[tied] = (m - above.sum()) / tied.sum()
    return weights


def top_mass_share(a: np.ndarray, weights: np.ndarray) -> float:
    """Share of Σ|A| that falls on the tokens `weights` selects; NaN when Σ|A| = 0."""
    total = float(np.abs(a).sum())
    return float(np.abs(a) @ weights) / total if total > 0 else math.nan


def estimator_metrics(adv: np.ndarray, star: np.ndarray, se: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """(E, len(METRICS)) metrics of every estimator's advantages adv (E, n) against A* (n,).

    Tokens come in contiguous runs of `lengths` per response. NaN marks an undefined value.
    """
    star_ranks = average_ranks(star)
    star_c = centre_per_response(star, lengths)
    significant = abs(star) > Z95 * se
    weights = top_weights(star)
    out = np.full((adv.shape[0], len(METRICS)), math.nan)
    for e, a in enumerate(adv):
        a_c = centre_per_response(a, lengths)
        out[e, 0] = math.nan if np.all(a == a[0]) else correlation(average_ranks(a), star_ranks)
        out[e, 1] = spearman(a_c, star_c)
        # float noise around an exact 0 (a z-score of values equal up to rounding) has no sign
        zero = ZERO_TOLERANCE * float(np.abs(a).max())
        out[e, 2] = sign_agreement(a, star, zero)
        out[e, 3] = sign_agreement(a[significant], star[significant], zero)
        out[e, 4] = top_mass_share(a, weights)
    return out


def decile_means(abs_star: np.ndarray, deciles: np.ndarray) -> np.ndarray:
    """(11,): mean |A*| in each entropy decile 0..9 (NaN if empty), then the ratio top / bottom."""
    counts = np.bincount(deciles, minlength=10).astype(float)
    sums = np.bincount(deciles, weights=abs_star, minlength=10)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), math.nan)
        ratio = means[9] / means[0] if means[0] > 0 else math.nan
    return np.r_[means, ratio]


def bootstrap_ci(statistic: Callable[[np.ndarray, np.ndarray], np.ndarray], lengths: np.ndarray, resamples: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Percentile 95% interval (low, high) of statistic(token_index, run_lengths) over responses resampled.

    Tokens come in contiguous runs of `lengths`, one run per response; each resample draws
    as many responses with replacement and passes their tokens (as an index) and run lengths.
    Resamples where a value is undefined (NaN) are left out of that value's interval.
    """
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    draws = []
    for _ in range(resamples):
        pick = rng.integers(0, len(lengths), len(lengths))
        lens = lengths[pick]
        offsets = np.repeat(starts[pick] - np.r_[0, np.cumsum(lens)[:-1]], lens)
        draws.append(statistic(offsets + np.arange(lens.sum()), lens))
    stacked = np.stack(draws)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column gives NaN, which is what it should
        low, high = np.nanpercentile(stacked, [2.5, 97.5], axis=0)
    return low, high


def triplet(low: float, estimate: float, high: float) -> list[float | None]:
    """[low, estimate, high] for JSON, None for an undefined value (all None when the estimate is)."""
    if not math.isfinite(estimate):
        return [None, None, None]
    return [float(v) if math.isfinite(v) else None for v in (low, estimate, high)]


def entropy_decile_table(star: np.ndarray, se: np.ndarray, bound: np.ndarray, position_deciles: np.ndarray,
                         token_entropies: np.ndarray, token_deciles: np.ndarray, run_lengths: np.ndarray,
                         resamples: int, rng: np.random.Generator) -> dict[str, Any]:
    """credit.json's "entropy_deciles": per decile, mean |A*| [95% interval] beside its noise floor and bound.

    `star`, `se`, `bound` (1 - π(o_t)) and `position_deciles` are per position, in contiguous runs of
    `run_lengths` per response; `token_entropies` and `token_deciles` are every valid token's, for the
    deciles' entropy ranges. The 95% intervals (each decile's mean |A*|, the ratio top / bottom decile)
    resample responses `resamples` times with `rng`.
    """
    abs_star = np.abs(star)
    point = decile_means(abs_star, position_deciles)
    low, high = bootstrap_ci(lambda idx, lens: decile_means(abs_star[idx], position_deciles[idx]),
                             run_lengths, resamples, rng)
    noise = se * math.sqrt(2 / math.pi)
    rows = []
    for d in range(10):
        here, entropies_here = position_deciles == d, token_entropies[token_deciles == d]
        rows.append({
            "decile": d + 1, "entropy_low": float(entropies_here.min()) if len(entropies_here) else None,
            "entropy_high": float(entropies_here.max()) if len(entropies_here) else None,
            "positions": int(here.sum()), "mean_abs_advantage_true": triplet(low[d], point[d], high[d]),
            "noise_floor": float(noise[here].mean()) if here.any() else None,
            "mean_sq_debiased": float((star[here] ** 2 - se[here] ** 2).mean()) if here.any() else None,
            "bound_mean": float(bound[here].mean()) if here.any() else None,
        })
    return {"deciles": rows, "top_bottom_ratio": triplet(low[10], point[10], high[10])}
