"""The format verifier: the completion follows the think/answer layout exactly."""

from __future__ import annotations

from pivotrl.rewards.template import split_layout


def format_reward(completion: str, answer: object = None) -> float:
    """1.0 iff ``completion`` is exactly ``<think>...</think><answer>...</answer>`` (see :func:`split_layout`), else 0.0."""
    return 1.0 if split_layout(completion) is not None else 0.0
