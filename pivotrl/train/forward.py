"""The policy forward of the trainer: per-token log-probs and entropies of sampled responses."""

from __future__ import annotations

import torch
from torch import Tensor

from pivotrl.modeling.logprobs import token_logprobs_and_entropy
from pivotrl.modeling.policy import lm_parts
from pivotrl.rollout import Rollout


def response_logprobs(
    model: torch.nn.Module, rollout: Rollout, rows: slice | Tensor | None = None, *,
    temperature: float = 1.0, chunk_size: int = 1024,
) -> tuple[Tensor, Tensor]:
    """(log-probs, entropies), each (B,R), of the rollout's responses under `model`.

    One forward of prompt + response; the LM head runs chunked over the response
    positions only. Gradients flow when grad mode is on.
    """
    sel = slice(None) if rows is None else rows
    prompt_ids, prompt_mask = rollout.prompt_ids[sel], rollout.prompt_mask[sel]
    response_ids, response_mask = rollout.response_ids[sel], rollout.response_mask[sel]
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention = torch.cat([prompt_mask, response_mask], dim=1).long()
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    body, head = lm_parts(model)
    hidden = body(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False).last_hidden_state
    width = prompt_ids.shape[1]
    # position t predicts token t+1: the last prompt position predicts the first response token
    hidden = hidden[:, width - 1 : width - 1 + response_ids.shape[1]]
    bias = getattr(head, "bias", None)
    if bias is not None:
        raise ValueError("LM heads with a bias are not supported by the chunked log-prob path")
    return token_logprobs_and_entropy(
        response_ids, hidden=hidden, weight=head.weight, chunk_size=chunk_size, temperature=temperature if temperature > 0 else 1.0
    )
