"""Trace validity: the fraction of worked arithmetic steps in ``<think>`` that are true.

A step is an equation ``LHS=RHS`` whose sides are arithmetic expressions
(:mod:`pivotrl.rewards.expression`, with unary minus and decimals allowed, so
``3-5=-2`` and ``1.5*2=3`` are steps). Steps are separated by ``;``, ``,``,
newlines, words, or simply by two equations side by side
(``5*3=15 15+7=22``): a number or ``)`` followed by a number or ``(`` starts a
new step. A chain ``a=b=c`` is the two steps ``a=b`` and ``b=c``. Equations
over variables are not steps: a side touching a letter or other symbol
(``x-5=3``, ``3=2x``, ``2^3=8``) is dropped, as is a side left empty
(``x=5``). Brackets that only belong to the prose around a step
(``(so 3+4=7)``) are trimmed. A step whose side is still malformed, or
divides by zero, counts as invalid. Only the first
:data:`MAX_TRACE_CHARS` characters of the think block are read.

A *search* trace (the ``countdown_search`` task) is a think block of attempts,
one per line; an attempt is steps separated by ``,``, and one that was given
up ends with `` x``::

    20+13=33,33*3=99,99-4=95 x
    20-13=7,7*3=21,21+4=25

:func:`search_trace_validity` checks every written step of every attempt
twice: the arithmetic is true, and its numbers are available, i.e. each
literal on the left side is one of the problem's numbers or a result of an
earlier step of the same attempt, not yet used (each attempt starts again
from the problem's numbers). A step's written result becomes available even
when the step is wrong, so a slip costs one step, not the rest of the attempt.
:func:`search_attempts` splits a response into its attempts (also a response
cut off before ``</think>``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction

from pivotrl.rewards.expression import (
    ExpressionError,
    Token,
    evaluate_tokens,
    lex,
    number_value,
)
from pivotrl.rewards.template import THINK_CLOSE, THINK_OPEN, extract_think

MAX_SIDE_TOKENS = 200
# Only this much of a think block is read (about 8k steps; a call stays well
# under a second on one core whatever the completion).
MAX_TRACE_CHARS = 50_000

# Punctuation that ends a sentence or a step and does not bind to a number;
# anything else non-blank next to a number ("x", "^", "\\") makes it a symbol.
_NEUTRAL = frozenset(";,.:!?$\"'")


def _is_neutral(token: Token) -> bool:
    return token.kind == "newline" or all(ch in _NEUTRAL for ch in token.text)


def _runs(tokens: list[Token]) -> Iterator[tuple[list[Token], bool, bool]]:
    """Yield (tokens, glued_before, glued_after) for each maximal arithmetic run."""
    run: list[Token] = []
    glued_before = False
    previous: Token | None = None
    for token in tokens:
        if token.kind in ("other", "newline"):
            if run:
                glued_after = token.start == run[-1].end and not _is_neutral(token)
                yield run, glued_before, glued_after
                run = []
            previous = token
            continue
        if run and run[-1].kind in ("num", "rp") and token.kind in ("num", "lp"):
            yield run, glued_before, False
            run = []
        if not run:
            glued_before = (
                previous is not None
                and previous.kind == "other"
                and previous.end == token.start
                and not _is_neutral(previous)
            )
        run.append(token)
        previous = token
    if run:
        yield run, glued_before, False


def _trim_brackets(run: list[Token]) -> list[Token]:
    """Drop unmatched '(' at the start and unmatched ')' at the end of a run."""
    start, end = 0, len(run)
    balance = sum(1 if t.kind == "lp" else -1 if t.kind == "rp" else 0 for t in run)
    while balance > 0 and start < end and run[start].kind == "lp":
        start += 1
        balance -= 1
    while balance < 0 and end > start and run[end - 1].kind == "rp":
        end -= 1
        balance += 1
    return run[start:end]


def _side_value(side: list[Token]) -> Fraction | None:
    if len(side) > MAX_SIDE_TOKENS:
        return None
    try:
        return evaluate_tokens(side, allow_unary_minus=True, allow_decimals=True).value
    except (ExpressionError, RecursionError):
        return None


def equations(text: str) -> Iterator[tuple[list[Token], list[Token]]]:
    """Yield (left side, right side) tokens of each arithmetic step in ``text``, in order."""
    for run, glued_before, glued_after in _runs(list(lex(text))):
        if not any(t.kind == "eq" for t in run):
            continue
        sides: list[list[Token] | None] = [[]]
        for token in _trim_brackets(run):
            if token.kind == "eq":
                sides.append([])
            else:
                sides[-1].append(token)  # type: ignore[union-attr]
        if glued_before:
            sides[0] = None
        if glued_after:
            sides[-1] = None
        for lhs, rhs in zip(sides, sides[1:], strict=False):
            if lhs and rhs:
                yield lhs, rhs


def _step_holds(lhs: list[Token], rhs: list[Token]) -> bool:
    left, right = _side_value(lhs), _side_value(rhs)
    return left is not None and right is not None and left == right


def trace_steps(text: str) -> list[bool]:
    """Return, for each arithmetic step in ``text`` in order, whether it is true."""
    return [_step_holds(lhs, rhs) for lhs, rhs in equations(text)]


def trace_validity(completion: str) -> float | None:
    """Return the fraction of true arithmetic steps in the ``<think>`` block, or None when it has none."""
    if not isinstance(completion, str):
        return None
    think = extract_think(completion)
    if think is None:
        return None
    steps = trace_steps(think[:MAX_TRACE_CHARS])
    if not steps:
        return None
    return sum(steps) / len(steps)


# -- search traces -------------------------------------------------------------------

STEP_SEPARATOR = ","
ATTEMPT_SEPARATOR = "\n"
#: Written after an attempt that failed, separated by a space: ``99-4=95 x``.
ABANDON_MARKER = "x"


def _think_so_far(completion: str) -> str | None:
    """The think block, or everything after an unclosed ``<think>``; None without ``<think>``."""
    think = extract_think(completion)
    if think is not None:
        return think
    start = completion.find(THINK_OPEN)
    if start < 0:
        return None
    body = completion[start + len(THINK_OPEN) :]
    return body.split(THINK_CLOSE, 1)[0]


def search_attempts(completion: str) -> list[str]:
    """The attempts written in the think part of ``completion`` (each with at least one ``=``).

    An unclosed think part (a response cut off by the length limit) counts the
    attempts written so far; a completion without ``<think>`` has none.
    """
    if not isinstance(completion, str):
        return []
    think = _think_so_far(completion)
    if think is None:
        return []
    segments = think[:MAX_TRACE_CHARS].split(ATTEMPT_SEPARATOR)
    return [s.strip() for s in segments if "=" in s]


def _literals(side: list[Token]) -> list[Fraction] | None:
    try:
        return [number_value(t, allow_decimals=True) for t in side if t.kind == "num"]
    except ExpressionError:
        return None


@dataclass(frozen=True)
class PoolStep:
    """One written step of a think block and the numbers around it (see :func:`pool_steps`).

    ``start``/``end``: offsets in the think text of the step's first character and just
    after its written result; ``attempt``: the line it is on (0 when lines are not
    attempts); ``used``: the left side's number literals (None when one cannot be read);
    ``written``: the right side's value (None when it cannot be evaluated); ``parsed``:
    both sides evaluate; ``available``: every literal is in the pool; ``holds``: the two
    sides are equal; ``pool``: the numbers available after the step, sorted.
    """

    start: int
    end: int
    attempt: int
    used: tuple[Fraction, ...] | None
    written: Fraction | None
    parsed: bool
    available: bool
    holds: bool
    pool: tuple[Fraction, ...]


def pool_steps(think: str, numbers: Iterable[int | Fraction], *, attempts: bool = True) -> Iterator[PoolStep]:
    """Each step of ``think`` in order, with the pool of numbers it draws from.

    The pool starts as ``numbers``; a step takes its literals out of it (those that are
    there) and puts its written result in (also when the step is wrong). With
    ``attempts`` every line is an attempt that starts again from ``numbers`` (a search
    trace); without, the pool runs through the whole text.
    """
    start = Counter(Fraction(n) for n in numbers)
    text = think[:MAX_TRACE_CHARS]
    offset = 0
    for index, attempt in enumerate(text.split(ATTEMPT_SEPARATOR) if attempts else [text]):
        pool = Counter(start)
        for lhs, rhs in equations(attempt):
            used = _literals(lhs)
            available = used is not None and all(count <= pool[n] for n, count in Counter(used).items())
            left, written = _side_value(lhs), _side_value(rhs)
            pool -= Counter(used or ())
            if written is not None:
                pool[written] += 1
            yield PoolStep(
                start=offset + lhs[0].start, end=offset + rhs[-1].end, attempt=index,
                used=None if used is None else tuple(used), written=written,
                parsed=left is not None and written is not None, available=available,
                holds=left is not None and left == written, pool=tuple(sorted(pool.elements())),
            )
        offset += len(attempt) + len(ATTEMPT_SEPARATOR)


def search_steps(think: str, numbers: Iterable[int | Fraction]) -> list[bool]:
    """For each step of each attempt in ``think``, whether it is true and uses available numbers."""
    return [step.available and step.holds for step in pool_steps(think, numbers)]


def search_trace_validity(completion: str, numbers: Iterable[int | Fraction]) -> float | None:
    """The share of valid steps (true, on available numbers) in a search trace's think block.

    None when the completion has no closed think block or no step in it.
    """
    if not isinstance(completion, str):
        return None
    think = extract_think(completion)
    if think is None:
        return None
    steps = search_steps(think, numbers)
    if not steps:
        return None
    return sum(steps) / len(steps)
