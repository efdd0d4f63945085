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
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction

from pivotrl.rewards.expression import (
    ExpressionError,
    Token,
    evaluate_tokens,
    lex,
)
from pivotrl.rewards.template import extract_think

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


def trace_steps(text: str) -> list[bool]:
    """Return, for each arithmetic step in ``text`` in order, whether it is true."""
    results: list[bool] = []
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
            if not lhs or not rhs:
                continue
            left, right = _side_value(lhs), _side_value(rhs)
            results.append(left is not None and right is not None and left == right)
    return results


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
