r"""The math verifier: the completion's final answer equals the reference under math-verify.

The final answer is found by :func:`pivotrl.rewards.math_extract.extract_math_answer`
(last ``\boxed{}``/``\fbox{}``, else the ``<answer>`` block, else GSM8K's
``#### X``, else ``answer is X``), capped at 1000 characters, and compared
with the reference string by ``math_verify.parse`` + ``math_verify.verify``
in a worker process (:mod:`pivotrl.rewards.math_pool`). Both sides are
parsed as ``\boxed{...}`` with math-verify's LaTeX extraction (fractions,
``\%``, intervals, sets, tuples, ``\text{}`` and units dropped) plus its plain
expression extraction (``1/2``, ``72 apples``, ``1,000``).

Time limit: each answer's comparison has ``timeout_s`` seconds from the moment
a worker receives it; past that the worker is killed and replaced, the
answer counts 0.0 and the reason is logged on the ``pivotrl.rewards``
logger at WARNING. Starting the workers (about a second, once per process)
is not counted. The score never raises on any completion text; it raises
RuntimeError only if the worker processes cannot be started at all.

Results are cached per (extracted answer, reference): groups of sampled
completions often repeat an answer. Identical strings, equal plain numbers
and two integer literals (GSM8K-style answers, right or wrong) are decided
without a worker, exactly as math-verify would decide them.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from fractions import Fraction
from numbers import Number

from pivotrl.rewards.math_extract import MAX_ANSWER_CHARS, clean_answer, extract_math_answer
from pivotrl.rewards.math_pool import configure_pool, get_pool, shutdown_pool
from pivotrl.rewards.numbers import parse_number

logger = logging.getLogger("pivotrl.rewards")

DEFAULT_TIMEOUT_S = 2.0
CACHE_SIZE = 1 << 16

_cache: OrderedDict[tuple[str, str], float] = OrderedDict()
_cache_lock = threading.Lock()


def _reference(answer: object) -> str | None:
    """Return the reference answer as a clean string, else None."""
    if isinstance(answer, bool):
        return None
    if isinstance(answer, (Number, Fraction)):
        answer = str(answer)
    if not isinstance(answer, str) or len(answer) > 4 * MAX_ANSWER_CHARS:
        return None
    return clean_answer(answer)


def _decided_locally(prediction: str, reference: str) -> float | None:
    """Decide identical strings, equal plain numbers and two integers; else None (ask math-verify)."""
    if prediction == reference:
        return 1.0
    left, right = parse_number(prediction), parse_number(reference)
    if left is not None and left == right:
        return 1.0
    if left is not None and right is not None and _is_integer_literal(prediction, reference):
        # Two integers differ for math-verify exactly when they differ (no
        # rounding, no percent); decimals keep math-verify's 6-digit rounding.
        return 0.0
    with _cache_lock:
        score = _cache.get((prediction, reference))
        if score is not None:
            _cache.move_to_end((prediction, reference))
        return score


def _is_integer_literal(*texts: str) -> bool:
    return not any("." in text or "/" in text for text in texts)


def _remember(key: tuple[str, str], score: float) -> None:
    with _cache_lock:
        _cache[key] = score
        if len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def math_reward_batch(
    completions: Sequence[str],
    answers: Sequence[object],
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[float]:
    """Score each completion against its reference answer (1.0 or 0.0), in parallel over the worker pool."""
    if len(completions) != len(answers):
        raise ValueError(f"{len(completions)} completions but {len(answers)} answers")
    scores = [0.0] * len(completions)
    pending: dict[tuple[str, str], list[int]] = {}
    for index, (completion, answer) in enumerate(zip(completions, answers, strict=True)):
        reference = _reference(answer)
        if reference is None:
            logger.debug("math_reward: 0.0, unusable reference answer %r", _shorten(repr(answer)))
            continue
        prediction = extract_math_answer(completion)
        if prediction is None:
            logger.debug("math_reward: 0.0, no final answer found")
            continue
        local = _decided_locally(prediction, reference)
        if local is not None:
            scores[index] = local
            continue
        pending.setdefault((prediction, reference), []).append(index)
    if not pending:
        return scores
    keys = list(pending)
    for key, verdict in zip(keys, get_pool().verify(keys, timeout_s), strict=True):
        for index in pending[key]:
            scores[index] = verdict.score
        if verdict.timed_out or verdict.reason.startswith("error"):
            logger.warning(
                "math_reward: 0.0, %s; answer %r, reference %r",
                verdict.reason,
                _shorten(key[0]),
                _shorten(key[1]),
            )
        else:
            _remember(key, verdict.score)
            logger.debug("math_reward: %s, %s", verdict.score, verdict.reason)
    return scores


def math_reward(completion: str, answer: object, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """1.0 iff the completion's final answer equals ``answer`` under math-verify, else 0.0 (also on timeout)."""
    return math_reward_batch([completion], [answer], timeout_s)[0]


def configure_math_workers(workers: int | None = None) -> None:
    """Restart the math-verify pool with ``workers`` processes (None: ``PIVOTRL_MATH_WORKERS`` or the CPU count)."""
    configure_pool(workers)


def shutdown_math_workers() -> None:
    """Stop the math-verify worker processes now (they restart on the next call)."""
    shutdown_pool()


def clear_math_cache() -> None:
    """Forget the cached math verdicts."""
    with _cache_lock:
        _cache.clear()
