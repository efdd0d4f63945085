"""Entropy baselines: the 80/20 high-entropy mask, entropy advantage shaping, GTPO."""

from __future__ import annotations

import torch
from torch import Tensor

from pivotrl.algorithms.baselines import grpo_sequence_advantage
from pivotrl.algorithms.batch import TokenBatch
from pivotrl.algorithms.registry import register_estimator
from pivotrl.algorithms.stats import EPS_STD, group_ids, group_zscore, masked_quantile
from pivotrl.algorithms.validate import check


@register_estimator("high_entropy", requires=("entropies",))
def high_entropy(batch: TokenBatch, *, rho: float = 0.2, norm_by_std: bool = True) -> Tensor:
    """80/20 (2506.01939): GRPO advantage on tokens with H >= the batch's (1-rho) quantile, 0 elsewhere."""
    check(0.0 < rho <= 1.0, f"rho must be in (0, 1], got {rho}")
    mask = batch.response_mask
    entropy = batch.field("entropies", "high_entropy")
    threshold = masked_quantile(entropy, mask, 1.0 - rho)
    seq_adv = grpo_sequence_advantage(batch, norm_by_std)
    return torch.where(mask & (entropy >= threshold), seq_adv.unsqueeze(1), 0.0)


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
    positive = rewards >= theta_r
    # one row per (group, side): side 0 is O+, side 1 is O-
    side = gid * 2 + (~positive).long()
    active = mask.to(rewards.dtype)
    weight = torch.where(positive.unsqueeze(1), entropy, 1.0 / entropy.clamp(min=EPS_STD)) * active

    def per_side(x: Tensor) -> Tensor:
        """Σ over the responses of each (group, side) at every position t, back on each response's row."""
        return x.new_zeros(2 * num_groups, x.shape[1]).index_add_(0, side, x)[side]

    still_active = per_side(active)  # d_t on O+, h_t on O-
    weight_total = per_side(weight)  # Σ_{O+ at t} H, or Σ_{O- at t} 1/H
    share = torch.where(weight_total > 0, weight / torch.where(weight_total > 0, weight_total, 1.0),
                        1.0 / still_active.clamp(min=1))
    bonus = alpha2 * share * still_active
    token_reward = torch.where(positive.unsqueeze(1), alpha1 * rewards.unsqueeze(1) + bonus, -alpha1 - bonus)
    return group_zscore(token_reward, mask, gid, num_groups)
