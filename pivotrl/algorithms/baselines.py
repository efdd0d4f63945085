"""Sequence-level baselines: GRPO, Dr. GRPO, RLOO (one advantage per response)."""

from __future__ import annotations

import torch
from torch import Tensor

from pivotrl.algorithms.batch import TokenBatch
from pivotrl.algorithms.registry import register_estimator
from pivotrl.algorithms.stats import EPS_STD, group_ids, group_reward_stats


def grpo_sequence_advantage(batch: TokenBatch, norm_by_std: bool = True) -> Tensor:
    """Â (N,): (r - mean_g r) / (std_g r + eps), or r - mean_g r when norm_by_std is False.

    A group whose rewards are all equal gets exactly 0 (no float noise from the mean).
    """
    rewards = batch.rewards.to(batch.compute_dtype)
    gid, num_groups = group_ids(batch.group_index)
    stats = group_reward_stats(rewards, gid, num_groups)
    centered = torch.where(stats.zero_variance, 0.0, rewards - stats.mean)
    return centered / (stats.std + EPS_STD) if norm_by_std else centered


def broadcast_to_tokens(per_response: Tensor, mask: Tensor) -> Tensor:
    """(N,) values copied to every valid token of their response, 0 on padding: (N,T)."""
    return torch.where(mask, per_response.unsqueeze(1), torch.zeros((), dtype=per_response.dtype, device=mask.device))


@register_estimator("grpo")
def grpo(batch: TokenBatch, *, norm_by_std: bool = True) -> Tensor:
    """GRPO (2402.03300): the group-normalised reward on every token. Returns (N,T)."""
    return broadcast_to_tokens(grpo_sequence_advantage(batch, norm_by_std), batch.response_mask)


@register_estimator("dr_grpo")
def dr_grpo(batch: TokenBatch) -> Tensor:
    """Dr. GRPO (2503.20783): r - mean_g r, no std division. Returns (N,T)."""
    return broadcast_to_tokens(grpo_sequence_advantage(batch, norm_by_std=False), batch.response_mask)


@register_estimator("rloo")
def rloo(batch: TokenBatch) -> Tensor:
    """RLOO: r_i - mean of the other responses of its group (0 baseline alone). Returns (N,T)."""
    rewards = batch.rewards.to(batch.compute_dtype)
    gid, num_groups = group_ids(batch.group_index)
    size = torch.bincount(gid, minlength=num_groups)[gid]
    total = rewards.new_zeros(num_groups).index_add_(0, gid, rewards)[gid]
    others = torch.where(size > 1, (total - rewards) / (size - 1).clamp(min=1), 0.0)
    stats = group_reward_stats(rewards, gid, num_groups)
    adv = torch.where(stats.zero_variance, 0.0, rewards - others)
    return broadcast_to_tokens(adv, batch.response_mask)
