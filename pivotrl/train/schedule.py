"""What each step trains on and at which learning rate: the problems' order and the lr schedule."""

from __future__ import annotations

import math
from typing import Any

import torch

from pivotrl.train.config import TrainConfig


def lr_factor(step: int, train: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio: a pure function of the step."""
    if train.warmup_steps and step < train.warmup_steps:
        return (step + 1) / train.warmup_steps
    span = max(train.max_steps - train.warmup_steps, 1)
    progress = min(max(step - train.warmup_steps, 0) / span, 1.0)
    return train.min_lr_ratio + (1 - train.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class ProblemStream:
    """The training problems in a shuffled order, reshuffled at each epoch; its state goes into checkpoints."""

    def __init__(self, problems: list, seed: int) -> None:
        self.problems = problems
        self.generator = torch.Generator().manual_seed(seed)
        self.order = torch.randperm(len(problems), generator=self.generator)
        self.position = 0

    def next(self, count: int) -> list:
        """The next `count` problems."""
        picked = []
        while len(picked) < count:
            if self.position >= len(self.order):
                self.order = torch.randperm(len(self.problems), generator=self.generator)
                self.position = 0
            take = min(count - len(picked), len(self.order) - self.position)
            picked.extend(self.problems[i] for i in self.order[self.position : self.position + take].tolist())
            self.position += take
        return picked

    def state(self) -> dict[str, Any]:
        return {"data_generator": self.generator.get_state(), "order": self.order, "position": self.position}

    def restore(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["data_generator"])
        self.order, self.position = state["order"], int(state["position"])
