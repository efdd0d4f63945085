"""Scoring sampled responses under a model: per-token log-probs and entropies of a rollout's responses."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pivotrl.modeling.logprobs import token_logprobs, token_logprobs_and_entropy
from pivotrl.modeling.policy import cache_kwarg, lm_parts, output_cache, positions_from_mask
from pivotrl.rollout import Rollout


def shared_prompt_rows(rollout: Rollout, rows: Tensor) -> tuple[Tensor, Tensor] | None:
    """(one row per distinct group among `rows`, each row's index into those), or None when nothing is shared.

    Rows of one group share their prompt by construction; this is checked, and any
    mismatch (a hand-built rollout) returns None so the caller runs every row in full.
    """
    if rollout.prompt_ids.shape[1] < 2:
        return None
    groups, inverse = torch.unique(rollout.group_index[rows], return_inverse=True)
    if len(groups) == len(rows):
        return None
    first = torch.full((len(groups),), len(rows), dtype=torch.long, device=rows.device).scatter_reduce(
        0, inverse, torch.arange(len(rows), device=rows.device), reduce="amin")
    leaders = rows[first]
    same = torch.equal(rollout.prompt_ids[rows], rollout.prompt_ids[leaders][inverse]) and torch.equal(
        rollout.prompt_mask[rows], rollout.prompt_mask[leaders][inverse])
    return (leaders, inverse) if same else None


def _hidden_full(body: torch.nn.Module, prompt_ids: Tensor, attention: Tensor, response_ids: Tensor) -> Tensor:
    """(B,R,D) hidden states predicting each response token, from one forward of prompt + response."""
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    positions = positions_from_mask(attention)
    hidden = body(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False).last_hidden_state
    width = prompt_ids.shape[1]
    # position t predicts token t+1: the last prompt position predicts the first response token
    return hidden[:, width - 1 : width - 1 + response_ids.shape[1]]


def _hidden_shared(
    body: torch.nn.Module, rollout: Rollout, rows: Tensor, leaders: Tensor, inverse: Tensor, attention: Tensor
) -> Tensor:
    """Like _hidden_full, running all but the last prompt token once per group and sharing its KV cache.

    The suffix (last prompt token, response[:-1]) of every row attends to its group's
    cached prefix; gradients flow back through the cache into the prefix forward.
    """
    width = rollout.prompt_ids.shape[1]
    lead_attention = rollout.prompt_mask[leaders, : width - 1].long()
    lead_positions = positions_from_mask(lead_attention)
    out = body(input_ids=rollout.prompt_ids[leaders, : width - 1], attention_mask=lead_attention,
               position_ids=lead_positions, use_cache=True)
    cache = output_cache(out)
    cache.batch_select_indices(inverse)
    response_ids = rollout.response_ids[rows]
    suffix = torch.cat([rollout.prompt_ids[rows, width - 1 :], response_ids[:, :-1]], dim=1)
    attention = attention[:, :-1]
    positions = positions_from_mask(attention)[:, width - 1 :]
    out = body(input_ids=suffix, attention_mask=attention, position_ids=positions, use_cache=True,
               **{cache_kwarg(body): cache})
    return out.last_hidden_state


def response_logprobs(
    model: torch.nn.Module, rollout: Rollout, rows: slice | Tensor | None = None, *,
    temperature: float = 1.0, chunk_size: int = 1024, share_prompts: bool = True, entropies: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """(log-probs, entropies), each (B,R), of the rollout's responses under `model`.

    With entropies=False (a frozen reference model) the entropies are skipped and
    returned as None, and no gradient flows.

    The LM head runs chunked over the response positions only. With `share_prompts`
    each group's prompt runs once and its KV cache serves the group's G responses
    (same values to float rounding, about a third less work for short answers);
    gradient checkpointing, which cannot carry a cache, falls back to one forward
    of prompt + response per row. Gradients flow when grad mode is on.
    """
    n = rollout.response_ids.shape[0]
    index = torch.arange(n, device=rollout.response_ids.device)
    rows = index if rows is None else index[rows]
    body, head = lm_parts(model)
    if getattr(head, "bias", None) is not None:
        raise ValueError("LM heads with a bias are not supported by the chunked log-prob path")
    response_ids = rollout.response_ids[rows]
    attention = torch.cat([rollout.prompt_mask[rows], rollout.response_mask[rows]], dim=1).long()
    checkpointing = model.training and bool(
        getattr(model, "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing")
                else "is_gradient_checkpointing", False))
    shared = shared_prompt_rows(rollout, rows) if share_prompts and not checkpointing else None
    if shared is None:
        hidden = _hidden_full(body, rollout.prompt_ids[rows], attention, response_ids)
    else:
        hidden = _hidden_shared(body, rollout, rows, *shared, attention)
    temperature = temperature if temperature > 0 else 1.0
    if not entropies:
        return token_logprobs(response_ids, hidden=hidden, weight=head.weight, chunk_size=chunk_size,
                              temperature=temperature), None
    return token_logprobs_and_entropy(response_ids, hidden=hidden, weight=head.weight, chunk_size=chunk_size,
                                      temperature=temperature)


def response_logprobs_no_grad(model: torch.nn.Module, rollout: Rollout, *, micro_batch_size: int | None = None,
                              **options: Any) -> tuple[Tensor, Tensor | None]:
    """response_logprobs of every response, `micro_batch_size` rows at a time (None: all at once), without gradients."""
    n = rollout.response_ids.shape[0]
    size = micro_batch_size or n
    with torch.no_grad():
        outs = [response_logprobs(model, rollout, torch.arange(i, min(i + size, n)), **options)
                for i in range(0, n, size)]
    entropies = None if outs[0][1] is None else torch.cat([o[1] for o in outs])
    return torch.cat([o[0] for o in outs]), entropies
