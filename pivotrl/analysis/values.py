"""The ground truth of `pivotrl credit`: Monte-Carlo values of response prefixes.

The ground truth is the true advantage of every sampled token (the quantity that
Forking Paths, arXiv 2412.07961, and cDPO, arXiv 2411.19943, estimate by
Monte-Carlo continuations): for a response o with T tokens (its EOS included)
and a 0-based position t < T,

    V(t)  = E[R | prompt, o_<t], completing from position t onward with the policy
            at the sampling temperature, within the same token budget;
    A*(t) = V(t+1) - V(t);       V(T) = R exactly.

V(t) is the mean reward of K continuations of the prefix o_<t, with Monte-Carlo
standard error s/sqrt(K) (s: the sample standard deviation of the K rewards); the
standard error of A*(t) is sqrt(se(t)^2 + se(t+1)^2). Every distinct prefix is
estimated once: V(t+1) of one position is V(t) of the next, and responses of one
group that start alike share their prefixes (V(0) is the prompt's value).

This is the only part of `pivotrl credit` that samples continuations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from pivotrl.rollout import Rollout, RolloutEngine


@dataclass
class ValueTable:
    """V(t) and its standard error for every response row and t = 0..R (NaN where not estimated)."""

    values: Tensor  # (N, R+1) float64
    se: Tensor  # (N, R+1) float64
    prefixes: int  # distinct prefixes estimated by sampling
    continuations: int  # continuation rows sampled


def needed_values(positions: Tensor, width: int, num_rows: int) -> Tensor:
    """(N, width+1) bool: the V(t) that the A* of `positions` (M,2: row, t) need, V(t) and V(t+1)."""
    needed = torch.zeros(num_rows, width + 1, dtype=torch.bool)
    rows, ts = positions[:, 0].cpu(), positions[:, 1].cpu()
    needed[rows, ts] = True
    needed[rows, ts + 1] = True
    return needed


@torch.no_grad()
def estimate_values(engine: RolloutEngine, rollout: Rollout, rewards: Tensor, score: Callable[[int, str], float],
                    needed: Tensor, *, k: int, max_new_tokens: int, temperature: float, batch_rows: int,
                    generator: torch.Generator, progress: Callable[[int, int], None] | None = None) -> ValueTable:
    """Monte-Carlo V(t) where `needed` (N, R+1) is True, by K continuations per distinct prefix.

    `score(row, text)` is the reward of a completed text for the prompt of response `row`; it may
    depend on the row only through its group (the prompt), so equal texts of a group are scored once.
    At t = T_i (the response's end) V is its reward, exactly, with standard error 0.
    Prefixes are sampled in calls of about `batch_rows` continuation rows (prefixes x K),
    shortest prefixes first; a continuation of o_<t keeps max_new_tokens - t tokens at most,
    the budget the original response had left. `progress(rows_done, rows_total)` is called after each call.
    """
    if k < 2:
        raise ValueError(f"k (continuations per prefix) must be >= 2 for a standard error, got {k}")
    mask = rollout.response_mask.cpu()
    n, width = mask.shape
    lengths = mask.sum(dim=1)
    values = torch.full((n, width + 1), math.nan, dtype=torch.float64)
    se = torch.full_like(values, math.nan)
    ends = torch.arange(width + 1).unsqueeze(0) == lengths.unsqueeze(1)
    at_end = needed & ends
    values[at_end] = rewards.double().cpu().unsqueeze(1).expand(n, width + 1)[at_end]
    se[at_end] = 0.0
    prompts = [tuple(rollout.prompt_ids[i][rollout.prompt_mask[i]].tolist()) for i in range(n)]
    responses = [rollout.response_ids[i, : int(lengths[i])].tolist() for i in range(n)]
    owners: dict[tuple[tuple[int, ...], tuple[int, ...]], list[tuple[int, int]]] = {}
    for i, t in (needed & ~ends & (torch.arange(width + 1).unsqueeze(0) < lengths.unsqueeze(1))).nonzero().tolist():
        owners.setdefault((prompts[i], tuple(responses[i][:t])), []).append((i, t))
    order = sorted(owners, key=lambda key: (len(key[1]), key))
    tokenizer = engine.tokenizer
    group = rollout.group_index.tolist()
    verdicts: dict[tuple[int, str], float] = {}
    per_call = max(1, batch_rows // k)
    device = rollout.prompt_ids.device
    for start in range(0, len(order), per_call):
        chunk = order[start : start + per_call]
        seqs = [list(prompt) + list(prefix) for prompt, prefix in chunk]
        longest = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), longest), tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros(len(seqs), longest, dtype=torch.bool)
        for row, seq in enumerate(seqs):
            ids[row, longest - len(seq):] = torch.tensor(seq)
            attention[row, longest - len(seq):] = True
        budgets = [max_new_tokens - len(prefix) for _, prefix in chunk]
        cont = engine.generate_from_ids(ids.to(device), attention.to(device), k, max_new_tokens=max(budgets),
                                        temperature=temperature, generator=generator)
        cont_ids, cont_mask = cont.response_ids.cpu(), cont.response_mask.cpu()
        full = []
        for row in range(len(chunk) * k):
            p = row // k
            full.append(list(chunk[p][1]) + cont_ids[row][cont_mask[row]].tolist()[: budgets[p]])
        texts = tokenizer.batch_decode(full, skip_special_tokens=True)
        scores = torch.empty(len(full), dtype=torch.float64)
        for row, text in enumerate(texts):
            owner = owners[chunk[row // k]][0][0]
            key = (group[owner], text)
            if key not in verdicts:
                verdicts[key] = score(owner, text)
            scores[row] = verdicts[key]
        scores = scores.view(len(chunk), k)
        means, errors = scores.mean(dim=1), scores.std(dim=1) / math.sqrt(k)
        for p, key in enumerate(chunk):
            for i, t in owners[key]:
                values[i, t], se[i, t] = means[p], errors[p]
        if progress is not None:
            progress(min(start + per_call, len(order)) * k, len(order) * k)
    return ValueTable(values, se, prefixes=len(order), continuations=len(order) * k)


def true_advantages(table: ValueTable, positions: Tensor) -> tuple[Tensor, Tensor]:
    """(A*, its standard error), each (M,), at positions (M,2: row, t): V(t+1) - V(t)."""
    rows, ts = positions[:, 0].cpu(), positions[:, 1].cpu()
    before, after = table.values[rows, ts], table.values[rows, ts + 1]
    if torch.isnan(before).any() or torch.isnan(after).any():
        raise ValueError("a position's V(t) or V(t+1) was not estimated")
    return after - before, (table.se[rows, ts] ** 2 + table.se[rows, ts + 1] ** 2).sqrt()
