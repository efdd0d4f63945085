"""The diagnostics every estimator logs (ALGORITHMS.md, 'Logged diagnostics')."""

from __future__ import annotations

import torch
from torch import Tensor

from pivotrl.algorithms.batch import TokenBatch, masked
from pivotrl.algorithms.stats import group_ids, group_reward_stats, group_zscore, masked_quantile

PIVOT_Z = 1.0


def estimator_diagnostics(batch: TokenBatch, advantages: Tensor) -> dict[str, float]:
    """Entropy mean/quantiles, pivot fraction (group entropy z > 1), mean |A| on pivots
    vs the rest, zero-variance group fraction, response length mean/max."""
    mask = batch.response_mask
    dtype = batch.compute_dtype
    gid, num_groups = group_ids(batch.group_index)
    stats = group_reward_stats(batch.rewards.to(dtype), gid, num_groups)
    lengths = batch.lengths.to(dtype)
    zero_var_groups = torch.zeros(num_groups, dtype=torch.bool, device=mask.device)
    zero_var_groups[gid] = stats.zero_variance
    abs_adv = masked(advantages.detach().to(dtype).abs(), mask)
    n_valid = int(mask.sum())
    out = {
        "groups/zero_var_frac": float(zero_var_groups.to(dtype).mean()),
        "response_length/mean": float(lengths.mean()) if lengths.numel() else 0.0,
        "response_length/max": float(lengths.max()) if lengths.numel() else 0.0,
        "adv/abs_mean": float(abs_adv.sum() / max(n_valid, 1)),
    }
    if batch.entropies is None or n_valid == 0:
        return out
    entropy = batch.field("entropies", "diagnostics")
    pivots = mask & (group_zscore(entropy, mask, gid, num_groups) > PIVOT_Z)
    rest = mask & ~pivots
    n_pivots = int(pivots.sum())
    out.update(
        {
            "entropy/mean": float(entropy.sum() / n_valid),
            "entropy/p10": float(masked_quantile(entropy, mask, 0.1)),
            "entropy/p50": float(masked_quantile(entropy, mask, 0.5)),
            "entropy/p90": float(masked_quantile(entropy, mask, 0.9)),
            "pivots/frac": n_pivots / n_valid,
            "adv/abs_mean_pivots": float(abs_adv[pivots].sum() / max(n_pivots, 1)),
            "adv/abs_mean_rest": float(abs_adv[rest].sum() / max(n_valid - n_pivots, 1)),
        }
    )
    return out
