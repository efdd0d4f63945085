"""Free choices (filler words) in countdown and countdown_search, countdown_free, and Task.token_marks."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pivotrl.modeling.tokenizer import build_char_tokenizer
from pivotrl.rewards import format_reward, search_attempts, search_trace_validity, trace_validity
from pivotrl.rewards.template import split_layout
from pivotrl.tasks import TASKS, Problem, Task, get_task
from pivotrl.tasks.free import (
    FILLER_CHARACTERS,
    FILLER_FORMS,
    FILLER_LETTERS,
    FILLER_WORDS,
    free_characters,
    insert_fillers,
)
from pivotrl.tasks.moves import can_reach, pair_results

SMALL = {"train_size": 200, "test_size": 60}
TOKENIZER = build_char_tokenizer()
#: the characters the trace and answer grammar uses
GRAMMAR = set("0123456789+-*/=();,\n") | {"x"}


def pieces_of(text: str) -> list[str]:
    """The pieces the char tokenizer cuts ``text`` into, with the ``<eos>`` a sample ends with (decoded: "")."""
    ids = TOKENIZER(text, add_special_tokens=False)["input_ids"] + [TOKENIZER.eos_token_id]
    return [TOKENIZER.decode([i], skip_special_tokens=True) for i in ids]


def strip_free(text: str) -> str:
    return "".join(c for c, free in zip(text, free_characters(text), strict=True) if not free)


def tasks_with_fillers():
    return [get_task("countdown_free", **SMALL), get_task("countdown_search", free=3, **SMALL)]


# -- the vocabulary -----------------------------------------------------------------------


def test_filler_vocabulary_is_disjoint_from_the_grammar():
    assert len(FILLER_WORDS) == 16
    assert len({w[0] for w in FILLER_FORMS}) == len(FILLER_FORMS) == 32  # the first letter decides
    assert all(set(w) <= FILLER_LETTERS for w in FILLER_FORMS)
    assert not FILLER_CHARACTERS & GRAMMAR
    assert "X" not in FILLER_CHARACTERS


def test_bad_levels_are_value_errors():
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="free"):
            get_task("countdown", free=bad)
        with pytest.raises(ValueError, match="free"):
            get_task("countdown_search", free=bad)
    with pytest.raises(ValueError, match="free"):
        get_task("arithmetic", free=2)  # only the countdown tasks have free choices


# -- free off: nothing changes ------------------------------------------------------------------

#: sha256 of every output below, recorded before the option existed (branch `free`, bb58f48)
BEFORE = {
    ("countdown", "{}"): "b010a774d5913e50b705b13ec30f86b5e3f5fcdc6d41117f15678c1e970e5697",
    ("countdown", '{"num_numbers": 4}'): "5c2be93ef91449f6f0fc7e103c1eb2631ef4010080fb8b21809a8c3c8333d483",
    ("countdown_search", "{}"): "5965202647db7930741f4bcbbe607996f046cdfcb84543fe6931c214289cc97c",
    ("countdown_search", '{"num_numbers": 3}'): "283177ddf84d2df128265a56df11a7eadf5510c7ae3ab9270771f8fe57dece8d",
}


def _outputs_digest(name: str, **options) -> str:
    """Problems (with metadata), prompts, solutions, worked solutions of every flaw and sft examples."""
    task = get_task(name, train_size=60, test_size=30, **options)
    digest = hashlib.sha256()

    def add(value):
        digest.update(json.dumps(value, sort_keys=True).encode())
        digest.update(b"\0")

    rng = random.Random(5)
    for split in ("train", "test"):
        for p in task.problems(split):
            add([p.prompt, p.answer, p.meta, task.format_prompt(p), task.solution(p)])
            for flaw in (None, "wrong_step", "wrong_answer"):
                add(task.worked_solution(p, flaw, rng))
                add(task.worked_solution(p, flaw))
    for e in task.sft_examples(80, seed=3):
        add([e.prompt, e.response, e.flaw, e.problem.prompt])
    add([task.max_new_tokens, task.instruction, task.template])
    return digest.hexdigest()


@pytest.mark.parametrize(("name", "options"), list(BEFORE), ids=[f"{n}-{o}" for n, o in BEFORE])
@pytest.mark.parametrize("free", [None, 0])
def test_free_off_outputs_are_byte_for_byte_as_before(name, options, free):
    extra = {} if free is None else {"free": free}
    assert _outputs_digest(name, **json.loads(options), **extra) == BEFORE[(name, options)]


def test_free_off_marks_have_no_free():
    for task in (get_task("countdown", **SMALL), get_task("countdown_search", **SMALL)):
        p = task.problems("test")[0]
        marks = task.token_marks(pieces_of(task.solution(p)), p)
        assert set(marks) == {"reachable"}
    assert Task.token_marks(get_task("arithmetic"), ["1"], Problem("q", 1)) == {}
    assert get_task("linear").token_marks(["1"], Problem("q", 1)) == {}


# -- worked solutions with fillers ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["countdown_free", "countdown_search"])
def test_worked_solutions_are_the_ones_without_fillers_with_slots_put_in(name):
    options = {"free": 3} if name == "countdown_search" else {}
    with_free = get_task(name, **SMALL, **options)
    without = get_task(name, **SMALL, free=0)
    assert with_free.problems("test") == without.problems("test")
    assert with_free.problems("train") == without.problems("train")
    for p in with_free.problems("test")[:30]:
        assert with_free.format_prompt(p) == without.format_prompt(p)
        assert strip_free(with_free.solution(p)) == without.solution(p)
        for flaw in ("wrong_step", "wrong_answer"):
            assert strip_free(with_free.worked_solution(p, flaw, random.Random(9))) == without.worked_solution(
                p, flaw, random.Random(9))
    # the sft stream too: same problems, flaws and traces, in the same order
    pairs = zip(with_free.sft_examples(300, seed=2), without.sft_examples(300, seed=2), strict=True)
    for a, b in pairs:
        assert (a.prompt, a.flaw, strip_free(a.response)) == (b.prompt, b.flaw, b.response)
        assert a.response != b.response


def test_slots_come_before_every_step():
    task = get_task("countdown_search", free=2, **SMALL)
    for p in task.problems("train")[:40]:
        think = split_layout(task.solution(p))[0]
        for line in think.split("\n"):
            for step in line.removesuffix(" x").split(", "):
                assert re.fullmatch(r"([A-Za-wyzA-WYZ]+ ){0,1}[A-Za-wyzA-WYZ]+: \d+[-+*/]\d+=\d+", step), step
    task = get_task("countdown_free", **SMALL)
    for p in task.problems("train")[:40]:
        think = split_layout(task.solution(p))[0]
        assert re.fullmatch(r"([A-Za-z]+ ){0,5}[A-Za-z]+: \S+; ([A-Za-z]+ ){0,5}[A-Za-z]+: \S+", think), think


def test_filler_choices_are_uniform():
    """The first letter (word and case) and the slot's length are uniform: log 32 and log 6 nats."""
    rng = random.Random(0)
    firsts, counts = Counter(), Counter()
    for _ in range(4000):
        text = insert_fillers("<think>1+2=3</think><answer>1+2</answer>", rng, 6, ";")
        slot = text.removeprefix("<think>").split(":")[0].split(" ")
        counts[len(slot)] += 1
        firsts.update(w[0] for w in slot)

    def entropy(counter):
        total = sum(counter.values())
        return -sum(c / total * math.log(c / total) for c in counter.values())

    assert set(counts) == set(range(1, 7)) and entropy(counts) == pytest.approx(math.log(6), abs=0.01)
    assert len(firsts) == 32 and entropy(firsts) == pytest.approx(math.log(32), abs=0.01)


