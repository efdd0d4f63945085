"""Shared builders for the algorithm tests."""

from __future__ import annotations

import torch

from pivotrl.algorithms import TokenBatch


def make_batch(
    rewards: list[float],
    groups: list[int],
    lengths: list[int],
    entropies: list[list[float]] | None = None,
    old: list[list[float]] | None = None,
    ref: list[list[float]] | None = None,
    width: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> TokenBatch:
    """A right-padded batch from plain lists; rows of the token lists may be shorter than width."""
    width = width or max(lengths)

    def pad(rows: list[list[float]] | None, fill: float = 0.0) -> torch.Tensor | None:
        if rows is None:
            return None
        return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype)

    mask = torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    return TokenBatch(
        rewards=torch.tensor(rewards, dtype=dtype),
        group_index=torch.tensor(groups),
        response_mask=mask,
        old_logprobs=pad(old) if old is not None else torch.zeros(len(rewards), width, dtype=dtype),
        ref_logprobs=pad(ref),
        entropies=pad(entropies),
    )


def random_batch(
    n_groups: int = 3, group_size: int = 4, width: int = 9, seed: int = 0,
    dtype: torch.dtype = torch.float64, binary: bool = True,
) -> TokenBatch:
    """Random batch with varied lengths (some 0 and some full), entropies, old/ref log-probs."""
    g = torch.Generator().manual_seed(seed)
    n = n_groups * group_size
    lengths = torch.randint(0, width + 1, (n,), generator=g)
    lengths[0] = width
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = (torch.rand(n, generator=g) < 0.5).to(dtype) if binary else torch.rand(n, generator=g, dtype=dtype)
    old = -torch.rand(n, width, generator=g, dtype=dtype) * 2
    ref = -torch.rand(n, width, generator=g, dtype=dtype) * 2
    entropies = torch.rand(n, width, generator=g, dtype=dtype) * 3
    cuts = torch.rand(n, width, generator=g) < 0.25  # pivots with branch values, for pivot_mc
    values = torch.where(cuts, torch.rand(n, width, generator=g, dtype=dtype), torch.nan)
    free = (torch.rand(n, width, generator=g) < 0.5).to(dtype)  # a task's marks, for the oracles
    reachable = (torch.rand(n, width, generator=g) < 0.7).to(dtype)
    return TokenBatch(rewards=rewards, group_index=torch.arange(n) // group_size, response_mask=mask,
                      old_logprobs=old, ref_logprobs=ref, entropies=entropies, pivot_values=values,
                      free_mask=free, reachable=reachable)
