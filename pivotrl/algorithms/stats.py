"""Grouped and segmented masked statistics, vectorised with scatter/index ops.

A *segment* is any set of tokens that shares one statistic: a group (all
valid tokens of its responses) or an ERPO (group, bucket) cell. Segment ids
come either per response, shape (N,), or per token, shape (N,T).
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


def cell_zscore(
    x: Tensor,
    mask: Tensor,
    gid: Tensor,
    num_groups: int,
    buckets: Tensor | None = None,
    num_buckets: int = 1,
    eps: float = EPS_STD,
) -> Tensor:
    """(x - mean)/(std + eps) over the valid tokens of each (group, bucket) cell.

    x (N,T) float, zero on padding; mask (N,T) bool; gid (N,) dense group ids;
    buckets (N,T) int64 in [0, num_buckets), or None for one cell per group.
    std is the unbiased sample std; a cell with fewer than 2 tokens gives 0.
    Returns (N,T), exactly 0 on padding.
    """
    m = mask.to(x.dtype)

    def cell_sums(values: Tensor) -> Tensor:
        """Per-cell sums broadcast back to every response of the group: (N,1) or (N,K)."""
        if buckets is None:
            per_response = values.sum(dim=1, keepdim=True)
        else:
            per_response = values.new_zeros(values.shape[0], num_buckets).scatter_add_(1, buckets, values)
        per_group = per_response.new_zeros(num_groups, per_response.shape[1]).index_add_(0, gid, per_response)
        return per_group[gid]

    def to_tokens(per_cell: Tensor) -> Tensor:
        """(N,1) broadcasts as is; (N,K) is gathered at each token's bucket."""
        return per_cell if buckets is None else torch.gather(per_cell, 1, buckets)

    count = cell_sums(m)
    mean = cell_sums(x) / count.clamp(min=1)
    dev = (x - to_tokens(mean)).mul_(m)  # in-place ops: no fresh (N,T) buffers on the hot path
    if buckets is None:
        squares = torch.linalg.vecdot(dev, dev).unsqueeze(1)
        squares = squares.new_zeros(num_groups, 1).index_add_(0, gid, squares)[gid]
    else:
        squares = cell_sums(dev * dev)
    var = squares / (count - 1).clamp(min=1)
    scale = torch.where(count >= 2, 1.0 / (var.sqrt() + eps), 0.0)
    return dev.mul_(to_tokens(scale))


def masked_quantile(x: Tensor, mask: Tensor, q: float) -> Tensor:
    """The q-quantile of x over valid tokens, linear interpolation as torch.quantile.

    One kthvalue selection over the tensor with padding set to +inf (no size
    limit, no boolean indexing). Returns a 0-dim tensor; NaN with no valid tokens.
    """
    n = int(mask.sum())
    if n == 0:
        return x.new_full((), torch.nan)
    values = torch.where(mask, x, torch.inf).reshape(-1)
    pos = q * (n - 1)
    lo = int(pos)
    v_lo = torch.kthvalue(values, lo + 1).values
    if lo + 1 >= n or pos == lo:
        return v_lo
    # the (lo+2)-th smallest is v_lo again if enough values tie with it, else the next larger value
    ties = int((values <= v_lo).sum())
    v_hi = v_lo if ties >= lo + 2 else torch.where(values > v_lo, values, torch.inf).min()
    return v_lo + (pos - lo) * (v_hi - v_lo)
