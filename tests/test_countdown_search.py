"""countdown_search: the generator, its worked searches, search trace validity, attempt counts."""

from __future__ import annotations

import json
import random
import re
import statistics
from collections import Counter
from fractions import Fraction

import pytest

from pivotrl.rewards import (
    evaluate,
    format_reward,
    search_attempts,
    search_steps,
    search_trace_validity,
    split_layout,
    trace_validity,
)
from pivotrl.tasks import TASKS, get_task
from pivotrl.tasks.search import legal_moves, winning_moves

SMALL = {"train_size": 300, "test_size": 200}
STEP = re.compile(r"^(\d+)([-+*/])(\d+)=(\d+)$")


def _identity(problems):
    return [(p.prompt, json.dumps(p.answer, sort_keys=True)) for p in problems]


def _apply(a: int, op: str, b: int) -> Fraction:
    return {"+": Fraction(a + b), "-": Fraction(a - b), "*": Fraction(a * b)}.get(op) or Fraction(a, b)


def _check_by_hand(response: str, numbers: list[int]) -> tuple[list[list[tuple[int, str, int, int]]], int]:
    """Parse a generated search with a regex (independently of pivotrl.rewards.trace):
    its attempts as (a, op, b, written) steps, and how many steps are slips (wrong
    arithmetic or numbers not available)."""
    think, _ = split_layout(response)
    attempts, slips = [], 0
    lines = think.split("\n")
    for k, line in enumerate(lines):
        body = line.removesuffix(" x")
        assert line.endswith(" x") or k == len(lines) - 1, line  # only the last may end without x
        pool = Counter(numbers)
        steps = []
        for text in body.split(","):
            a, op, b, r = STEP.match(text).groups()
            a, b, r = int(a), int(b), int(r)
            assert a >= b  # larger operand first
            ok = _apply(a, op, b) == r and pool[a] >= 1 and pool[b] >= 1 + (a == b)
            slips += not ok
            pool -= Counter([a, b])
            pool[r] += 1
            steps.append((a, op, b, r))
        attempts.append(steps)
    return attempts, slips


# -- problems ------------------------------------------------------------------------


def test_registered():
    assert "countdown_search" in TASKS
    task = get_task("countdown_search", **SMALL)
    p = task.problems("test")[0]
    assert task.format_prompt(p) == f"{p.prompt}\n"
    assert re.fullmatch(r"Use( \d+){4} to make \d+\.", p.prompt)


def test_generator_is_deterministic_by_seed():
    a = get_task("countdown_search", seed=7, **SMALL)
    b = get_task("countdown_search", seed=7, **SMALL)
    c = get_task("countdown_search", seed=8, **SMALL)
    assert _identity(a.problems("train")) == _identity(b.problems("train"))
    assert _identity(a.problems("test")) == _identity(b.problems("test"))
    assert _identity(a.problems("train")) != _identity(c.problems("train"))
    assert _identity(a.problems("test")) == _identity(c.problems("test"))  # test_seed, not seed
    assert a.sft_examples(60, seed=1) == b.sft_examples(60, seed=1)
    assert a.sft_examples(60, seed=1) != a.sft_examples(60, seed=2)
    p = a.problems("test")[0]
    assert a.solution(p) == b.solution(p)


def test_splits_are_disjoint_and_share_countdowns_identity():
    task = get_task("countdown_search", **SMALL)
    train, test = task.problems("train"), task.problems("test")
    assert len(train) == SMALL["train_size"] and len(test) == SMALL["test_size"]
    train_keys, test_keys = {task.key(p) for p in train}, {task.key(p) for p in test}
    assert len(train_keys) == len(train) and len(test_keys) == len(test)
    assert not train_keys & test_keys
    assert all(task.is_heldout(p) for p in test) and not any(task.is_heldout(p) for p in train)
    # the identity is countdown's: the same numbers and target are held out in both tasks
    countdown = get_task("countdown", num_numbers=4)
    p = test[0]
    assert task.key(p) == f"countdown:{','.join(map(str, sorted(p.answer['numbers'])))}:{p.answer['target']}"
    assert countdown.heldout_fraction == task.heldout_fraction


@pytest.mark.parametrize("k", [3, 4, 5, (3, 5)])
def test_problems_follow_the_options(k):
    task = get_task("countdown_search", num_numbers=k, train_size=60, test_size=20)
    counts = {len(p.answer["numbers"]) for p in task.problems("train")}
    assert counts == ({k} if isinstance(k, int) else {3, 4, 5})
    for p in task.problems("train"):
        numbers, target = p.answer["numbers"], p.answer["target"]
        assert all(1 <= n <= 20 for n in numbers) and 10 <= target <= 100
        assert target not in numbers
        assert task.score(task.solution(p), p) == 1.0  # every problem is solvable


