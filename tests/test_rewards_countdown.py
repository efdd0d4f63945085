"""The safe expression parser and the countdown verifier: properties and hand cases."""

from __future__ import annotations

import re
import time
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pivotrl.rewards import REWARDS, countdown_reward
from pivotrl.rewards.countdown import countdown_expression
from pivotrl.rewards.expression import (
    MAX_DEPTH,
    ExpressionError,
    evaluate,
    try_evaluate,
)

# --- expression trees --------------------------------------------------------------

OPERATORS = "+-*/"


def _apply(op: str, left: Fraction, right: Fraction) -> Fraction:
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    return left / right  # ZeroDivisionError propagates


def _trees(max_leaves: int = 8):
    """Trees of (text, value, numbers); the text is fully parenthesised or bare at random."""
    leaf = st.integers(min_value=0, max_value=999).map(lambda n: (str(n), Fraction(n), [n]))

    def extend(children):
        return st.tuples(st.sampled_from(OPERATORS), children, children, st.booleans()).map(
            _combine
        )

    return st.recursive(leaf, extend, max_leaves=max_leaves)


def _combine(parts):
    op, (ltext, lvalue, lnums), (rtext, rvalue, rnums), spaced = parts
    gap = " " if spaced else ""
    value = None
    if lvalue is not None and rvalue is not None:
        try:
            value = _apply(op, lvalue, rvalue)
        except ZeroDivisionError:
            value = None
    return f"({ltext}{gap}{op}{gap}{rtext})", value, lnums + rnums


@given(_trees())
@settings(max_examples=300, deadline=None)
def test_random_trees_evaluate_like_fractions(tree):
    text, value, numbers = tree
    assume(text.count("(") <= MAX_DEPTH)
    result = try_evaluate(text)
    if value is None:
        assert result is None  # division by zero somewhere
        with pytest.raises(ExpressionError):
            evaluate(text)
    else:
        assert result is not None
        assert result.value == value
        assert list(result.numbers) == numbers


def _python_value(text: str) -> Fraction:
    """Python's own precedence, with every literal as a Fraction (tests only: digits and operators)."""
    assert re.fullmatch(r"[0-9+\-*/() ]*", text) and "**" not in text
    literals = re.sub(r"[0-9]+", lambda m: f"Fraction({int(m.group())})", text)
    return eval(literals, {"Fraction": Fraction})  # noqa: S307


@given(
    st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=6),
    st.lists(st.sampled_from(OPERATORS), min_size=5, max_size=5),
)
@settings(max_examples=300, deadline=None)
def test_precedence_matches_python(numbers, operators):
    """Without parentheses, * and / bind tighter and everything is left-associative, as in Python."""
    text = str(numbers[0]) + "".join(
        f"{op}{n}" for op, n in zip(operators, numbers[1:], strict=False)
    )
    assert evaluate(text).value == _python_value(text)


@given(st.text(max_size=200))
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_arbitrary_text_never_raises_unexpected(text):
    assert try_evaluate(text) is None or isinstance(try_evaluate(text).value, Fraction)
    assert countdown_reward(text, {"numbers": [1, 2, 3], "target": 6}) in (0.0, 1.0)
    assert countdown_reward(text, {"numbers": [3, 5, 7], "target": 22}, exact_use=True) in (
        0.0,
        1.0,
    )


@given(st.text(alphabet="0123456789+-*/() ", max_size=60))
@settings(max_examples=500, deadline=None)
def test_arithmetic_alphabet_never_raises(text):
    result = try_evaluate(text)
    if result is not None:
        assert result.value == _python_value(text)


@given(st.text(alphabet="0123456789+-*/()", min_size=1, max_size=40))
@settings(max_examples=300, deadline=None)
def test_arbitrary_arithmetic_scored_exactly(text):
    """A 1.0 is always backed by an independent evaluation (Python's, on Fractions)."""
    numbers = [int(n) for n in re.findall(r"[0-9]+", text)]
    score = countdown_reward(f"<answer>{text}</answer>", {"numbers": numbers, "target": 7})
    if score == 1.0:
        assert _python_value(text) == 7


# --- number-use constraints ----------------------------------------------------------


@given(
    st.lists(st.integers(min_value=1, max_value=20), min_size=2, max_size=5),
    st.data(),
)
@settings(max_examples=300, deadline=None)
def test_number_use_constraints(numbers, data):
    used = data.draw(st.lists(st.sampled_from(numbers + [21, 22]), min_size=1, max_size=6))
    text = "+".join(map(str, used))
    target = sum(used)
    allowed = not (Counter(used) - Counter(numbers))
    task = {"numbers": numbers, "target": target}
    assert countdown_reward(f"<answer>{text}</answer>", task) == (1.0 if allowed else 0.0)
    exact = Counter(used) == Counter(numbers)
    assert countdown_reward(f"<answer>{text}</answer>", task, exact_use=True) == (
        1.0 if exact else 0.0
    )


# --- hand cases ------------------------------------------------------------------------

TASK = {"numbers": [3, 5, 7], "target": 22}


