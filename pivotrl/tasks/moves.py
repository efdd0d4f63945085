"""The moves of countdown: which two numbers combine into what, and which values a state can still write.

A *state* is the sorted tuple of the whole positive numbers not used yet. A *move* takes two
of them, ``a >= b``, and writes ``a+b``, ``a-b``, ``a*b`` or ``a/b`` when the result is a
whole number of at least 1 (and at most ``max_value``, when that is not None); ``*1`` and
``/1`` are not moves (they only drop the 1, which a search can do by not using it, so no
value becomes reachable or unreachable by leaving them out). ``countdown_search`` writes
its worked searches with these moves (``max_value`` 100 by default); ``countdown``'s
generator combines numbers under the same rule without a bound (``max_value=None``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from fractions import Fraction
from itertools import combinations

# (left operand, operator, right operand, result, the state after the move)
Move = tuple[int, str, int, int, tuple[int, ...]]


def pair_results(a: int, b: int, max_value: int | None) -> list[tuple[str, int]]:
    """The legal moves on two values ``a >= b``: (operator, result) with a whole result
    in ``[1, max_value]`` (no upper bound when ``max_value`` is None), no ``*1`` or ``/1``."""
    out = [("+", a + b), ("-", a - b)]
    if b > 1:
        out.append(("*", a * b))
        if a % b == 0:
            out.append(("/", a // b))
    return [(op, v) for op, v in out if v >= 1 and (max_value is None or v <= max_value)]


@functools.lru_cache(maxsize=1 << 16)
def legal_moves(state: tuple[int, ...], max_value: int | None) -> tuple[Move, ...]:
    """Every distinct move on the sorted values ``state`` (larger operand first)."""
    out: list[Move] = []
    seen: set[tuple[int, int]] = set()
    for i, j in combinations(range(len(state)), 2):
        b, a = state[i], state[j]  # sorted: a >= b
        if (a, b) in seen:
            continue
        seen.add((a, b))
        rest = state[:i] + state[i + 1 : j] + state[j + 1 :]
        for op, value in pair_results(a, b, max_value):
            out.append((a, op, b, value, tuple(sorted((*rest, value)))))
    return tuple(out)


@functools.lru_cache(maxsize=1 << 16)
def reachable(state: tuple[int, ...], max_value: int | None) -> frozenset[int]:
    """Every value some sequence of legal moves from the sorted values ``state`` writes."""
    if len(state) == 2:
        return frozenset(v for _, v in pair_results(state[1], state[0], max_value))
    out: set[int] = set()
    if len(state) == 3:  # the common case, without building the states in between
        for (x, y), z in (((state[0], state[1]), state[2]), ((state[0], state[2]), state[1]),
                          ((state[1], state[2]), state[0])):
            for _, v in pair_results(y, x, max_value):
                out.add(v)
                out.update(w for _, w in pair_results(max(v, z), min(v, z), max_value))
        return frozenset(out)
    for *_, value, after in legal_moves(state, max_value):
        out.add(value)
        out |= reachable(after, max_value)
    return frozenset(out)


@functools.lru_cache(maxsize=1 << 16)
def winning_moves(state: tuple[int, ...], target: int, max_value: int | None) -> tuple[Move, ...]:
    """The legal moves that write ``target`` or leave a state from which it can be written."""
    return tuple(
        m
        for m in legal_moves(state, max_value)
        if m[3] == target or (len(m[4]) > 1 and target in reachable(m[4], max_value))
    )


def can_reach(values: Iterable[int | Fraction], target: int | Fraction, max_value: int | None) -> bool:
    """Whether ``target`` is among ``values`` or some sequence of legal moves on them writes it.

    Only the whole positive values take part in moves: any other value (0, a negative
    number, a fraction, which a response may write) is there but can never be combined.
    """
    state = tuple(sorted(int(v) for v in values if v >= 1 and v == int(v)))
    return target in state or target in reachable(state, max_value)
