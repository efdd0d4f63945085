"""math_reward: extraction, math-verify equivalences, benchmark references, time limits, safety."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pivotrl.rewards import (
    REWARDS,
    extract_math_answer,
    math_reward,
    math_reward_batch,
)
from pivotrl.rewards.math import clear_math_cache
from pivotrl.rewards.math_pool import get_pool
from pivotrl.rewards.math_worker import is_safe_expression, is_safe_for_sympify

BENCHMARKS = Path(
    os.environ.get(
        "PIVOTRL_BENCHMARKS",
        Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "benchmarks",
    )
)


def _rows(name: str) -> list[dict]:
    path = BENCHMARKS / name
    if not path.is_file():
        pytest.skip(f"benchmark file {path} not found (set PIVOTRL_BENCHMARKS)")
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _reference_pairs() -> list[tuple[str, str]]:
    """(reference solution, reference answer) for MATH-500 and GSM8K test."""
    math500 = [(row["solution"], row["answer"]) for row in _rows("math500.jsonl")]
    gsm8k = [
        (row["answer"], row["answer"].rsplit("####", 1)[1].strip())
        for row in _rows("gsm8k_test.jsonl")
    ]
    return math500 + gsm8k


@pytest.fixture(scope="module", autouse=True)
def warm_pool():
    """Start the workers once, so start-up is not inside any timed assertion.

    (Scoring "\\boxed{1}" against "1.0" would not: equal numbers are decided without a worker.)
    """
    _ready_pool()
    yield


def _random_text(seed: int, alphabet: str, size: int = 1 << 20) -> str:
    return "".join(random.Random(seed).choices(alphabet, k=size))


# --- extraction ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{3} then \fbox{\{1,2\}}", r"\{1,2\}"),
        (r"first \boxed{3}, finally \boxed{ 4 }", "4"),
        (r"\boxed{a} and \boxed{\text{b}}", r"\text{b}"),
        (r"\boxed{5} wait \boxed{7", None),  # the last box is truncated: no answer
        (r"\boxed {  x^{2} }", "x^{2}"),
        ("steps\n#### 1,000", "1,000"),
        ("The final answer is 42. I hope it is correct.", "42"),
        ("Answer: $\\frac{1}{2}$.", r"\frac{1}{2}"),
        ("**Answer:** 17", "17"),
        ("<think>the answer is 7</think><answer>42</answer>", "42"),
        ("<answer>The answer is 42</answer>", "42"),
        ("no answer here", None),
        ("", None),
        (r"\boxed{}", None),
        ("\\boxed{" + "1" * 5000 + "}", None),  # over the length cap
    ],
)
def test_extract_math_answer(text, expected):
    assert extract_math_answer(text) == expected


def test_extract_math_answer_non_str():
    assert extract_math_answer(None) is None  # type: ignore[arg-type]
    assert extract_math_answer(b"\\boxed{1}") is None  # type: ignore[arg-type]


def test_extraction_is_linear():
    cases = [
        "\\boxedx" * 150_000,
        "\\boxed{" * 150_000,
        "answer is " * 100_000,
        "#" * 1_000_000,
        "<answer>" * 100_000 + "</answer>" * 100_000,
        _random_text(0, "{}\\ab#answer is:\n<>/"),
    ]
    for text in cases:
        start = time.perf_counter()
        extract_math_answer(text)
        assert time.perf_counter() - start < 2.0


# --- equivalences ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{\dfrac{3}{4}}", "3/4", 1.0),
        (r"\boxed{\frac{1}{3}}", "0.5", 0.0),
        (r"\boxed{(1, 2]}", r"(1,2]", 1.0),
        (r"\boxed{[1, 2)}", r"(1,2]", 0.0),
        (r"\boxed{\{3, 1, 2\}}", r"\{1,2,3\}", 1.0),
        (r"\boxed{50\%}", "50", 1.0),
        (r"\boxed{72 \text{ apples}}", "72", 1.0),
        (r"\boxed{\$1,000}", "1000", 1.0),
        (r"\boxed{5\text{ cm}}", "5", 1.0),
        (r"\boxed{2\sqrt{3}}", r"\sqrt{12}", 1.0),
        (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
        (r"\boxed{\text{(C)}}", r"\text{(C)}", 1.0),
        (r"\boxed{x = 5}", "5", 1.0),
        ("The answer is 1/2.", r"\frac{1}{2}", 1.0),
        ("The answer is 72 apples.", "72", 1.0),
        ("<think>3*4=12</think><answer>12</answer>", "12", 1.0),
        ("<think>3*4=12</think><answer>13</answer>", "12", 0.0),
        ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72", 1.0),
        (r"\boxed{-3}", "-3", 1.0),
        (r"\boxed{3}", "-3", 0.0),
        (r"\boxed{3}", 3, 1.0),
        (r"\boxed{3}", None, 0.0),
        (None, "3", 0.0),
    ],
)
def test_math_reward_cases(completion, answer, expected):
    assert math_reward(completion, answer) == expected


def test_registry_and_batch():
    assert REWARDS["math"] is math_reward
    completions = [r"\boxed{2}", r"\boxed{3}", "nothing", r"\boxed{\frac{4}{2}}"] * 3
    assert math_reward_batch(completions, ["2"] * 12) == [1.0, 0.0, 0.0, 1.0] * 3
    assert math_reward_batch([], []) == []
    with pytest.raises(ValueError):
        math_reward_batch(["a"], [])


@given(st.lists(st.text(max_size=60), min_size=1, max_size=20), st.text(max_size=20))
@settings(max_examples=25, deadline=None)
def test_math_reward_total_on_any_text(texts, reference):
    completions = (
        texts + [f"\\boxed{{{t}}}" for t in texts] + [f"<answer>{t}</answer>" for t in texts]
    )
    scores = math_reward_batch(completions, [reference] * len(completions), timeout_s=5.0)
    assert set(scores) <= {0.0, 1.0}


def test_lone_surrogates_and_odd_types():
    assert math_reward("\\boxed{\ud800}", "3") == 0.0
    assert math_reward("\\boxed{3}\udfff", "\ud800") == 0.0
    assert math_reward("\\boxed{3}", 3.0) == 1.0
    assert math_reward("\\boxed{3}", True) == 0.0
    assert math_reward("\\boxed{3}", ["3"]) == 0.0  # type: ignore[arg-type]


def test_local_shortcuts_agree_with_math_verify():
    """Whatever math_reward decides without a worker, math-verify decides the same way."""
    from pivotrl.rewards.math import _decided_locally

    rng = random.Random(3)
    literals = ["0", "7", "-7", "+7", "1,000", "1000", "1000.0", "0.5", "1/2", "50", "5"]
    literals += [str(rng.randint(-(10**6), 10**6)) for _ in range(20)]
    pairs = [(a, b) for a in literals for b in rng.sample(literals, 6)]
    local = [_decided_locally(a, b) for a, b in pairs]
    decided = [
        (pair, verdict) for pair, verdict in zip(pairs, local, strict=True) if verdict is not None
    ]
    assert len(decided) > len(pairs) // 2
    remote = get_pool().verify([pair for pair, _ in decided], 5.0)
    assert [verdict for _, verdict in decided] == [v.score for v in remote]


def test_pool_refuses_pairs_that_are_not_two_strings():
    pool = get_pool()
    for bad in ([("1", 2)], [("1",)], ["12"], [None]):
        with pytest.raises(TypeError, match="pairs of strings"):
            pool.verify(bad, 1.0)
    assert [v.score for v in pool.verify([("1/2", "0.5")], 5.0)] == [1.0]


def test_math_reward_from_another_thread():
    results: list[float] = []
    thread = threading.Thread(
        target=lambda: results.append(math_reward(r"\boxed{\frac{2}{4}}", "1/2"))
    )
    thread.start()
    thread.join(30)
    assert results == [1.0]


# --- benchmark references ---------------------------------------------------------


def test_benchmark_references_match_and_mismatch():
    """Reference solutions score 1.0 against their answer, 0.0 against the next row's."""
    pairs = _reference_pairs()
    solutions = [solution for solution, _ in pairs]
    answers = [answer for _, answer in pairs]
    start = time.perf_counter()
    positive = math_reward_batch(solutions, answers, timeout_s=5.0)
    rolled = answers[1:] + answers[:1]
    negative = math_reward_batch(solutions, rolled, timeout_s=5.0)
    # A pair only counts as a mismatch when the two reference answers really differ.
    suspect = [i for i, score in enumerate(negative) if score == 1.0]
    same = math_reward_batch(
        ["\\boxed{" + answers[i] + "}" for i in suspect],
        [rolled[i] for i in suspect],
        timeout_s=5.0,
    )
    equal_pairs = {i for i, score in zip(suspect, same, strict=True) if score == 1.0}
    equal_pairs |= {i for i in range(len(answers)) if answers[i].strip() == rolled[i].strip()}
    elapsed = time.perf_counter() - start

    n_math = len(_rows("math500.jsonl"))
    for name, span in (("MATH-500", range(n_math)), ("GSM8K test", range(n_math, len(pairs)))):
        hits = sum(positive[i] for i in span) / len(span)
        distinct = [i for i in span if i not in equal_pairs]
        rejects = sum(1.0 - negative[i] for i in distinct) / len(distinct)
        print(f"{name}: {hits:.2%} matched, {rejects:.2%} of {len(distinct)} rolled pairs rejected")
        assert hits >= 0.99, name
        assert rejects >= 0.99, name
    print(f"{len(pairs)} rows x 2 in {elapsed:.1f}s")