@pytest.mark.parametrize(
    "options",
    [{"num_numbers": 2}, {"num_numbers": 6}, {"guide": (0.5, 0.5)}, {"max_value": 40},
     {"max_attempts": 0}, {"slip_rate": 0.0}],
)
def test_bad_options_are_value_errors(options):
    with pytest.raises(ValueError):
        get_task("countdown_search", **options)


# -- worked searches ------------------------------------------------------------------------


def test_every_generated_trace_is_parsed_and_verified():
    """Correct searches, searches with slips and given-up searches, checked step by step."""
    task = get_task("countdown_search", **SMALL)
    rng = random.Random(0)
    seen_slips = seen_recovered = 0
    for p in task.problems("train")[:120] + task.problems("test")[:40]:
        numbers, target = p.answer["numbers"], p.answer["target"]
        traces = [task.search(p, rng), task.search(p, rng, slip_rate=0.3), task.search(p, rng, give_up=True)]
        for trace in traces:
            text = trace.text
            assert format_reward(text) == 1.0
            attempts, slips = _check_by_hand(text, numbers)
            assert slips == trace.slips
            assert task.response_stats(text) == {"attempts": len(attempts)} and trace.attempts == len(attempts)
            assert 1 <= len(attempts) <= task.max_attempts
            validity = task.trace_validity(text, p)
            assert (validity == 1.0) == (slips == 0)
            assert (trace_validity(text) == 1.0) <= (validity == 1.0)  # the search check is stricter
            score = task.score(text, p)
            assert score == float(trace.solved)
            last = attempts[-1]
            hit = last[-1][3] == target
            assert text.split("</think>")[0].endswith(" x") != hit
            if slips == 0:
                # the answer is the last attempt's expression; it makes the target iff the attempt hit
                assert evaluate(split_layout(text)[1]).value == last[-1][3]
                assert score == float(hit)
                assert all(a[-1][3] != target for a in attempts[:-1])  # earlier attempts all missed
            else:
                seen_slips += 1
                seen_recovered += score == 1.0
        assert traces[0].slips == 0 and traces[2].slips == 0
    assert seen_slips > 30 and seen_recovered > 0  # a search can recover from a slip


def test_worked_solutions_by_flaw():
    task = get_task("countdown_search", **SMALL)
    rng = random.Random(1)
    problems = task.problems("train")[:100]
    for p in problems:
        correct = task.worked_solution(p, None, rng)
        assert task.score(correct, p) == 1.0 and task.trace_validity(correct, p) == 1.0
        assert task.score(task.worked_solution(p, "wrong_answer", rng), p) == 0.0
    slipped = [task.worked_solution(p, "wrong_step", rng) for p in problems]
    assert all(task.trace_validity(t, p) < 1.0 for t, p in zip(slipped, problems, strict=True))
    assert 0 < statistics.mean(task.score(t, p) for t, p in zip(slipped, problems, strict=True)) < 1
    with pytest.raises(ValueError, match="flaw"):
        task.worked_solution(problems[0], "typo")


def test_sft_examples_mix_and_lengths():
    from pivotrl.modeling.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    task = get_task("countdown_search", **SMALL)
    examples = task.sft_examples(600, seed=0)
    flawed = [e for e in examples if e.flaw is not None]
    assert 0.25 < len(flawed) / len(examples) < 0.35
    wrong = sum(task.score(e.response, e.problem) == 0.0 for e in examples) / len(examples)
    assert 0.1 < wrong < 0.35  # some wrong final answers, most right
    lengths = [len(tok(e.response, add_special_tokens=False)["input_ids"]) for e in examples]
    assert 60 <= statistics.median(lengths) <= 200
    assert max(lengths) <= 224  # the recipe's max_new_tokens
    attempts = [task.response_stats(e.response)["attempts"] for e in examples]
    assert 2.0 <= statistics.mean(attempts) <= 5.0
    assert 0.15 < attempts.count(1) / len(attempts) < 0.5  # first-try successes exist, as a minority
    assert all(tok.unk_token_id not in tok(e.prompt + e.response)["input_ids"] for e in examples)


def test_the_first_choice_is_uncertain_and_biased_to_good_moves():
    task = get_task("countdown_search", **SMALL)
    rng = random.Random(2)
    good_share, uniform_share, distinct = [], [], []
    for p in task.problems("train")[:60]:
        numbers, target = p.answer["numbers"], p.answer["target"]
        state = tuple(sorted(numbers))
        moves = legal_moves(state, task.max_value)
        good = {f"{a}{op}{b}={v}" for a, op, b, v, _ in winning_moves(state, target, task.max_value)}
        firsts = [task.search(p, rng).text.removeprefix("<think>").split(",")[0].split("<")[0]
                  for _ in range(20)]
        good_share.append(sum(f in good for f in firsts) / len(firsts))
        uniform_share.append(len(good) / len(moves))
        distinct.append(len(set(firsts)))
    assert statistics.mean(good_share) > statistics.mean(uniform_share) + 0.1  # biased to good moves
    assert statistics.mean(good_share) < 0.8  # ... but far from certain
    assert statistics.median(distinct) >= 4  # a real fork: the first move varies between draws