def test_fillers_do_not_change_any_score():
    """Resampling the fillers of a worked solution (correct or flawed) leaves the reward, the format,
    the trace checks and the attempt count exactly as they are without fillers."""
    for task in tasks_with_fillers():
        rng = random.Random(1)
        for p in task.problems("train")[:40] + task.problems("test")[:20]:
            for flaw in (None, "wrong_step", "wrong_answer"):
                bare = strip_free(task.worked_solution(p, flaw, rng))
                expected = (task.score(bare, p), format_reward(bare), trace_validity(bare),
                            task.trace_validity(bare, p), search_trace_validity(bare, p.answer["numbers"]),
                            len(search_attempts(bare)), task.response_stats(bare))
                if flaw is None:
                    assert expected[0] == 1.0
                for level in (1, 2, 6):
                    for _ in range(8):
                        text = insert_fillers(bare, rng, level, task.free_separators)
                        assert text != bare
                        assert (task.score(text, p), format_reward(text), trace_validity(text),
                                task.trace_validity(text, p), search_trace_validity(text, p.answer["numbers"]),
                                len(search_attempts(text)), task.response_stats(text)) == expected, text


def test_a_decisive_token_changes_the_reward():
    """One digit or one operator of the answer expression of a correct solution with fillers: reward 0."""
    from pivotrl.rewards import evaluate

    for task in tasks_with_fillers():
        for p in task.problems("test")[:40]:
            text = task.solution(p)
            assert task.score(text, p) == 1.0
            start = text.index("<answer>") + len("<answer>")
            answer = text[start : text.index("</answer>")]
            numbers = {str(n) for n in p.answer["numbers"]}
            # a digit: the first literal becomes a number the problem does not have
            first = re.match(r"\(*(\d+)", answer)
            at = first.start(1)
            new_digit = next(d for d in "0123456789" if d != answer[at]
                             and str(int(d + first.group(1)[1:])) not in numbers)
            changed = text[: start + at] + new_digit + text[start + at + 1 :]
            assert task.score(changed, p) == 0.0, changed
            # an operator: another one that changes the expression's value
            op_at = next(i for i, c in enumerate(answer) if c in "+-*/")
            for op in "+-*/":
                other = answer[:op_at] + op + answer[op_at + 1 :]
                try:
                    differs = evaluate(other).value != p.answer["target"]
                except ValueError:
                    differs = True
                if op != answer[op_at] and differs:
                    break
            changed = text[: start + op_at] + op + text[start + op_at + 1 :]
            assert task.score(changed, p) == 0.0, changed


