"""The countdown verifier: reach the target with the given numbers and ``+ - * /``.

``answer`` is ``{"numbers": [3, 5, 7], "target": 22}``. The expression is the
content of the last ``<answer>...</answer>`` block, or else the last
non-empty line of the completion, and it must be the bare expression
(``5*3+7``, not ``5*3+7=22``). It is read by :mod:`pivotrl.rewards.expression`
with unary minus rejected (``-3+25`` is not an answer: the numbers are used as
given, combined only by binary operators) and integer literals only. Each
literal must be one of ``numbers``, used at most as many times as it occurs
there; with ``exact_use=True`` the literals must be exactly the multiset
``numbers``. Division is exact (``(7-5)/2*22``), division by zero scores 0.0.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction

from pivotrl.rewards.expression import MAX_EXPRESSION_CHARS, try_evaluate
from pivotrl.rewards.numbers import as_fraction
from pivotrl.rewards.template import extract_answer

logger = logging.getLogger("pivotrl.rewards")


def countdown_expression(completion: str) -> str | None:
    """Return the answer expression: the last ``<answer>`` block, else the last non-empty line."""
    if not isinstance(completion, str):
        return None
    answer = extract_answer(completion)
    if answer is not None:
        return answer
    stripped = completion.rstrip()
    line = stripped[stripped.rfind("\n") + 1 :].strip()
    return line or None


def _task(answer: object) -> tuple[list[Fraction], Fraction] | None:
    """Return (numbers, target) from ``{"numbers": [...], "target": int}``, else None."""
    if not isinstance(answer, Mapping):
        return None
    raw_numbers = answer.get("numbers")
    target = as_fraction(answer.get("target"))
    if target is None or isinstance(raw_numbers, (str, bytes)) or raw_numbers is None:
        return None
    try:
        numbers = [as_fraction(n) for n in raw_numbers]
    except TypeError:
        return None
    if any(n is None for n in numbers):
        return None
    return numbers, target  # type: ignore[return-value]


def countdown_reward(completion: str, answer: object, *, exact_use: bool = False) -> float:
    """1.0 iff the answer expression equals the target using only the given numbers, else 0.0."""
    task = _task(answer)
    if task is None:
        logger.debug("countdown: malformed reference %r", answer)
        return 0.0
    numbers, target = task
    expression = countdown_expression(completion)
    if expression is None or len(expression) > MAX_EXPRESSION_CHARS:
        return 0.0
    result = try_evaluate(expression)
    if result is None:
        return 0.0
    used, available = Counter(result.numbers), Counter(numbers)
    if exact_use:
        if used != available:
            return 0.0
    elif any(count > available[n] for n, count in used.items()):
        return 0.0
    return 1.0 if result.value == target else 0.0