# -- search trace validity and attempts --------------------------------------------------------


def test_search_steps_check_arithmetic_and_available_numbers():
    numbers = [20, 13, 3, 4]
    assert search_steps("20+13=33,33*3=99,99-4=95 x\n20-13=7,7*3=21,21+4=25", numbers) == [True] * 6
    # a slip: the step is wrong, the steps after it that use the written value are fine
    assert search_steps("20+13=34,34*3=102", numbers) == [False, True]
    # a number that is not there, or used twice, or a result of another attempt
    assert search_steps("20+5=25", numbers) == [False]
    assert search_steps("20+13=33,20+3=23", numbers) == [True, False]
    assert search_steps("20+13=33 x\n33+3=36", numbers) == [True, False]
    assert search_steps("3+3=6", [3, 3, 4]) == [True]
    # the generic check sees only the arithmetic
    assert trace_validity("<think>20+5=25</think><answer>20</answer>") == 1.0
    assert search_trace_validity("<think>20+5=25</think><answer>20</answer>", numbers) == 0.0
    assert search_trace_validity("<think>no steps</think><answer>20</answer>", numbers) is None
    assert search_trace_validity("<think>20+13=33", numbers) is None  # not closed
    assert search_trace_validity(None, numbers) is None  # type: ignore[arg-type]


def test_attempt_counts():
    task = get_task("countdown_search", **SMALL)
    assert search_attempts("<think>20+13=33,33*3=99 x\n20-13=7,7*3=21,21+4=25</think><answer>1</answer>") == [
        "20+13=33,33*3=99 x", "20-13=7,7*3=21,21+4=25"]
    # cut off by the length limit: the attempts written so far, a started one included
    assert task.response_stats("<think>20+13=33,33*3=99 x\n20-1")["attempts"] == 1
    assert task.response_stats("<think>20+13=33,33*3=99 x\n20-13=7,")["attempts"] == 2
    assert task.response_stats("<answer>20</answer>") == {"attempts": 0}
    assert task.response_stats("<think></think><answer>20</answer>") == {"attempts": 0}
    assert search_attempts(None) == []  # type: ignore[arg-type]
    # other tasks count nothing
    assert get_task("countdown").response_stats("<think>1+1=2</think>") == {}


def test_evaluation_reports_mean_attempts(tmp_path):
    from pivotrl.evaluation import evaluate_policy
    from pivotrl.modeling.tiny import build_tiny_model
    from pivotrl.modeling.tokenizer import build_char_tokenizer
    from pivotrl.rollout.hf import HFEngine

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=0, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=2, intermediate_size=32).eval()
    engine = HFEngine(model, tok)
    task = get_task("countdown_search", **SMALL)
    problems = task.problems("test")[:6]
    result = evaluate_policy(engine, task, problems, prompts=[task.format_prompt(p) for p in problems],
                             samples_per_problem=2, max_new_tokens=8, samples_path=tmp_path / "s.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert len(rows) == 12
    assert result["mean_attempts"] == pytest.approx(
        statistics.mean(task.response_stats(r["completion"])["attempts"] for r in rows))
    countdown = get_task("countdown", **SMALL)
    plain = evaluate_policy(engine, countdown, countdown.problems("test")[:2],
                            prompts=[countdown.format_prompt(p) for p in countdown.problems("test")[:2]],
                            max_new_tokens=4)
    assert not any(k.startswith("mean_") and k != "mean_length" for k in plain)


def test_the_search_job_reports_attempts_before_and_after(tmp_path):
    """`pivotrl train --config configs/search.yaml`, cut short: the shipped search policy
    trains, and the before/after table and summary.json carry attempts per response."""
    from cli_helpers import pivotrl

    from pivotrl.train.recipes import recipe_path

    out = tmp_path / "run"
    proc = pivotrl("train", "--config", str(recipe_path("search")), "-o", str(out), "train.max_steps=1",
                   "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=64",
                   "eval.num_problems=6", "eval.every=0", "checkpoint.every=0", "log.progress=false")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "attempts per response" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    for when in ("before", "after"):
        assert 0.0 <= summary[f"mean_attempts_{when}"] <= 64
        assert 0.0 <= summary[f"heldout_accuracy_{when}"] <= 1.0
