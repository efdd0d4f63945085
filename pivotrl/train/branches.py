"""The branch phase of a training step (rollout.branch.pivots > 0; docs/ALGORITHMS.md, "pivot_mc").

K continuations are sampled before each response's pivots; their mean reward is V̂ there
(`pivot_values`, what pivot_mc reads). With rollout.branch.train_on_branches the branches
also join the batch as responses, each pivot's K in one group, whatever the estimator:
GRPO trained on the same branches separates what the branch rows bring from pivot_mc's
segment credit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from pivotrl.algorithms.batch import TokenBatch, concat_batches
from pivotrl.rollout import Rollout, RolloutEngine, concat_rollouts, select_rows
from pivotrl.rollout.branching import Branches, branch_and_value
from pivotrl.train.config import RolloutConfig
from pivotrl.train.sampler_check import logprob_diff


def branch_phase(engine: RolloutEngine, rollout: Rollout, batch: TokenBatch,
                 reward_of: Callable[[torch.Tensor, list[str], torch.Tensor], torch.Tensor],
                 branch_batch: Callable[[Branches, torch.Tensor], TokenBatch],
                 old_logprobs: Callable[[Rollout], torch.Tensor], *, config: RolloutConfig,
                 generator: torch.Generator) -> tuple[Rollout, TokenBatch, dict[str, Any]]:
    """(rollout, batch, metrics) after branching: the batch gains pivot_values and, with
    train_on_branches, the branch rows (`branch_batch(branches, their rewards)`).

    reward_of(parent_rows, texts, lengths) scores whole branched responses of the given parents;
    old_logprobs(rollout) is the policy's ℓ of a rollout's responses, for the sampler check.
    Metrics: rollout/branch_tokens (sampled), rollout/pivots_per_response;
    rollout/branch_groups_agree, the share of pivots whose K branch outcomes are all equal (such
    a pivot's V̂ is 0 or 1 from its K samples alone); and rollout/branch_logprob_diff, the
    sampler check on the branches (continuations from a forced prefix).
    """
    b = config.branch
    values, found, branch_rewards = branch_and_value(
        engine, rollout, batch.entropies, batch.rewards, reward_of, pivots=b.pivots, spacing=b.spacing,
        branches=b.branches, max_new_tokens=config.max_new_tokens, temperature=config.temperature,
        top_p=config.top_p, generator=generator)
    metrics = {"rollout/branch_tokens": float(found.tokens if found else 0),
               "rollout/pivots_per_response": float((~values.isnan()).sum()) / batch.num_responses}
    batch = replace(batch, pivot_values=values)
    if found is None:
        return rollout, batch, metrics
    per_pivot = branch_rewards.view(-1, b.branches)
    metrics["rollout/branch_groups_agree"] = float((per_pivot.max(dim=1).values == per_pivot.min(dim=1).values)
                                                   .float().mean())
    trained = branch_batch(found, branch_rewards.to(batch.rewards.device)) if b.train_on_branches else None
    if found.rollout.sampler_logprobs is not None:
        metrics["rollout/branch_logprob_diff"] = branch_sampler_diff(found, trained, old_logprobs, b.branches)
    if trained is None:
        return rollout, batch, metrics
    joint = concat_rollouts([rollout, found.rollout], engine.tokenizer.pad_token_id)
    batch = concat_batches([batch, trained])
    return joint, batch, {**metrics, "rollout/branch_rows_trained": float(found.rollout.response_ids.shape[0])}


def branch_sampler_diff(found: Branches, trained: TokenBatch | None, old_logprobs: Callable[[Rollout], torch.Tensor],
                        per_pivot: int) -> float:
    """Mean |ℓ^sampler − ℓ^old| on branch rows: every row when they are trained on (their ℓ^old is at hand),
    else the first branch of each pivot (a forward of 1/K of them, to keep the check cheap)."""
    if trained is not None:
        return logprob_diff(found.rollout.sampler_logprobs, trained.old_logprobs, trained.response_mask)
    first = torch.arange(0, found.rollout.response_ids.shape[0], per_pivot, device=found.rollout.response_ids.device)
    sample = select_rows(found.rollout, first)
    return logprob_diff(sample.sampler_logprobs, old_logprobs(sample), sample.response_mask)
