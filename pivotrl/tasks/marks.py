"""Per-token marks of a countdown response: its free tokens, and where the target is still reachable.

What :meth:`Task.token_marks <pivotrl.tasks.base.Task.token_marks>` returns for ``countdown``
and ``countdown_search``. Marks are worked out per character of the response text and then
given to its tokens (:func:`token_marks`): a token is free when every character it writes is
free (an empty token, such as ``<eos>`` decoded, is not), and it is written in the state in
force at its first character.

The state rules (:func:`reachable_characters`) are the task's docstring's; in short, the
state is the multiset of numbers the response has left, it changes when a step of the think
block completes, and it is *reachable* when the target is in it or legal moves
(:mod:`pivotrl.tasks.moves`) can write the target from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from pivotrl.rewards.template import think_bounds
from pivotrl.rewards.trace import ATTEMPT_SEPARATOR, MAX_TRACE_CHARS, pool_steps
from pivotrl.tasks.free import free_characters
from pivotrl.tasks.moves import can_reach


def reachable_characters(
    text: str, numbers: Sequence[int], target: int, *, max_value: int | None, attempts: bool
) -> list[bool]:
    """Whether the target is reachable from the state in force at each offset 0..len(text).

    The state starts as ``numbers``. Each step the trace checks read in the think block
    (:func:`pivotrl.rewards.trace.pool_steps`) completes at the end of its written result:
    from the next offset on, its literals are out of the state and its written value is
    in (a wrong result too). A step that uses a number the state does not hold, or whose
    sides do not evaluate, makes the state dead (unreachable) for the rest of its attempt.
    With ``attempts`` (countdown_search) every line of the think block is an attempt: the
    offset after a newline starts again from ``numbers``. Offsets after the think block
    keep the state it ended in; offsets before ``<think>`` have the first state.
    """
    first = can_reach(numbers, target, max_value)
    marks = [first] * (len(text) + 1)
    bounds = think_bounds(text)
    if bounds is None:
        return marks
    start, end = bounds
    think = text[start:end]
    changes: list[tuple[int, bool]] = []  # (offset in the think text, value from there on)
    if attempts:
        offset = 0
        for line in think[:MAX_TRACE_CHARS].split(ATTEMPT_SEPARATOR)[:-1]:
            offset += len(line) + len(ATTEMPT_SEPARATOR)
            changes.append((offset, first))
    dead: set[int] = set()
    for step in pool_steps(think, numbers, attempts=attempts):
        if step.attempt in dead:
            continue
        if step.available and step.parsed:
            changes.append((step.end, can_reach(step.pool, target, max_value)))
        else:
            dead.add(step.attempt)
            changes.append((step.end, False))
    changes.sort(key=lambda change: change[0])  # stable: a line's reset comes before its steps
    value, k = first, 0
    for offset in range(start, len(text) + 1):
        while k < len(changes) and start + changes[k][0] <= offset:
            value = changes[k][1]
            k += 1
        marks[offset] = value
    return marks


def token_marks(
    pieces: Sequence[str], numbers: Sequence[int], target: int, *,
    max_value: int | None, attempts: bool, free: bool,
) -> dict[str, list[bool]]:
    """``{"reachable": [...]}`` (and ``"free"`` when ``free``) for the tokens ``pieces`` of one response."""
    text = "".join(pieces)
    starts = [0, *accumulate(len(p) for p in pieces)][:-1]
    reach = reachable_characters(text, numbers, target, max_value=max_value, attempts=attempts)
    marks = {"reachable": [reach[s] for s in starts]}
    if free:
        chars = free_characters(text)
        marks["free"] = [bool(p) and all(chars[s : s + len(p)]) for s, p in zip(starts, pieces, strict=True)]
    return marks
