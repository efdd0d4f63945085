"""pivot_mc: Monte-Carlo values at the pivots, one advantage per segment (docs/ALGORITHMS.md, "pivot_mc").

Each response i of reward r_i is cut before each of its pivots p_1 < ... < p_m (tokens where
branches were sampled, rollout.branch), so its tokens fall into segments [p_j, p_{j+1}):

    V(0)     the group's mean reward                          (before the first token)
    V(p_j)   V̂ at the pivot, TokenBatch.pivot_values:         (Σ_k r_k + r_i) / (K + 1)
    V(L_i)   r_i                                              (after the last token)
    A_t      V(p_{j+1}) − V(p_j)                              for p_j <= t < p_{j+1}
    Â_t      A_t / (std_g r + ε)      norm_by_std, in a group whose rewards differ; else A_t

The segment that starts at a pivot carries the change in value its choice made, so an outcome
decided at one token lands on that token's segment. With no pivot a response is one segment,
r_i − mean_g r: GRPO's Dr. advantage (then normalised as GRPO normalises).
"""

from __future__ import annotations

import torch
from torch import Tensor

from pivotrl.algorithms.batch import TokenBatch, masked
from pivotrl.algorithms.registry import register_estimator
from pivotrl.algorithms.stats import EPS_STD, group_ids, group_reward_stats


@register_estimator("pivot_mc", requires=("pivot_values",))
def pivot_mc(batch: TokenBatch, *, norm_by_std: bool = True) -> Tensor:
    """pivot_mc: V(next cut) − V(this cut) on every token of a segment, cut at the branched pivots. (N,T)."""
    mask = batch.response_mask
    rewards = batch.rewards.to(batch.compute_dtype)
    gid, num_groups = group_ids(batch.group_index)
    stats = group_reward_stats(rewards, gid, num_groups)
    values = batch.pivot_values.to(batch.compute_dtype)
    t = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    end_of_response = mask.shape[1]

    # 1. the cuts: the pivots (a value there), 0 before the first token, L after the last
    is_cut = mask & ~torch.isnan(values)
    values = torch.where(is_cut, values, 0.0)

    # 2. V at the start of each token's segment: the last cut at or before it, else V(0)
    last_cut = torch.where(is_cut, t, -1).cummax(dim=1).values
    v_start = torch.where(last_cut >= 0, values.gather(1, last_cut.clamp(min=0)), stats.mean.unsqueeze(1))

    # 3. V at its end: the first cut after it, else V(L) = r
    next_cut = torch.where(is_cut, t, end_of_response).flip(1).cummin(dim=1).values.flip(1)
    next_cut = torch.cat([next_cut[:, 1:], torch.full_like(next_cut[:, :1], end_of_response)], dim=1)
    v_end = torch.where(next_cut < end_of_response, values.gather(1, next_cut.clamp(max=end_of_response - 1)),
                        rewards.unsqueeze(1))

    # 4. the segment's change in value, normalised as GRPO normalises
    advantage = v_end - v_start
    if norm_by_std:
        rewards_differ = stats.std > 0
        advantage = advantage / torch.where(rewards_differ, stats.std + EPS_STD, 1.0).unsqueeze(1)
    return masked(advantage, mask)