# --- time limits -------------------------------------------------------------------

ADVERSARIAL = [
    r"\boxed{9^{9^{9^9}}}",
    r"\boxed{10^{10^{10^{10}}}}!",
    "\\boxed{" + "{" * 500_000 + "}" * 500_000 + "}",
    r"\boxed{1000000!}",
    r"\boxed{(100000!)!}",
    r"\boxed{2^{2^{2^{2^{2^{2}}}}}}",
    r"\boxed{123456789^{123456789}} - 1",
    r"The answer is 9^9^9^9",
    r"\boxed{\sum_{k=1}^{10^{100}} k^{k}}",
    r"\boxed{\int_0^{10^{10}} e^{x^{x}} dx}",
    "\x00" * 1000 + "\\boxed{3\x00}" + "\x00",
    _random_text(1, "0123456789{}^\\boxed!+*()"),
    "".join(map(chr, random.Random(2).choices(range(1, 0xD800), k=1 << 20))),
    "\\boxed{" + "(" * 400 + "1" + ")" * 400 + "}",
    "\\boxed{" + "\\frac{" * 150 + "1" + "}{2}" * 150 + "}",
]


@pytest.mark.parametrize("completion", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_inputs_return_in_time(completion, caplog):
    timeout_s = 1.0
    clear_math_cache()
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="pivotrl.rewards"):
        score = math_reward(completion, "3", timeout_s=timeout_s)
    elapsed = time.perf_counter() - start
    assert elapsed < timeout_s + 1.0
    assert score in (0.0, 1.0)
    if elapsed > timeout_s:
        assert "timeout" in caplog.text


