"""The rollout phase of a training step: sample G responses for each of P prompts and score them.

With DAPO's dynamic sampling (rollout.dynamic_sampling), groups whose rewards are all equal
are dropped and more prompts are sampled, up to rollout.max_resample_rounds more rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pivotrl.rollout import Rollout, RolloutEngine, concat_rollouts, select_rows
from pivotrl.tasks.base import Problem
from pivotrl.train.config import RolloutConfig
from pivotrl.train.rewards import score_texts, shape_rewards


@dataclass
class Collected:
    """A step's scored rollout: each row's problem, the rewards the estimator sees (shaped), the
    verifier's raw scores, and the rollout metrics. `rollout` is None when dynamic sampling found
    no group with mixed rewards."""

    rollout: Rollout | None
    problems: list[Problem] = field(default_factory=list)
    rewards: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def answers(self) -> list:
        """Each row's reference answer."""
        return [p.answer for p in self.problems]


def mixed_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """The rows (int64) of the groups whose scores are not all equal (DAPO's dynamic sampling keeps these)."""
    grouped = scores.view(-1, group_size)
    mixed = (grouped.max(dim=1).values != grouped.min(dim=1).values).nonzero().squeeze(1)
    return (mixed.unsqueeze(1) * group_size + torch.arange(group_size)).reshape(-1)


def collect(engine: RolloutEngine, verifier: Callable, next_problems: Callable[[int], list[Problem]],
            prompts_for: Callable[[list[Problem]], list[str]], config: RolloutConfig,
            generator: torch.Generator) -> Collected:
    """The step's scored rollout: `config.prompts_per_step` prompts x `config.group_size` responses."""
    r = config
    parts, score_parts, row_problems, kept_groups, sampled_groups, rounds, generated = [], [], [], 0, 0, 0, 0
    solved, agreeing = 0, 0
    while True:
        need = r.prompts_per_step - kept_groups if r.dynamic_sampling else r.prompts_per_step
        problems = next_problems(need)
        rollout = engine.generate(prompts_for(problems), r.group_size, max_new_tokens=r.max_new_tokens,
                                  temperature=r.temperature, top_p=r.top_p, generator=generator)
        rows_of = [p for p in problems for _ in range(r.group_size)]
        scores = score_texts(verifier, rollout.texts, [p.answer for p in rows_of])
        sampled_groups += len(problems)
        generated += int(rollout.response_mask.sum())
        solved += int((scores >= 1.0).sum())
        rows = mixed_groups(scores, r.group_size)
        agreeing += len(problems) - len(rows) // r.group_size
        if r.dynamic_sampling:
            rollout, scores = select_rows(rollout, rows), scores[rows]
            rows_of = [rows_of[i] for i in rows.tolist()]
            kept_groups += len(rows) // r.group_size
        if rollout.texts:
            parts.append(rollout)
            score_parts.append(scores)
            row_problems.extend(rows_of)
        rounds += 1
        if not r.dynamic_sampling or kept_groups >= r.prompts_per_step or rounds > r.max_resample_rounds:
            break
    metrics = {"rollout/sampled_groups": float(sampled_groups), "rollout/rounds": float(rounds),
               "rollout/tokens_generated": float(generated), "rollout/agreeing_frac": agreeing / sampled_groups}
    if r.dynamic_sampling:  # `accuracy` covers the kept groups only; this is every sampled response's
        metrics["rollout/sampled_accuracy"] = solved / (sampled_groups * r.group_size)
    if not parts:
        return Collected(None, metrics=metrics)
    rollout = concat_rollouts(parts, engine.tokenizer.pad_token_id)
    scores = torch.cat(score_parts)
    rewards = shape_rewards(scores, rollout.response_mask.sum(dim=1).cpu(), r)
    return Collected(rollout, row_problems, rewards, scores, metrics)
