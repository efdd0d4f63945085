"""The arithmetic verifier: the numeric answer equals the reference exactly.

The answer is the content of the last ``<answer>...</answer>`` block, which
must be a single number literal, or, without such a block, the last number
in the completion. Literals are read exactly (:mod:`pivotrl.rewards.numbers`):
``-3``, ``3``, ``3.0`` and ``+3`` are the same number, ``1/2`` equals ``0.5``,
``1,000`` is one thousand. The comparison is an exact rational equality, never
a float tolerance, so ``0.333`` does not match ``1/3``. An expression such as
``12-7`` in the answer block is not a number and scores 0.0.
"""

from __future__ import annotations

import logging

from pivotrl.rewards.numbers import as_fraction, last_number, parse_number
from pivotrl.rewards.template import extract_answer

logger = logging.getLogger("pivotrl.rewards")


def arithmetic_reward(completion: str, answer: object) -> float:
    """1.0 iff the completion's numeric answer equals ``answer`` (int, Fraction or numeric string) exactly, else 0.0."""
    reference = as_fraction(answer)
    if reference is None:
        logger.debug("arithmetic: malformed reference %r", answer)
        return 0.0
    if not isinstance(completion, str):
        return 0.0
    block = extract_answer(completion)
    value = parse_number(block) if block is not None else last_number(completion)
    return 1.0 if value is not None and value == reference else 0.0
