"""math_reward: extraction, math-verify equivalences, benchmark references, time limits, safety."""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import threading
import time
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
    """Start the workers once, so start-up is not inside any timed assertion."""
    get_pool().start()
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


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (each thread's own are listed apart)."""
    children = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children += [int(child) for child in path.read_text().split()]
        except OSError:
            continue
    return children


def _descendants(pid: int) -> list[int]:
    found, queue = [], [pid]
    while queue:
        for child in _children(queue.pop()):
            found.append(child)
            queue.append(child)
    return found


def _zombies() -> list[int]:
    """Descendants of this process that exited and were never reaped."""
    zombies = []
    for pid in _descendants(os.getpid()):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            zombies.append(pid)
    return zombies


def _worker_pids(pool) -> set[int]:
    """The host's pool workers (multiprocessing's spawned children; not its resource tracker)."""
    pids = set()
    for pid in _children(pool.host.pid):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.add(pid)
        except OSError:
            continue
    return pids


def _all_workers(pool) -> set[int]:
    """The workers, once there are as many as the pool's size (a replacement may be starting)."""
    deadline = time.monotonic() + 30
    workers = _worker_pids(pool)
    while len(workers) < pool.size and time.monotonic() < deadline:
        time.sleep(0.1)
        workers = _worker_pids(pool)
    return workers


def _ready_pool():
    """The pool with its host and every worker started, and an empty verdict cache."""
    pool = get_pool()
    pool.start()
    clear_math_cache()
    return pool


# Python-level work that runs far past any deadline here: with the worker's own
# (soft) deadline switched off, only the kill stops it, exactly as for work stuck in C.
SLOW = r"(100000!)!"


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux_only
def test_stuck_worker_is_killed_and_replaced():
    """An answer its worker cannot stop is killed at the deadline; a new worker takes its place."""
    pool = _ready_pool()
    before = _all_workers(pool)
    start = time.perf_counter()
    verdicts = pool.verify([(SLOW, "3")], 0.5, soft=False)
    elapsed = time.perf_counter() - start
    assert [(v.score, v.reason) for v in verdicts] == [(0.0, "timeout after 0.5s (worker killed)")]
    assert elapsed < 1.5
    # The replacement answers correctly (waiting for its start-up is allowed here).
    assert math_reward_batch([r"\boxed{\frac{6}{2}}"] * 2, ["3", "3.0"], timeout_s=30) == [1.0, 1.0]
    after = _all_workers(pool)
    assert len(before - after) == 1  # the one that was killed
    assert len(after) == len(before)
    assert _zombies() == []


@linux_only
def test_answers_queued_behind_stuck_workers_keep_their_time():
    """Every worker stuck at once: only those answers are lost; the queued ones still get a worker and their full time."""
    pool = _ready_pool()
    fast = [(f"\\frac{{{i}}}{{{2 * i}}}", "0.5") for i in range(1, 9)]
    pairs = [(SLOW, "3")] * pool.size + fast
    start = time.perf_counter()
    verdicts = pool.verify(pairs, 1.0, soft=False)
    elapsed = time.perf_counter() - start
    assert [v.reason for v in verdicts[: pool.size]] == [
        "timeout after 1s (worker killed)"
    ] * pool.size
    assert [v.score for v in verdicts[pool.size :]] == [1.0] * len(fast)
    assert elapsed < 60  # the kills, the replacements' start-up, then the fast answers
    assert _zombies() == []


@linux_only
def test_workers_do_not_load_the_callers_modules():
    """The workers start from the host script, not from this process: no torch in them."""
    import torch  # noqa: F401 - loaded here, so a worker copied or re-imported from here would map it

    pool = _ready_pool()
    workers = _all_workers(pool)
    assert len(workers) == pool.size
    for pid in [pool.host.pid, *workers]:
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "torch" not in maps, pid


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_builds_its_own_pool():
    parent_host = _ready_pool().host.pid
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            pool = get_pool()
            right = math_reward(r"\boxed{\frac{3}{6}}", "0.5") == 1.0
            code = 0 if right and pool.host.pid != parent_host else 2
            pool.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert get_pool().host.pid == parent_host
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
