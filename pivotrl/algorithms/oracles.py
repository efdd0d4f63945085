"""Oracles: controls that know what no method can know, and so bound what credit assignment can gain.

They are not methods: they read marks only a synthetic task can give (TokenBatch.free_mask,
TokenBatch.reachable; the tasks' ``token_marks``), and the TRL and verl adapters refuse them.
docs/ALGORITHMS.md, "Oracles", defines both.

grpo_oracle knows which tokens cannot change the outcome:

    A_{i,t} = Â_i · (1 − free_{i,t})             Â_i GRPO's advantage, (r_i − mean_g r) / (std_g r + ε)

process_oracle knows which states can still reach the target, and uses it as a baseline
that depends on the state a token is written in, and on nothing the token itself decides
(so the policy gradient stays unbiased):

    b_{i,t} = mean_g r    while the target can still be reached (reachable_{i,t} = 1)
    b_{i,t} = 0           once it cannot (the response can only fail from there)
    A_{i,t} = (r_i − b_{i,t}) / (std_g r + ε)    in a group whose rewards differ; r_i − b_{i,t} otherwise

A token of a failed response written after the target became unreachable gets 0 instead
of GRPO's negative advantage: the failure was decided before it.
"""

from __future__ import annotations

from torch import Tensor

from pivotrl.algorithms.baselines import broadcast_to_tokens, grpo_sequence_advantage
from pivotrl.algorithms.batch import TokenBatch, masked
from pivotrl.algorithms.registry import register_estimator
from pivotrl.algorithms.stats import EPS_STD, group_ids, group_reward_stats

ORACLES = ("grpo_oracle", "process_oracle")


@register_estimator("grpo_oracle", requires=("free_mask",))
def grpo_oracle(batch: TokenBatch, *, norm_by_std: bool = True) -> Tensor:
    """GRPO's advantage with every free token set to 0. (N,T)."""
    grpo = broadcast_to_tokens(grpo_sequence_advantage(batch, norm_by_std), batch.response_mask)
    return grpo * (1 - batch.field("free_mask", "grpo_oracle"))


@register_estimator("process_oracle", requires=("reachable",))
def process_oracle(batch: TokenBatch, *, norm_by_std: bool = True) -> Tensor:
    """r − b(state), b = the group's mean reward while the target is reachable, else 0; normalised as GRPO. (N,T)."""
    rewards = batch.rewards.to(batch.compute_dtype)
    gid, num_groups = group_ids(batch.group_index)
    stats = group_reward_stats(rewards, gid, num_groups)
    reachable = batch.field("reachable", "process_oracle")
    baseline = reachable * stats.mean.unsqueeze(1)
    advantage = rewards.unsqueeze(1) - baseline
    if norm_by_std:
        rewards_differ = stats.std > 0
        advantage = advantage / (stats.std + EPS_STD).where(rewards_differ, 1.0).unsqueeze(1)
    return masked(advantage, batch.response_mask)
