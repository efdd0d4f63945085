"""The rewards a training step learns from: the task verifier's scores, and DAPO's overlong shaping."""

from __future__ import annotations

from typing import Any

import torch

from pivotrl.rewards.safe import safe_score
from pivotrl.train.config import RolloutConfig


def score_texts(verifier: Any, texts: list[str], answers: list[Any]) -> torch.Tensor:
    """The verifier's score of each response text (N,) float32 (0 for one that cannot be scored)."""
    return torch.tensor([safe_score(verifier, text, answer) for text, answer in zip(texts, answers, strict=True)],
                        dtype=torch.float32)


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache: int) -> torch.Tensor:
    """DAPO's soft overlong penalty: 0 up to L_max - L_cache, linear to -1 at L_max, -1 beyond."""
    start = max_len - cache
    penalty = (start - lengths.to(torch.float32)) / cache
    return torch.where(lengths <= start, 0.0, torch.where(lengths > max_len, -1.0, penalty))


def shape_rewards(scores: torch.Tensor, lengths: torch.Tensor, rollout: RolloutConfig) -> torch.Tensor:
    """The rewards the estimator sees: the scores, plus DAPO's overlong penalty when it is on."""
    if not rollout.overlong_shaping:
        return scores.clone()
    return scores + overlong_penalty(lengths, rollout.max_new_tokens, rollout.overlong_cache)