# -- token marks: free ------------------------------------------------------------------------------


def test_free_marks_exactly_the_filler_characters_of_a_worked_solution():
    for task in tasks_with_fillers():
        bare_task = get_task(task.name, **SMALL, free=0)
        rng = random.Random(3)
        for p in task.problems("train")[:60]:
            for flaw in (None, "wrong_step", "wrong_answer"):
                seed = rng.random()
                text = task.worked_solution(p, flaw, random.Random(seed))
                pieces = pieces_of(text)
                marks = task.token_marks(pieces, p)
                assert len(marks["free"]) == len(marks["reachable"]) == len(pieces)
                free_text = "".join(c for c, f in zip(pieces, marks["free"], strict=True) if f)
                rest = "".join(c for c, f in zip(pieces, marks["free"], strict=True) if not f)
                assert set(free_text) <= FILLER_CHARACTERS
                # what is not free is the same draw without fillers, to the byte
                assert rest == bare_task.worked_solution(p, flaw, random.Random(seed))
                assert not any(f for c, f in zip(pieces, marks["free"], strict=True) if len(c) != 1)


def test_free_marks_on_hand_written_responses():
    task = get_task("countdown_search", free=2)
    p = Problem("Use 8 3 5 2 to make 26.", {"numbers": [8, 3, 5, 2], "target": 26})
    cases = {
        # the abandon marker ` x` is not free; the slot after the newline is
        "<think>so: 8+3=11 x\nNow: 8*3=24</think>": "-ffff" + "-" * 9 + "fffff" + "-" * 7,
        # letters outside the think block, and runs without a letter, are not free
        "ok <think> : 8+3=11, hm 24</think><answer>ok</answer>": "-" * 14 + "ffff" + "-" * 7,
        # not closed: the think block runs to the end
        "<think>8*3=24, right al": "-" * 8 + "f" * 9,
        "": "",
    }
    for text, expected in cases.items():
        pieces = pieces_of(text)[:-1] if text else []
        marks = task.token_marks(pieces, p)
        assert "".join("f" if f else "-" for f in marks["free"]) == expected, text


# -- token marks: reachable -------------------------------------------------------------------------


def _reach(task, text, numbers, target):
    pieces = pieces_of(text)
    marks = task.token_marks(pieces, Problem("q", {"numbers": numbers, "target": target}))
    return "".join("R" if r else "." for r in marks["reachable"])


