"""Grouped, masked statistics: reward statistics per group, token z-scores per group, quantiles.

Vectorised over responses and tokens (no Python loop over either).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

EPS_STD = 1e-6


def group_ids(group_index: Tensor) -> tuple[Tensor, int]:
    """Dense group ids 0..G-1 (N,) int64 for arbitrary group labels (N,), and G."""
    unique, inverse = torch.unique(group_index, return_inverse=True)
    return inverse, unique.numel()


class GroupStats(NamedTuple):
    """Per-response views of its group's reward statistics, each (N,)."""

    mean: Tensor
    std: Tensor
    size: Tensor
    zero_variance: Tensor  # bool: group of >= 2 responses whose rewards are all equal


def group_reward_stats(rewards: Tensor, gid: Tensor, num_groups: int) -> GroupStats:
    """Group mean and unbiased std of rewards (N,); a group of size 1 has mean 0, std 1."""
    size = torch.bincount(gid, minlength=num_groups)
    total = rewards.new_zeros(num_groups).index_add_(0, gid, rewards)
    mean = total / size.clamp(min=1)
    dev = rewards - mean[gid]
    var = rewards.new_zeros(num_groups).index_add_(0, gid, dev * dev) / (size - 1).clamp(min=1)
    high = rewards.new_full((num_groups,), -torch.inf).scatter_reduce_(0, gid, rewards, "amax")
    low = rewards.new_full((num_groups,), torch.inf).scatter_reduce_(0, gid, rewards, "amin")
    single = size == 1
    zero_var = (size >= 2) & (high == low)
    mean = torch.where(single, 0.0, mean)
    std = torch.where(single, 1.0, torch.where(zero_var, 0.0, var.sqrt()))
    return GroupStats(mean[gid], std[gid], size[gid], zero_var[gid])


def group_zscore(
    x: Tensor, mask: Tensor, gid: Tensor, num_groups: int, *,
    bucket: Tensor | None = None, num_buckets: int = 1, eps: float = EPS_STD,
) -> Tensor:
    """(x − mean_c) / (std_c + eps) at every valid token, over the valid tokens of its cell c. (N,T), 0 on padding.

    A cell is a group (all valid tokens of the group's responses) or, with `bucket`
    (N,T) int64 in [0, num_buckets), a (group, bucket) pair. x (N,T) float, padding
    values ignored; mask (N,T) bool; gid (N,) dense group ids. std is the unbiased
    sample std; a cell with fewer than two valid tokens gives 0.
    """
    values = torch.where(mask, x, 0.0)

    def cell_sums(per_token: Tensor) -> Tensor:
        """(G,K) sums of a (N,T) quantity over each cell's tokens."""
        if bucket is None:
            per_response = per_token.sum(dim=1, keepdim=True)
        else:
            per_response = per_token.new_zeros(per_token.shape[0], num_buckets).scatter_add_(1, bucket, per_token)
        return per_response.new_zeros(num_groups, per_response.shape[1]).index_add_(0, gid, per_response)

    def at_tokens(table: Tensor) -> Tensor:
        """Each token's entry of a (G,K) cell table: (N,T), or (N,1) to broadcast when there are no buckets."""
        per_response = table[gid]
        return per_response if bucket is None else per_response.gather(1, bucket)

    count = cell_sums(mask.to(values.dtype))
    mean = cell_sums(values) / count.clamp(min=1)
    centred = torch.where(mask, values - at_tokens(mean), 0.0)
    var = cell_sums(centred * centred) / (count - 1).clamp(min=1)
    scale = torch.where(count >= 2, 1.0 / (var.sqrt() + eps), 0.0)
    return centred * at_tokens(scale)


def masked_quantile(x: Tensor, mask: Tensor, q: float) -> Tensor:
    """The q-quantile of x over valid tokens, linear interpolation as torch.quantile.

    Computed by selection (kthvalue), so it has no input-size limit; values at padding
    are ignored. Returns a 0-dim tensor, NaN when there are no valid tokens.
    """
    values = x[mask]
    n = values.numel()
    if n == 0:
        return x.new_full((), torch.nan)
    pos = q * (n - 1)
    lo = int(pos)
    low = torch.kthvalue(values, lo + 1).values
    if lo + 1 >= n or pos == lo:
        return low
    high = torch.kthvalue(values, lo + 2).values
    return low + (pos - lo) * (high - low)
