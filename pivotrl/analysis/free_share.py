"""How much of a policy's entropy sits on free tokens: the outcome-irrelevant choices a task marks.

:class:`FreeEntropy` takes batches of the policy's sampled responses (the held-out
evaluation's own, through its ``on_batch``), forwards them through the policy for the entropy
of every response token's next-token distribution, and sums it over the tokens the task marks
``"free"`` (:meth:`pivotrl.tasks.Task.token_marks`) and over all of them (the final ``<eos>``
included; prompt tokens never). ``pivotrl pretrain --eval-only`` prints its shares for a task
with free choices (``countdown_free``), measured on the responses the accuracy is measured on.
"""

from __future__ import annotations

from typing import Any

import torch

from pivotrl.rollout import Rollout
from pivotrl.rollout.forward import response_logprobs
from pivotrl.rollout.marks import TokenPieces, rollout_marks
from pivotrl.tasks.base import Problem, Task


class FreeEntropy:
    """Entropy and token counts of free tokens against all response tokens, over the batches added.

    ``temperature``: the one the responses were sampled at (the entropy is that distribution's).
    """

    def __init__(self, model: Any, tokenizer: Any, task: Task, temperature: float = 1.0):
        if "free" not in task.marks:
            raise ValueError(f"task {task.name!r} has no free choices to measure")
        self.model, self.task, self.temperature = model, task, temperature
        self.pieces = TokenPieces(tokenizer)
        self.entropy = self.free_entropy = 0.0
        self.tokens = self.free_tokens = self.responses = 0

    @torch.no_grad()
    def add(self, rollout: Rollout, problems: list[Problem]) -> None:
        """Count the responses of ``rollout``; row r answers ``problems[rollout.group_index[r]]``."""
        _, entropies = response_logprobs(self.model, rollout, temperature=self.temperature)
        groups = rollout.group_index.tolist()
        marks = rollout_marks(rollout, self.pieces,
                              lambda pieces, row: self.task.token_marks(pieces, problems[groups[row]]))
        mask = rollout.response_mask
        free = (marks["free_mask"] > 0.5) & mask
        self.entropy += float(entropies[mask].sum())
        self.free_entropy += float(entropies[free].sum())
        self.tokens += int(mask.sum())
        self.free_tokens += int(free.sum())
        self.responses += mask.shape[0]

    def result(self) -> dict[str, float]:
        """``free_entropy_share`` (entropy summed over free tokens / over all response tokens),
        ``free_token_share`` (free tokens / response tokens), ``entropy_per_response`` and
        ``free_entropy_per_response`` (nats), ``mean_length`` (tokens) and ``responses``."""
        count = max(self.responses, 1)
        return {
            "free_entropy_share": self.free_entropy / self.entropy if self.entropy > 0 else 0.0,
            "free_token_share": self.free_tokens / max(self.tokens, 1),
            "entropy_per_response": self.entropy / count,
            "free_entropy_per_response": self.free_entropy / count,
            "mean_length": self.tokens / count,
            "responses": self.responses,
        }
