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
from pivotrl.rollout import Rollout, RolloutEngine, concat_rollouts
from pivotrl.rollout.branching import branch_and_value
from pivotrl.train.config import RolloutConfig


def branch_phase(engine: RolloutEngine, rollout: Rollout, batch: TokenBatch,
                 reward_of: Callable[[torch.Tensor, list[str], torch.Tensor], torch.Tensor],
                 token_batch: Callable[[Rollout, torch.Tensor], TokenBatch], *, config: RolloutConfig,
                 generator: torch.Generator) -> tuple[Rollout, TokenBatch, dict[str, Any]]:
    """(rollout, batch, metrics) after branching: the batch gains pivot_values and, with
    train_on_branches, the branch rows (forwarded by `token_batch(rollout, rewards)`).

    reward_of(parent_rows, texts, lengths) scores whole branched responses of the given parents.
    Metrics: rollout/branch_tokens (sampled), rollout/pivots_per_response, and
    rollout/branch_groups_agree, the share of pivots whose K branch outcomes are all equal
    (such a pivot's V̂ is 0 or 1 from K samples: little to learn from its value).
    """
    b = config.branch
    values, found, branch_rewards = branch_and_value(
        engine, rollout, batch.entropies, batch.rewards, reward_of, pivots=b.pivots, spacing=b.spacing,
        branches=b.branches, max_new_tokens=config.max_new_tokens, temperature=config.temperature,
        top_p=config.top_p, generator=generator)
    metrics = {"rollout/branch_tokens": float(found.tokens if found else 0),
               "rollout/pivots_per_response": float((~values.isnan()).sum()) / batch.num_responses}
    if found is not None:
        per_pivot = branch_rewards.view(-1, b.branches)
        agree = per_pivot.max(dim=1).values == per_pivot.min(dim=1).values
        metrics["rollout/branch_groups_agree"] = float(agree.float().mean())
    batch = replace(batch, pivot_values=values)
    if not (b.train_on_branches and found):
        return rollout, batch, metrics
    joint = concat_rollouts([rollout, found.rollout], engine.tokenizer.pad_token_id)
    batch = concat_batches([batch, token_batch(found.rollout, branch_rewards.to(batch.rewards.device))])
    return joint, batch, {**metrics, "rollout/branch_rows_trained": float(found.rollout.response_ids.shape[0])}
