"""The diagnostics every estimator logs (ALGORITHMS.md, 'Logged diagnostics')."""

from __future__ import annotations

import torch
from torch import Tensor

from pivotrl.algorithms.batch import TokenBatch, masked
from pivotrl.algorithms.stats import group_ids, group_reward_stats, group_zscore, masked_quantile

PIVOT_Z = 1.0


def estimator_diagnostics(batch: TokenBatch, advantages: Tensor) -> dict[str, float]:
    """Entropy mean/quantiles, pivot fraction (group entropy z > 1), mean |A| on pivots
    vs the rest, zero-variance group fraction, response length mean/max; with free_mask,
    where the credit and the entropy fall (free_token_diagnostics)."""
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
    if batch.free_mask is not None and n_valid:
        out.update(free_token_diagnostics(batch, abs_adv))
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


def free_token_diagnostics(batch: TokenBatch, abs_adv: Tensor) -> dict[str, float]:
    """With the task's free_mask: credit/free_share, the share of Σ|A| on free tokens (NaN when Σ|A| = 0);
    tokens/free_frac; and with entropies, entropy/free_share (the share of ΣH on free tokens) and the mean
    entropy of free and of decisive (the other) tokens."""
    mask = batch.response_mask
    free = batch.field("free_mask", "free_token_diagnostics") > 0.5
    decisive = mask & ~free
    total = abs_adv.sum()
    out = {"credit/free_share": float(abs_adv[free].sum() / total) if total > 0 else float("nan"),
           "tokens/free_frac": float(free.sum() / mask.sum())}
    if batch.entropies is not None:
        entropy = batch.field("entropies", "free_token_diagnostics")
        out.update({
            "entropy/free_share": float(entropy[free].sum() / entropy.sum()) if entropy.sum() > 0 else float("nan"),
            "entropy/free_mean": float(entropy[free].mean()) if free.any() else float("nan"),
            "entropy/decisive_mean": float(entropy[decisive].mean()) if decisive.any() else float("nan"),
        })
    return out
