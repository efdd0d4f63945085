"""Entropy baselines: the 80/20 high-entropy mask, entropy advantage shaping, GTPO."""

from __future__ import annotations

import torch
from torch import Tensor

from pivotrl.algorithms.baselines import grpo_sequence_advantage
from pivotrl.algorithms.batch import TokenBatch
from pivotrl.algorithms.registry import register_estimator
from pivotrl.algorithms.stats import EPS_STD, cell_zscore, group_ids, masked_quantile
from pivotrl.algorithms.validate import check


@register_estimator("high_entropy", requires=("entropies",))
def high_entropy(batch: TokenBatch, *, rho: float = 0.2, norm_by_std: bool = True) -> Tensor:
    """80/20 (2506.01939): GRPO advantage on tokens with H >= the batch's (1-rho) quantile, 0 elsewhere."""
    check(0.0 < rho <= 1.0, f"rho must be in (0, 1], got {rho}")
    mask = batch.response_mask
    entropy = batch.field("entropies", "high_entropy")
    threshold = masked_quantile(entropy, mask, 1.0 - rho)
    seq_adv = grpo_sequence_advantage(batch, norm_by_std).unsqueeze(1)
    # entropy is 0 on padding; masking after the comparison keeps a threshold of 0 from admitting padding
    return torch.where(entropy >= threshold, seq_adv, 0.0).masked_fill_(~mask, 0.0)


@register_estimator("entropy_shaping", requires=("entropies",))
def entropy_shaping(
    batch: TokenBatch, *, alpha: float = 0.4, kappa: float = 2.0, norm_by_std: bool = True
) -> Tensor:
    """Cheng et al. (2506.14758): A = Â + min(alpha·H, |Â|/kappa) on every valid token."""
    check(alpha >= 0.0, f"alpha must be >= 0, got {alpha}")
    check(kappa > 0.0, f"kappa must be > 0, got {kappa}")
    seq_adv = grpo_sequence_advantage(batch, norm_by_std).unsqueeze(1)
    entropy = batch.field("entropies", "entropy_shaping")
    bonus = torch.minimum(alpha * entropy, seq_adv.abs() / kappa)
    return torch.where(batch.response_mask, seq_adv + bonus, 0.0)


@register_estimator("gtpo", requires=("entropies",))
def gtpo(
    batch: TokenBatch, *, alpha1: float = 1.0, alpha2: float = 0.1, theta_r: float = 0.5
) -> Tensor:
    """GTPO (2508.04349): entropy-weighted token rewards, z-normalised over each group's tokens.

    O+ (r >= theta_r): alpha1·r_i + alpha2·H/Σ_{O+ at t} H · d_t;
    O-: -alpha1 - alpha2·(1/H)/Σ_{O- at t}(1/H) · h_t. Where a share's
    denominator is 0 (every active O+ token has H = 0) the share is 1/d_t.
    """
    mask = batch.response_mask
    rewards = batch.rewards.to(batch.compute_dtype)
    entropy = batch.field("entropies", "gtpo")
    gid, num_groups = group_ids(batch.group_index)
    positive = (rewards >= theta_r).unsqueeze(1)
    weight = torch.where(positive, entropy, entropy.clamp(min=EPS_STD).reciprocal_()).masked_fill_(~mask, 0.0)
    # one row per (group, side): how many responses of that side are active at t (d_t or h_t), their weight sum
    row = gid * 2 + (~positive.squeeze(1)).long()
    count = weight.new_zeros(2 * num_groups, mask.shape[1]).index_add_(0, row, mask.to(weight.dtype))
    total = weight.new_zeros(2 * num_groups, mask.shape[1]).index_add_(0, row, weight)
    # bonus = alpha2·share·count: alpha2·weight·count/total, or alpha2 where total is 0 (share 1/count)
    has_total = total > 0
    bonus = weight.mul_((alpha2 * count / torch.where(has_total, total, 1.0))[row])
    zero_total = ~has_total & (count > 0)
    if bool(zero_total.any()):
        bonus.add_((alpha2 * zero_total.to(bonus.dtype))[row])
    # O+: alpha1·r + bonus, O-: -alpha1 - bonus
    sign = torch.where(positive, 1.0, -1.0).to(bonus.dtype)
    base = torch.where(positive, alpha1 * rewards.unsqueeze(1), -alpha1).to(bonus.dtype)
    token_rewards = bonus.mul_(sign).add_(base).masked_fill_(~mask, 0.0)
    return cell_zscore(token_rewards, mask, gid, num_groups, overwrite=True)
