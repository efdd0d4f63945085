"""Branching rollouts: K more continuations from each pivot of a sampled response (docs/ALGORITHMS.md).

A pivot of a response is one of its highest-entropy tokens (H of the policy that sampled it),
at least `spacing` tokens from the response's other pivots, never its first token. Each
pivot's prefix, the prompt and the response's tokens before the pivot, is sampled again K
times up to the response's own length limit; the continuations' outcomes estimate the
value of that prefix:

    V̂(i, p) = (Σ_k r_k + r_i) / (K + 1)          (the K branches and the response's own outcome)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from pivotrl.rollout.base import Rollout, RolloutEngine, left_pad


def pick_pivots(entropies: Tensor, mask: Tensor, *, count: int, spacing: int) -> Tensor:
    """(N, count) int64 positions of each response's pivots, in order of entropy; -1 where there are fewer.

    Greedy: the highest-entropy valid token at position >= 1, then the highest at least
    `spacing` tokens from every pivot taken, and so on. Ties go to the earlier position.
    """
    n, t = mask.shape
    positions = torch.arange(t, device=mask.device)
    free = mask.bool() & (positions >= 1)
    score = torch.where(free, entropies.float(), -torch.inf)
    picks = []
    for _ in range(count):
        best = score.argmax(dim=1)
        found = torch.isfinite(score.gather(1, best.unsqueeze(1)).squeeze(1))
        picks.append(torch.where(found, best, -1))
        near = (positions.unsqueeze(0) - best.unsqueeze(1)).abs() < spacing
        score = torch.where(near & found.unsqueeze(1), -torch.inf, score)
    return torch.stack(picks, dim=1) if picks else torch.empty(n, 0, dtype=torch.long, device=mask.device)


@dataclass
class Branches:
    """The continuations sampled at the pivots of a rollout.

    rollout: one row per continuation; each pivot's K continuations form one group, with the
    pivot's prefix (prompt + response[:p]) as their prompt; parent (B,) the response each
    continues, position (B,) its pivot; texts: the whole response each makes
    (response[:p] + continuation), decoded, for the verifier.
    """

    rollout: Rollout
    parent: Tensor
    position: Tensor
    texts: list[str]

    @property
    def tokens(self) -> int:
        """The tokens sampled for the branches."""
        return int(self.rollout.response_mask.sum())


def sample_branches(engine: RolloutEngine, rollout: Rollout, pivots: Tensor, *, branches: int, max_new_tokens: int,
                    temperature: float, top_p: float, generator: torch.Generator | None) -> Branches | None:
    """K = `branches` continuations from every pivot (pivots (N,m) from pick_pivots); None when there are none."""
    rows, slots = (pivots >= 0).nonzero(as_tuple=True)
    if len(rows) == 0:
        return None
    position = pivots[rows, slots]
    prefixes = []
    for row, p in zip(rows.tolist(), position.tolist(), strict=True):  # once per pivot, not per token
        prompt = rollout.prompt_ids[row][rollout.prompt_mask[row]]
        prefixes.append(torch.cat([prompt, rollout.response_ids[row, :p]]).tolist())
    ids, mask = left_pad(prefixes, engine.tokenizer.pad_token_id)
    device = rollout.prompt_ids.device
    limits = (max_new_tokens - position).clamp(min=1)
    out = engine.generate_from_ids(ids.to(device), mask.to(device), branches, max_new_tokens=limits.to(device),
                                   temperature=temperature, top_p=top_p, generator=generator)
    parent = rows.repeat_interleave(branches)
    at = position.repeat_interleave(branches)
    whole = [torch.cat([rollout.response_ids[r, :p], cont[keep]]).tolist()
             for r, p, cont, keep in zip(parent.tolist(), at.tolist(), out.response_ids, out.response_mask, strict=True)]
    texts = engine.tokenizer.batch_decode(whole, skip_special_tokens=True)
    return Branches(out, parent.to(device), at.to(device), texts)


def pivot_values(branch_rewards: Tensor, branches: Branches, rewards: Tensor, shape: tuple[int, int], *,
                 per_pivot: int) -> Tensor:
    """(N,T) V̂ at each pivot (before its token): the mean of its K branch rewards and the response's own; NaN elsewhere."""
    k = per_pivot
    parent = branches.parent.view(-1, k)[:, 0]
    position = branches.position.view(-1, k)[:, 0]
    value = (branch_rewards.view(-1, k).sum(dim=1) + rewards[parent]) / (k + 1)
    values = torch.full(shape, torch.nan, dtype=torch.float32, device=rewards.device)
    values[parent, position] = value.to(values.dtype)
    return values


def branch_and_value(engine: RolloutEngine, rollout: Rollout, entropies: Tensor, rewards: Tensor,
                     reward_of: Callable[[Tensor, list[str], Tensor], Tensor], *, pivots: int, spacing: int,
                     branches: int, max_new_tokens: int, temperature: float, top_p: float,
                     generator: torch.Generator | None) -> tuple[Tensor, Branches | None, Tensor | None]:
    """(pivot_values (N,T), the branches, their rewards): pick the pivots, sample and score the branches.

    reward_of(parent_rows, texts, lengths) scores whole responses of the given parents.
    """
    mask = rollout.response_mask
    picked = pick_pivots(entropies, mask, count=pivots, spacing=spacing)
    found = sample_branches(engine, rollout, picked, branches=branches, max_new_tokens=max_new_tokens,
                            temperature=temperature, top_p=top_p, generator=generator)
    values = torch.full(mask.shape, torch.nan, dtype=torch.float32, device=rewards.device)
    if found is None:
        return values, None, None
    lengths = (found.position + found.rollout.response_mask.sum(dim=1)).cpu()
    branch_rewards = reward_of(found.parent.cpu(), found.texts, lengths).to(rewards.device)
    return pivot_values(branch_rewards, found, rewards, tuple(mask.shape), per_pivot=branches), found, branch_rewards