def _check(task, numbers, target, *segments, eos):
    """The reachable marks of the text the segments make: each (text, mark) gives its mark
    ("R" reachable, "." not) to the tokens of its text; `eos` is the mark of the final <eos>."""
    text = "".join(t for t, _ in segments)
    expected = "".join(mark * (len(pieces_of(t)) - 1) for t, mark in segments) + eos
    assert _reach(task, text, numbers, target) == expected, text


def test_reachable_on_countdown_by_hand():
    task = get_task("countdown_free")
    n, t = [3, 5, 7], 22
    # 5*3=15 leaves 15 7, 15+7=22 leaves 22: reachable throughout, fillers too
    _check(task, n, t, ("<think>so: 5*3=15; ok: 15+7=22</think><answer>5*3+7</answer>", "R"), eos="R")
    # 5+3=8 leaves 8 7, from which 22 cannot be made; the step's own tokens, the last digit of
    # its result included, are written in the state before it
    _check(task, n, t, ("<think>5+3=8", "R"), (";8+7=15</think><answer>5+3+7</answer>", "."), eos=".")
    # a slip: the written value is what is left (5*3=14 leaves 14 7: no 22)
    _check(task, n, t, ("<think>5*3=14", "R"), (";14+7=21", "."), eos=".")
    # a slip may also keep it within reach: 3+2=6 (it is 5) leaves 6 5, and 6*5=30
    _check(task, [3, 5, 2], 15, ("<think>3+2=6", "R"), (";6*5=30", "."), eos=".")
    _check(task, [3, 5, 2], 30, ("<think>3+2=6", "R"), (";6*5=30", "R"), eos="R")
    # a number the state does not hold kills it for good, even when a later step hits
    _check(task, n, t, ("<think>5*4=20", "R"), (";20+2=22</think><answer>20+2</answer>", "."), eos=".")
    # a number used twice is not held twice
    _check(task, n, t, ("<think>5*5=25", "R"), (";25-3=22", "."), eos=".")
    # a step whose left side does not evaluate: dead
    _check(task, n, t, ("<think>5*/3=15", "R"), (";15+7=22", "."), eos=".")
    # countdown has no attempts: a new line does not start again (5 and 3 are gone)
    _check(task, n, t, ("<think>5+3=8", "R"), ("\n5*3=15;15+7=22", "."), eos=".")
    # a step cut off before its result changes nothing; neither does text that is not a step
    _check(task, n, t, ("<think>5*3=", "R"), eos="R")
    _check(task, n, t, ("5+3=8 <answer>5+3</answer>", "R"), eos="R")
    # no upper bound on countdown's results: 6*18=108, then 108/4=27
    _check(task, [4, 6, 18], 27, ("<think>6*18=108", "R"), eos="R")
    # the target among the numbers left is reached; a written 0 or fraction combines with nothing
    _check(task, [3, 4, 9], 9, ("<think>4-3=1", "R"), eos="R")
    _check(task, [7, 7, 2], 2, ("<think>7-7=0", "R"), eos="R")
    _check(task, [7, 7, 2], 5, ("<think>7-7=0", "R"), eos=".")
    _check(task, [7, 2, 2], 7, ("<think>7/2=3.5", "R"), (";3.5*2", "."), eos=".")
    # the answer and what follows have the state the think block ended in
    _check(task, n, t, ("<think>5+3=8", "R"), ("</think><answer>5*3+7</answer>", "."), eos=".")


