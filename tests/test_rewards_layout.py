"""The think/answer layout helpers, format_reward, trace_validity and arithmetic_reward."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pivotrl.rewards import (
    REWARDS,
    arithmetic_reward,
    as_fraction,
    extract_answer,
    extract_think,
    format_reward,
    last_number,
    parse_number,
    render_completion,
    split_layout,
    trace_steps,
    trace_validity,
)

CANONICAL = "<think>5*3=15;15+7=22</think><answer>5*3+7</answer>"

# --- template -------------------------------------------------------------------------


def test_render_and_extract_round_trip():
    text = render_completion("5*3=15;15+7=22", "5*3+7")
    assert text == CANONICAL
    assert extract_think(text) == "5*3=15;15+7=22"
    assert extract_answer(text) == "5*3+7"
    assert split_layout(text) == ("5*3=15;15+7=22", "5*3+7")


@given(
    st.text().filter(lambda s: "<" not in s and s.strip() == s),
    st.text(min_size=1).filter(lambda s: "<" not in s and s.strip() == s and s),
)
@settings(max_examples=200, deadline=None)
def test_round_trip_property(think, answer):
    text = render_completion(think, answer)
    assert extract_think(text) == think
    assert extract_answer(text) == answer
    assert format_reward(text) == 1.0


@pytest.mark.parametrize(
    ("text", "think", "answer"),
    [
        ("<answer>1</answer> <answer> 2 </answer>", None, "2"),
        ("<think>a</think><think>b</think>", "a", None),
        ("<think>unclosed", None, None),
        ("<answer>unclosed", None, None),
        ("</answer><answer>", None, None),
        ("no tags", None, None),
        ("<think></think><answer></answer>", "", ""),
    ],
)
def test_extract_edge_cases(text, think, answer):
    assert extract_think(text) == think
    assert extract_answer(text) == answer


def test_extract_non_str():
    assert extract_answer(None) is None  # type: ignore[arg-type]
    assert extract_think(42) is None  # type: ignore[arg-type]


# --- format_reward ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (CANONICAL, 1.0),
        ("  \n<think>steps</think>\n\n<answer>42</answer>\n ", 1.0),
        ("<think>\nmulti\nline\n</think> <answer> 42 </answer>", 1.0),
        ("<think></think><answer>42</answer>", 1.0),  # empty think is allowed
        ("<think>s</think><answer>  </answer>", 0.0),  # empty answer is not
        ("<think>s</think><answer></answer>", 0.0),
        ("Sure! <think>s</think><answer>42</answer>", 0.0),
        ("<think>s</think><answer>42</answer> Done.", 0.0),
        ("<think>s</think> and <answer>42</answer>", 0.0),
        ("<answer>42</answer><think>s</think>", 0.0),
        ("<think>s</think><answer>42</answer><answer>42</answer>", 0.0),
        ("<think>s<think>t</think><answer>42</answer>", 0.0),
        ("<think>s</think><answer>4<answer>2</answer>", 0.0),
        ("<think>s</think><answer>42", 0.0),
        ("<think>s<answer>42</answer>", 0.0),
        ("<THINK>s</THINK><ANSWER>42</ANSWER>", 0.0),
        ("<think>s</think><answer>42</answer>\x00", 0.0),
        ("", 0.0),
        (None, 0.0),
    ],
)
def test_format_reward(text, expected):
    assert format_reward(text) == expected
    assert format_reward(text, "ignored answer") == expected


def test_registry():
    assert REWARDS == {
        "math": REWARDS["math"],
        "countdown": REWARDS["countdown"],
        "arithmetic": arithmetic_reward,
        "format": format_reward,
    }


# --- trace_validity -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (CANONICAL, 1.0),
        ("<think>5*3=15;15+7=23</think><answer>x</answer>", 0.5),
        ("<think>12-7=5, 3*4=12\n(2+3)*4=20</think>", 1.0),
        ("<think>5*3=15 15+7=22 22-1=20</think>", pytest.approx(2 / 3)),
        ("<think>First 5*3=15, then add 7: 15+7=22.</think>", 1.0),
        ("<think>3-5=-2; 1.5*2=3; 1/3*3=1</think>", 1.0),
        ("<think>2+3=5=5</think>", 1.0),  # a chain: two steps
        ("<think>2+3=5=6</think>", 0.5),
        ("<think>(so 3+4=7)</think>", 1.0),  # prose brackets trimmed
        ("<think>let x-5=3 so x=8, and 2^3=8, 3=2x</think>", None),  # equations in variables
        ("<think>4/0=1; 2*2=4</think>", 0.5),  # division by zero is an invalid step
        ("<think>(3+4=7; 1+1=2</think>", 1.0),
        ("<think>3+=5; 1+1=2</think>", 0.5),
        ("<think>no arithmetic here</think>", None),
        ("<think></think><answer>1</answer>", None),
        ("5*3=15 but no think block", None),
        ("", None),
        (None, None),
    ],
)
def test_trace_validity(text, expected):
    assert trace_validity(text) == expected


def test_trace_steps_order():
    assert trace_steps("1+1=2; 2+2=5; 3*3=9") == [True, False, True]


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_trace_validity_total_on_any_text(text):
    value = trace_validity(f"<think>{text}</think>")
    assert value is None or 0.0 <= value <= 1.0


@given(
    st.lists(
        st.tuples(st.integers(0, 99), st.integers(0, 99), st.sampled_from("+-*")),
        min_size=1,
        max_size=10,
    )
)
@settings(max_examples=200, deadline=None)
def test_trace_validity_counts_generated_steps(steps):
    """Half the steps correct, half off by one: the fraction is exact."""
    parts, truth = [], []
    for i, (a, b, op) in enumerate(steps):
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        correct = i % 2 == 0
        parts.append(f"{a}{op}{b}={value if correct else value + 1}")
        truth.append(correct)
    assert trace_validity("<think>" + ";".join(parts) + "</think>") == sum(truth) / len(truth)


def test_trace_validity_is_fast_on_huge_text():
    start = time.perf_counter()
    trace_validity("<think>" + "1+1=2 " * 50_000 + "</think>")
    trace_validity("<think>" + "(" * 200_000 + "</think>")
    trace_validity("<think>" + "x" * 1_000_000 + "</think>")
    assert time.perf_counter() - start < 5.0


# --- numbers and arithmetic_reward --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("-3", Fraction(-3)),
        ("+3", Fraction(3)),
        ("−3", Fraction(-3)),
        ("3.0", Fraction(3)),
        ("3.", Fraction(3)),
        (".5", Fraction(1, 2)),
        ("1/2", Fraction(1, 2)),
        ("-6/4", Fraction(-3, 2)),
        ("1,000", Fraction(1000)),
        ("1,000.25", Fraction(4001, 4)),
        (" $42$ ", Fraction(42)),
        ("1/0", None),
        ("1,00", None),
        ("3e5", None),
        ("12-7", None),
        ("", None),
        ("abc", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, Fraction(3)),
        (Fraction(1, 3), Fraction(1, 3)),
        (0.1, Fraction(1, 10)),
        (1e20, Fraction(10**20)),
        ("0.5", Fraction(1, 2)),
        (True, None),
        (float("nan"), None),
        (float("inf"), None),
        (None, None),
        ([3], None),
    ],
)
def test_as_fraction(value, expected):
    assert as_fraction(value) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("so 12-7=5.", Fraction(5)),
        ("x = -3", Fraction(-3)),
        ("5-3", Fraction(3)),
        ("half is 1/2 here", Fraction(1, 2)),
        ("pi is 3.14159", Fraction(314159, 100000)),
        ("none", None),
    ],
)
def test_last_number(text, value):
    assert last_number(text) == value


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("<think>2+3=5</think><answer>5</answer>", 5, 1.0),
        ("<think>2+3=5</think><answer>5</answer>", "5", 1.0),
        ("<answer>-3</answer>", -3, 1.0),
        ("<answer>-3</answer>", 3, 0.0),
        ("<answer>3.0</answer>", 3, 1.0),
        ("<answer>3</answer>", "3.0", 1.0),
        ("<answer>0.5</answer>", "1/2", 1.0),
        ("<answer>1/2</answer>", Fraction(1, 2), 1.0),
        ("<answer>2/4</answer>", "0.5", 1.0),
        ("<answer>0.333</answer>", "1/3", 0.0),  # exact, no tolerance
        ("<answer>12-7</answer>", 5, 0.0),  # an expression is not a number
        ("<answer>5 apples</answer>", 5, 0.0),
        ("<answer>1,000</answer>", 1000, 1.0),
        ("<answer>7</answer> but 5 in the end", 5, 0.0),  # the block wins over the last number
        ("The result is 12 - 7 = 5.", 5, 1.0),  # no block: the last number
        ("The result is 5, not 6", 5, 0.0),
        ("no number", 5, 0.0),
        ("<answer>5</answer>", "five", 0.0),
        ("<answer>5</answer>", None, 0.0),
        ("<answer>True</answer>", True, 0.0),
        (None, 5, 0.0),
    ],
)
def test_arithmetic_reward(completion, answer, expected):
    assert arithmetic_reward(completion, answer) == expected


@given(st.text(max_size=200), st.one_of(st.integers(), st.text(max_size=10), st.none()))
@settings(max_examples=300, deadline=None)
def test_arithmetic_reward_total(completion, answer):
    assert arithmetic_reward(completion, answer) in (0.0, 1.0)
    assert format_reward(completion) in (0.0, 1.0)