def test_timeout_is_logged(caplog):
    clear_math_cache()
    with caplog.at_level(logging.WARNING, logger="pivotrl.rewards"):
        assert math_reward(r"\boxed{(100000!)!}", "3", timeout_s=0.5) == 0.0
    assert "timeout" in caplog.text


def _zombie_children() -> list[int]:
    zombies = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            zombies.append(int(stat.parent.name))
    return zombies


def _ready_pool():
    """The pool with every worker started and idle, and an empty verdict cache."""
    pool = get_pool()
    deadline = time.monotonic() + 60
    # A pool starts its workers on its first call (all([]) would be True before it).
    while not (pool.workers and all(w.ready for w in pool.workers)) and time.monotonic() < deadline:
        pool.verify([("1", "1.5")] * 2 * pool.size, 30.0)
    clear_math_cache()
    return pool


@contextmanager
def _stopped(*pids: int):
    """SIGSTOP the processes, and SIGCONT whichever still exists afterwards."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses SIGSTOP and /proc")
def test_stuck_worker_is_killed_and_replaced(caplog):
    """A worker that cannot answer (stopped, like one stuck in C) is killed at the deadline."""
    pool = _ready_pool()
    stopped = [worker.process.pid for worker in pool.workers]
    with _stopped(*stopped), caplog.at_level(logging.WARNING, logger="pivotrl.rewards"):
        start = time.perf_counter()
        score = math_reward(r"\boxed{\frac{7}{2}}", "8", timeout_s=0.5)
        elapsed = time.perf_counter() - start
    assert score == 0.0
    assert elapsed < 1.5
    assert "worker killed" in caplog.text
    # The replacement answers correctly (waiting for its start-up is allowed here).
    assert math_reward_batch([r"\boxed{\frac{6}{2}}"] * 2, ["3", "3.0"], timeout_s=30) == [1.0, 1.0]
    assert set(stopped) - {worker.process.pid for worker in pool.workers}  # one was killed
    assert _zombie_children() == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses SIGSTOP and /proc")
def test_batch_survives_a_stuck_worker(caplog):
    """Only the answer a stuck worker was on is lost; the ones queued behind it move on."""
    pool = _ready_pool()
    victim = pool.workers[0]
    completions = [f"\\boxed{{\\frac{{{i}}}{{{2 * i}}}}}" for i in range(1, 9)]
    with _stopped(victim.process.pid), caplog.at_level(logging.WARNING, logger="pivotrl.rewards"):
        scores = math_reward_batch(completions, ["0.5"] * 8, timeout_s=1.0)
    assert scores.count(0.0) == 1
    assert caplog.text.count("worker killed") == 1
    assert victim not in pool.workers
    assert _zombie_children() == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_builds_its_own_pool():
    parent_pids = {worker.process.pid for worker in get_pool().workers}
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            pool = get_pool()
            fresh = not parent_pids & {worker.process.pid for worker in pool.workers}
            code = 0 if fresh and math_reward(r"\boxed{\frac{3}{6}}", "0.5") == 1.0 else 2
            pool.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert {worker.process.pid for worker in get_pool().workers} == parent_pids
    assert math_reward(r"\boxed{\frac{4}{8}}", "0.5") == 1.0


# --- safety ------------------------------------------------------------------------


def _payloads(marker: Path) -> list[str]:
    command = f"touch {marker}"
    return [
        f"__import__('os').system('{command}')",
        "().__class__.__bases__[0].__subclasses__()",
        f"eval(\"__import__('os').system('{command}')\")",
        "exec(chr(105)+chr(109))",
        f'__import__("os").system("{command}")',
        f"(lambda: __import__('os').system('{command}'))()",
        f"open('{marker}', 'w')",
    ]


def test_model_text_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    completions = []
    for payload in _payloads(marker):
        completions += [
            payload,
            f"\\boxed{{{payload}}}",
            f"The answer is {payload}",
            f"Answer: {payload}",
            f"<think>x</think><answer>{payload}</answer>",
            f"#### {payload}",
            f"$ {payload} $",
        ]
    scores = math_reward_batch(completions, ["3"] * len(completions))
    # Payloads as references, too.
    scores += math_reward_batch(["\\boxed{3}"] * 7, _payloads(marker))
    assert set(scores) <= {0.0}
    assert not marker.exists()


@pytest.mark.parametrize(
    ("text", "expression", "sympify"),
    [
        ("1/2", True, True),
        ("(3+4)*5 - 2**3", True, True),
        ("123.45", True, True),
        ("x**2 + pi", False, True),
        ("kilo", False, True),
        ("__import__('os')", False, False),
        ("().__class__", False, False),
        ("eval(chr(111))", False, False),
        ("exec", False, False),
        ("open(1)", False, False),
        ("lambda: 1", False, False),
        ("test()", False, False),
        ("preview(x)", False, False),
        ("sympify(srepr(x))", False, False),
        ("x[0]", False, False),
        ("1" * 5000, False, False),
        (None, False, False),
    ],
)
def test_parse_expr_guards(text, expression, sympify):
    assert is_safe_expression(text) is expression
    assert is_safe_for_sympify(text) is sympify
