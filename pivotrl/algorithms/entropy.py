"""Entropy baselines: the 80/20 high-entropy mask, entropy advantage shaping, GTPO."""

from __future__ import annotations

import torch
from torch import Tensor

from pivotrl.algorithms.baselines import grpo_sequence_advantage
from pivotrl.algorithms.batch import TokenBatch
from pivotrl.algorithms.registry import register_estimator
from pivotrl.algorithms.stats import (
    EPS_STD,
    group_ids,
    is_prefix_mask,
    masked_quantile,
    small_table_dtype,
    valid_lengths,
)
from pivotrl.algorithms.validate import check


@register_estimator("high_entropy", requires=("entropies",))
def high_entropy(batch: TokenBatch, *, rho: float = 0.2, norm_by_std: bool = True) -> Tensor:
    """80/20 (2506.01939): GRPO advantage on tokens with H >= the batch's (1-rho) quantile, 0 elsewhere."""
    check(0.0 < rho <= 1.0, f"rho must be in (0, 1], got {rho}")
    mask = batch.response_mask
    if batch.entropies is None:
        raise ValueError("high_entropy needs TokenBatch.entropies, which is None")
    entropy = batch.entropies.to(batch.compute_dtype)  # padding may hold anything: the mask decides
    threshold = masked_quantile(entropy, mask, 1.0 - rho)
    seq_adv = grpo_sequence_advantage(batch, norm_by_std).unsqueeze(1)
    selected = torch.ge(entropy, threshold).logical_and_(mask)
    return torch.where(selected, seq_adv, torch.zeros((), dtype=seq_adv.dtype, device=seq_adv.device))


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
    gid, num_groups = group_ids(batch.group_index)
    lengths = valid_lengths(mask)
    positive = rewards >= theta_r
    if batch.entropies is None:
        raise ValueError("gtpo needs TokenBatch.entropies, which is None")
    entropy = batch.entropies.to(rewards.dtype)
    # weight: H on O+, 1/max(H, eps) on O-, 0 on padding (one (N,T) buffer: 1/max(inf, eps) = 0)
    infinity = torch.full((), torch.inf, dtype=entropy.dtype, device=entropy.device)
    weight = torch.where(mask, entropy, infinity).clamp_(min=EPS_STD).reciprocal_()
    weight = torch.where(positive.unsqueeze(1), entropy, weight, out=weight)
    weight = torch.where(mask, weight, torch.zeros((), dtype=weight.dtype, device=weight.device), out=weight)
    # one row per (group, side): how many responses of that side are active at t (d_t or h_t), their weight sum
    row = gid * 2 + (~positive).long()
    cells, width = 2 * num_groups, mask.shape[1]
    total = weight.new_zeros(cells, width).index_add_(0, row, weight)
    if is_prefix_mask(mask):  # active at t <=> t < T_i: count the lengths instead of the tokens
        ended = weight.new_zeros(cells, width + 1).index_put_((row, lengths), weight.new_ones(()), accumulate=True)
        count = ended.cumsum_(dim=1)[:, :width].neg_().add_(torch.bincount(row, minlength=cells).to(weight.dtype).unsqueeze(1))
    else:
        count = weight.new_zeros(cells, width).index_add_(0, row, mask.to(weight.dtype))
    # bonus = ±alpha2·share·count = ±alpha2·weight·count/total (sign: + on O+, - on O-)
    has_total = total > 0
    side = torch.tensor([1.0, -1.0], dtype=weight.dtype, device=weight.device).repeat(num_groups).unsqueeze(1)
    per_weight = torch.where(has_total, alpha2 * count / torch.where(has_total, total, 1.0), 0.0).mul_(side)
    bonus = weight.mul_(per_weight[row])
    zero_total = ~has_total & (count > 0)
    if bool(zero_total.any()):  # share 1/count: the bonus is alpha2 on every active token there
        bonus.add_(torch.where(mask, (alpha2 * zero_total.to(bonus.dtype) * side)[row], 0.0))
    # token reward = bonus + base (O+: alpha1·r, O-: -alpha1), z-scored over the group's valid tokens
    base = torch.where(positive, alpha1 * rewards, -alpha1)
    wide = small_table_dtype(bonus)
    size = lengths.to(wide)

    def per_group(per_response: Tensor) -> Tensor:
        return per_response.new_zeros(num_groups).index_add_(0, gid, per_response)[gid]

    group_size = per_group(size)
    mean = per_group(bonus.sum(dim=1).to(wide) + base.to(wide) * size) / group_size.clamp(min=1)
    centred = bonus.add_((base.to(wide) - mean).to(bonus.dtype).unsqueeze(1))
    centred = torch.where(mask, centred, torch.zeros((), dtype=centred.dtype, device=centred.device), out=centred)
    var = per_group(torch.linalg.vector_norm(centred, dim=1).to(wide).square_()) / (group_size - 1).clamp(min=1)
    scale = torch.where(group_size >= 2, 1.0 / (var.sqrt() + EPS_STD), 0.0)
    return centred.mul_(scale.to(centred.dtype).unsqueeze(1))