def test_reachable_on_countdown_search_by_hand():
    task = get_task("countdown_search")
    n, t = [8, 3, 5, 2], 26
    # a dead end (8+3=11 leaves 11 5 2: 26 cannot be made), given up; the token after the
    # newline starts again from all the numbers
    _check(task, n, t, ("<think>8+3=11", "R"), (",11*2=22,22+5=27 x\n", "."),
           ("8*3=24,24+2=26</think><answer>8*3+2</answer>", "R"), eos="R")
    # a number the problem does not have (4) kills the attempt, not the next one
    _check(task, n, t, ("<think>8+4=12", "R"), (",12*2=24 x\n", "."),
           ("8*3=24,24+2=26</think><answer>8*3+2</answer>", "R"), eos="R")
    # the results of another attempt are not held: 24 came from the first line
    _check(task, n, t, ("<think>8*3=24 x\n24+2=26", "R"), eos=".")
    # with fillers, the tokens that are not free have the marks of the same response without them
    free_task = get_task("countdown_search", free=2)
    text = "<think>so: 8+3=11, ok: 11*2=22 x\nNow: 8*3=24, Just: 24+2=26</think><answer>8*3+2</answer>"
    marks = _reach(free_task, text, n, t)
    free = free_task.token_marks(pieces_of(text), Problem("q", {"numbers": n, "target": t}))["free"]
    assert "".join(m for m, f in zip(marks, free, strict=True) if not f) == _reach(
        task, "<think>8+3=11,11*2=22 x\n8*3=24,24+2=26</think><answer>8*3+2</answer>", n, t)
    # this task's moves stop at max_value (100): 27 needs 6*18=108 first
    _check(task, [4, 6, 18], 27, ("", "."), eos=".")
    _check(get_task("countdown"), [4, 6, 18], 27, ("", "R"), eos="R")


def test_worked_solutions_stay_reachable_until_they_miss():
    """A correct worked solution's every token is reachable; a given-up countdown_search attempt
    turns unreachable at the latest at the step that ends it (it misses with no numbers left)."""
    for task in tasks_with_fillers():
        for p in task.problems("test")[:40]:
            pieces = pieces_of(task.solution(p))
            marks = task.token_marks(pieces, p)
            if task.name == "countdown_free":
                assert all(marks["reachable"])
            else:
                text = ""
                for piece, reach in zip(pieces, marks["reachable"], strict=True):
                    text += piece
                    if text.endswith(" x"):
                        assert not reach, text
                assert marks["reachable"][-1]


# -- token marks: any text ---------------------------------------------------------------------

_ALPHABET = st.sampled_from(
    ["<think>", "</think>", "<answer>", "</answer>", "0", "1", "2", "3", "5", "7", "9", "+", "-", "*",
     "/", "=", "(", ")", ";", ",", "\n", " ", " x", "x", ".", ":", "so", "Now", "q", "%", "é", ""])


@settings(max_examples=300, deadline=None)
@given(st.lists(_ALPHABET, max_size=60), st.integers(0, 2))
def test_token_marks_never_raise_on_any_text(pieces, which):
    task = [get_task("countdown_free"), get_task("countdown_search", free=2), get_task("countdown")][which]
    problem = Problem("q", {"numbers": [3, 5, 7, 2], "target": 22})
    marks = task.token_marks(pieces, problem)
    assert set(marks) == ({"reachable"} if which == 2 else {"free", "reachable"})
    assert all(len(m) == len(pieces) for m in marks.values())
    assert all(isinstance(v, bool) for m in marks.values() for v in m)
    for piece, free in zip(pieces, marks.get("free", [False] * len(pieces)), strict=True):
        assert not free or (piece and set(piece) <= FILLER_CHARACTERS)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.lists(st.integers(0, 200), max_size=20))
def test_token_marks_of_random_strings_cut_anywhere(text, cuts):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    for task in (get_task("countdown_free"), get_task("countdown_search", free=1)):
        marks = task.token_marks(pieces, Problem("q", {"numbers": [8, 3, 5], "target": 19}))
        assert all(len(m) == len(pieces) for m in marks.values())


# -- countdown_free -------------------------------------------------------------------------------


def test_countdown_free_is_registered_and_holds_out_countdowns_problems():
    assert "countdown_free" in TASKS
    free, plain = get_task("countdown_free"), get_task("countdown")
    assert free.free == 6 and free.num_numbers == (3, 3)
    assert free.max_new_tokens != plain.max_new_tokens
    assert [free.key(p) for p in free.problems("test")] == [plain.key(p) for p in plain.problems("test")]
    assert [p.prompt for p in free.problems("train", limit=500)] == [
        p.prompt for p in plain.problems("train", limit=500)]
    assert get_task("countdown_free", free=0).solution(free.problems("test")[0]) == plain.solution(
        plain.problems("test")[0])


