"""Verifiers: pure functions ``fn(completion, answer) -> float`` that never execute model text.

=================  ===========================================================
``math``           final answer vs reference under math-verify, time-limited
``countdown``      an arithmetic expression over given numbers hits a target
``arithmetic``     the numeric answer equals the reference exactly
``format``         the completion is exactly ``<think>...</think><answer>...</answer>``
=================  ===========================================================

:func:`trace_validity` is a diagnostic (fraction of true arithmetic steps in
``<think>``, or None), not a reward in :data:`REWARDS`; so is
:func:`search_trace_validity` (also checks that each step of a search trace
uses available numbers; :func:`search_attempts` splits it into attempts). The layout helpers
(:func:`extract_answer`, :func:`extract_think`, :func:`render_completion`)
live in :mod:`pivotrl.rewards.template`.
"""

from __future__ import annotations

from collections.abc import Callable

from pivotrl.rewards.arithmetic import arithmetic_reward
from pivotrl.rewards.countdown import countdown_expression, countdown_reward
from pivotrl.rewards.expression import (
    Evaluation,
    ExpressionError,
    evaluate,
    try_evaluate,
)
from pivotrl.rewards.format import format_reward
from pivotrl.rewards.math import (
    clear_math_cache,
    configure_math_workers,
    math_reward,
    math_reward_batch,
    shutdown_math_workers,
)
from pivotrl.rewards.math_extract import MAX_ANSWER_CHARS, extract_math_answer
from pivotrl.rewards.numbers import as_fraction, last_number, parse_number
from pivotrl.rewards.template import (
    extract_answer,
    extract_think,
    render_completion,
    split_layout,
)
from pivotrl.rewards.trace import (
    search_attempts,
    search_steps,
    search_trace_validity,
    trace_steps,
    trace_validity,
)

RewardFn = Callable[..., float]

REWARDS: dict[str, RewardFn] = {
    "math": math_reward,
    "countdown": countdown_reward,
    "arithmetic": arithmetic_reward,
    "format": format_reward,
}

__all__ = [
    "MAX_ANSWER_CHARS",
    "REWARDS",
    "Evaluation",
    "ExpressionError",
    "RewardFn",
    "arithmetic_reward",
    "as_fraction",
    "clear_math_cache",
    "configure_math_workers",
    "countdown_expression",
    "countdown_reward",
    "evaluate",
    "extract_answer",
    "extract_math_answer",
    "extract_think",
    "format_reward",
    "last_number",
    "math_reward",
    "math_reward_batch",
    "parse_number",
    "render_completion",
    "search_attempts",
    "search_steps",
    "search_trace_validity",
    "shutdown_math_workers",
    "split_layout",
    "trace_steps",
    "trace_validity",
    "try_evaluate",
]
