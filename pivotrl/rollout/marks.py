"""Per-token marks of a rollout's responses, from the task that knows them (free choices, reachable states).

A task marks a response given the text of each of its tokens (``Task.token_marks``); this turns
those marks into (N,T) float tensors, the TokenBatch fields ``free_mask`` and ``reachable``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from pivotrl.rollout.base import Rollout

#: The task's name of a mark -> the TokenBatch field it fills.
MARK_FIELDS = {"free": "free_mask", "reachable": "reachable"}

#: marks_of(pieces, row) -> {mark name: one bool per piece}: the task's marks of response `row`.
MarksOf = Callable[[list[str], int], dict[str, list[bool]]]


class TokenPieces:
    """The text of each token id, decoded once per id (a character-level tokenizer decodes each to one character)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.known: dict[int, str] = {}

    def __call__(self, ids: Sequence[int]) -> list[str]:
        for i in ids:
            if i not in self.known:
                self.known[i] = self.tokenizer.decode([i], skip_special_tokens=True)
        return [self.known[i] for i in ids]


def rollout_marks(rollout: Rollout, pieces: TokenPieces, marks_of: MarksOf,
                  prefixes: Sequence[Sequence[int]] | None = None) -> dict[str, Tensor]:
    """{TokenBatch field: (N,T) float32, 1.0 where marked} for every response of `rollout`.

    `prefixes[i]`: response tokens written before row i's own (a branch continues its parent's
    response): the task marks the whole response, and the row gets the marks of its own tokens.
    """
    mask = rollout.response_mask.cpu()
    out: dict[str, Tensor] = {}
    for row in range(mask.shape[0]):
        ids = rollout.response_ids[row][mask[row].to(rollout.response_ids.device)].tolist()
        before = list(prefixes[row]) if prefixes is not None else []
        marks = marks_of(pieces(before + ids), row)
        for name, flags in marks.items():
            field = MARK_FIELDS[name]
            if field not in out:
                out[field] = torch.zeros(mask.shape, dtype=torch.float32)
            out[field][row, : len(ids)] = torch.tensor(flags[len(before):], dtype=torch.float32)
    device = rollout.response_ids.device
    return {field: values.to(device) for field, values in out.items()}