def test_countdown_free_budget_holds_every_worked_solution():
    task = get_task("countdown_free", train_size=3000)
    lengths = [len(pieces_of(e.response)) for e in task.sft_examples(3000, seed=0)]
    assert max(lengths) < task.max_new_tokens
    assert 55 < sum(lengths) / len(lengths) < 85  # short enough to train fast
    # the longest a worked solution can be: countdown's longest and two slots of six 7-letter words
    assert 35 + 49 + 50 < task.max_new_tokens
    shares = [sum(task.token_marks(pieces_of(e.response), e.problem)["free"]) / len(pieces_of(e.response))
              for e in task.sft_examples(300, seed=0)]
    assert sum(shares) / len(shares) > 0.5  # most tokens are free


def test_moves_without_a_bound():
    assert pair_results(30, 29, None) == [("+", 59), ("-", 1), ("*", 870)]
    assert pair_results(30, 29, 100) == [("+", 59), ("-", 1)]
    assert can_reach([3, 5, 7], 22, None) and can_reach([22], 22, None) and not can_reach([], 1, None)
    assert can_reach([30, 29, 30], 870 + 30, None) and not can_reach([30, 29, 30], 870 + 30, 100)


# -- the measurement ---------------------------------------------------------------------------------


def test_free_entropy_of_the_heldout_responses():
    """FreeEntropy sums the policy's entropy over the free tokens of the very responses the held-out
    evaluation scores; by hand on a batch of two samples per problem."""
    import torch

    from pivotrl.analysis.free_share import FreeEntropy
    from pivotrl.evaluation import evaluate_heldout
    from pivotrl.modeling.tiny import build_tiny_model
    from pivotrl.rollout.forward import response_logprobs
    from pivotrl.rollout.hf import HFEngine

    model = build_tiny_model(TOKENIZER, seed=0, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=2, intermediate_size=32).eval()
    task = get_task("countdown_free", test_size=6)
    free = FreeEntropy(model, TOKENIZER, task)
    res = evaluate_heldout(model, TOKENIZER, task, n=6, max_new_tokens=24, batch_size=4, on_batch=free.add)
    shares = free.result()
    assert shares["responses"] == 6 and shares["mean_length"] == pytest.approx(res["mean_length"])
    assert 0.0 <= shares["free_token_share"] <= 1.0 and 0.0 <= shares["free_entropy_share"] <= 1.0
    # by hand: a worked solution forced as the prefix makes free tokens certain to appear
    problems = task.problems("test")[:3]
    prompts = [task.format_prompt(p) + task.solution(p)[:20] for p in problems]
    rollout = HFEngine(model, TOKENIZER).generate(prompts, 2, max_new_tokens=12,
                                                  generator=torch.Generator().manual_seed(1))
    free = FreeEntropy(model, TOKENIZER, task)
    free.add(rollout, problems)
    with torch.no_grad():
        _, entropies = response_logprobs(model, rollout)
    total = on_free = 0.0
    for row in range(6):
        length = int(rollout.response_mask[row].sum())
        pieces = [TOKENIZER.decode([i], skip_special_tokens=True) for i in rollout.response_ids[row, :length].tolist()]
        marks = task.token_marks(pieces, problems[row // 2])["free"]
        total += float(entropies[row, :length].sum())
        on_free += sum(float(h) for h, f in zip(entropies[row, :length], marks, strict=True) if f)
    assert free.result()["free_entropy_share"] == pytest.approx(on_free / total, rel=1e-5)
    with pytest.raises(ValueError, match="no free choices"):
        FreeEntropy(model, TOKENIZER, get_task("countdown", test_size=6))


@pytest.mark.parametrize("name,options", [("countdown", {"free": 3}), ("countdown_free", {}),
                                          ("countdown_search", {"free": 2})])
def test_every_worked_solution_fits_the_tasks_response_length(name: str, options: dict) -> None:
    """A response cut off by its budget would make fillers matter: the task's length holds its longest solution."""
    from pivotrl.modeling.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    task = get_task(name, train_size=200, **options)
    longest = max(len(tokenizer(e.response, add_special_tokens=False)["input_ids"]) + 1  # + <eos>
                  for e in task.sft_examples(200))
    assert longest <= task.max_new_tokens
    assert get_task("countdown").max_new_tokens == 34 and get_task("countdown_search").max_new_tokens == 224