@pytest.mark.parametrize(
    ("completion", "task", "exact_use", "expected"),
    [
        ("<think>5*3=15;15+7=22</think><answer>5*3+7</answer>", TASK, False, 1.0),
        ("<think>5*3=15;15+7=22</think><answer>5*3+7</answer>", TASK, True, 1.0),
        ("<answer>(7 + 5) * 3 - 14</answer>", TASK, False, 0.0),  # 14 is not given
        ("<answer>3*7+5-4</answer>", TASK, False, 0.0),
        ("<answer>5*3+7</answer>", {"numbers": [3, 5, 7, 9], "target": 22}, False, 1.0),
        ("<answer>5*3+7</answer>", {"numbers": [3, 5, 7, 9], "target": 22}, True, 0.0),
        ("<answer>5*5-3</answer>", TASK, False, 0.0),  # 5 used twice
        ("<answer>5*5-3</answer>", {"numbers": [5, 5, 3], "target": 22}, True, 1.0),
        ("<answer>(7-5)/2*22</answer>", {"numbers": [7, 5, 2, 22], "target": 22}, True, 1.0),
        ("<answer>7/(5-5)</answer>", {"numbers": [7, 5, 5], "target": 1}, False, 0.0),
        ("<answer>-3+25</answer>", {"numbers": [3, 25], "target": 22}, False, 0.0),  # unary minus
        ("<answer>5*3+7=22</answer>", TASK, False, 0.0),  # the bare expression only
        ("<answer>5×3+7</answer>", TASK, False, 1.0),
        ("<answer>2(3+8)</answer>", {"numbers": [2, 3, 8], "target": 22}, False, 0.0),  # implicit *
        ("<answer>1</answer> and later <answer>5*3+7</answer>", TASK, False, 1.0),  # the last block
        ("I think it is\n5*3+7\n", TASK, False, 1.0),  # no block: the last line
        ("5*3+7\nso that is it", TASK, False, 0.0),
        ("<answer>5.0*3+7</answer>", TASK, False, 0.0),  # integers only
        ("<answer>__import__('os')</answer>", TASK, False, 0.0),
        (
            "<answer>" + "(" * 40 + "22" + ")" * 40 + "</answer>",
            {"numbers": [22], "target": 22},
            False,
            0.0,
        ),
        (
            "<answer>" + "(" * 10 + "22" + ")" * 10 + "</answer>",
            {"numbers": [22], "target": 22},
            False,
            1.0,
        ),
        ("<answer></answer>", TASK, False, 0.0),
        ("", TASK, False, 0.0),
        ("<answer>5*3+7</answer>", {"numbers": [3, 5, 7]}, False, 0.0),
        ("<answer>5*3+7</answer>", {"numbers": "357", "target": 22}, False, 0.0),
        ("<answer>5*3+7</answer>", None, False, 0.0),
        ("<answer>5*3+7</answer>", {"numbers": [3, 5, 7], "target": "22"}, False, 1.0),
        (None, TASK, False, 0.0),
    ],
)
def test_countdown_cases(completion, task, exact_use, expected):
    assert countdown_reward(completion, task, exact_use=exact_use) == expected


def test_registry():
    assert REWARDS["countdown"] is countdown_reward


def test_expression_source():
    assert countdown_expression("<answer> 1+2 </answer>") == "1+2"
    assert countdown_expression("a\n  1+2  \n\n") == "1+2"
    assert countdown_expression("") is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1/3*3", Fraction(1)),
        ("2-3-4", Fraction(-5)),
        ("2/3/4", Fraction(1, 6)),
        ("(1+2)*(3+4)", Fraction(21)),
        ("007", Fraction(7)),
        ("8 ÷ 2 − 1", Fraction(3)),
    ],
)
def test_evaluate_values(text, value):
    assert evaluate(text).value == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1+",
        "(1",
        "1)",
        "1 2",
        "--1",
        "-1",
        "+1",
        "1^2",
        "1**2",
        "1//2",
        "x",
        "1=1",
        "1,000",
        "٣",
    ],
)
def test_evaluate_rejects(text):
    with pytest.raises(ExpressionError):
        evaluate(text)


def test_unary_minus_and_decimals_are_options():
    assert evaluate("-3+25", allow_unary_minus=True).value == 22
    assert evaluate("3--5", allow_unary_minus=True).value == 8
    assert evaluate("1.5*2", allow_decimals=True).value == 3
    with pytest.raises(ExpressionError):
        evaluate("1.5*2")


def test_bounds_keep_calls_cheap():
    start = time.perf_counter()
    assert try_evaluate("1+" * 600 + "1") is None  # longer than the cap
    assert try_evaluate("(" * 400 + "1" + ")" * 400) is None  # deeper than the cap
    assert try_evaluate("-" * 900 + "1", allow_unary_minus=True) is None
    assert try_evaluate("9" * 101) is None  # literal too long
    assert try_evaluate("*".join(["999"] * 249)).value == 999**249
    long_text = "<answer>" + "1+" * 500_000 + "1</answer>"
    assert countdown_reward(long_text, TASK) == 0.0
    assert countdown_reward("x" * 1_000_000, TASK) == 0.0
    assert time.perf_counter() - start < 2.0
