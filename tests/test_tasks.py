"""Tasks: registry, synthetic generators (seeds, splits, worked solutions), file/benchmark loaders."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import sys
import types

import pytest

from pivotrl.rewards import format_reward, trace_validity
from pivotrl.tasks import (
    FLAWS,
    TASKS,
    Problem,
    ProblemList,
    Task,
    benchmarks_dir,
    get_task,
    gsm8k_answer,
    normalize_split,
    register_task,
)

SMALL = {"train_size": 300, "test_size": 200}
SYNTHETIC = [
    ("countdown", {}),
    ("countdown", {"num_numbers": 4, "exact_use": True}),
    ("countdown", {"num_numbers": (3, 4), "number_range": (1, 50), "ops": "+-*"}),
    ("arithmetic", {}),
    ("arithmetic", {"num_operands": 5, "ops": "+-*/"}),
    ("linear", {}),
]
IDS = [f"{name}-{i}" for i, (name, _) in enumerate(SYNTHETIC)]


def _identity(problems):
    return [(p.prompt, json.dumps(p.answer, sort_keys=True)) for p in problems]


# -- registry ----------------------------------------------------------------------


def test_registry_lists_the_tasks():
    for name in (
        "countdown",
        "arithmetic",
        "linear",
        "gsm8k",
        "math500",
        "aime24",
        "amc23",
        "file",
        "hub",
    ):
        assert name in TASKS


def test_unknown_task_names_the_known_ones():
    with pytest.raises(KeyError, match="countdown"):
        get_task("no-such-task")


def test_register_task_and_get_task_with_options():
    @register_task("unit-test-echo")
    class Echo(Task):
        def __init__(self, *, n: int = 2, **options):
            super().__init__(verifier=lambda c, a: float(c.strip() == a), **options)
            self.n = n

        def _load(self, split):
            return ProblemList([Problem(f"say {i}", str(i)) for i in range(self.n)], source="echo")

    try:
        task = get_task("unit-test-echo", n=3, template="Q: {prompt}\nA:")
        assert task.name == "unit-test-echo"
        probs = task.problems("heldout")
        assert len(probs) == 3 and probs.source == "echo" and probs.skipped == 0
        assert task.format_prompt(probs[1]) == "Q: say 1\nA:"
        assert task.score(" 1 ", probs[1]) == 1.0
        with pytest.raises(ValueError, match="already registered"):
            register_task("unit-test-echo")(type("Other", (Task,), {}))
    finally:
        TASKS.pop("unit-test-echo", None)


def test_split_names():
    assert normalize_split("train") == "train"
    for alias in ("test", "heldout", "held-out", "eval", "validation", "Val"):
        assert normalize_split(alias) == "test"
    with pytest.raises(ValueError, match="split"):
        normalize_split("banana")


def test_problem_is_frozen():
    p = Problem("q", 1, {"k": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.prompt = "other"  # type: ignore[misc]


# -- synthetic generators ------------------------------------------------------------


@pytest.mark.parametrize(("name", "opts"), SYNTHETIC, ids=IDS)
def test_generators_are_deterministic_by_seed(name, opts):
    a = get_task(name, seed=7, **SMALL, **opts)
    b = get_task(name, seed=7, **SMALL, **opts)
    c = get_task(name, seed=8, **SMALL, **opts)
    assert _identity(a.problems("train")) == _identity(b.problems("train"))
    assert _identity(a.problems("test")) == _identity(b.problems("test"))
    assert _identity(a.problems("train")) != _identity(c.problems("train"))
    # the held-out set follows test_seed, not the training seed
    assert _identity(a.problems("test")) == _identity(c.problems("test"))
    assert a.sft_examples(50, seed=1) == b.sft_examples(50, seed=1)


@pytest.mark.parametrize(("name", "opts"), SYNTHETIC, ids=IDS)
def test_train_and_heldout_are_disjoint(name, opts):
    task = get_task(name, **SMALL, **opts)
    train, test = task.problems("train"), task.problems("test")
    assert len(train) == SMALL["train_size"] and len(test) == SMALL["test_size"]
    train_keys = {task.key(p) for p in train}
    test_keys = {task.key(p) for p in test}
    assert len(train_keys) == len(train) and len(test_keys) == len(test)  # no duplicates
    assert not train_keys & test_keys
    assert all(task.is_heldout(p) for p in test)
    assert not any(task.is_heldout(p) for p in train)
    # another training seed never reaches the held-out set either
    other = get_task(name, seed=123, **SMALL, **opts)
    assert not {other.key(p) for p in other.problems("train")} & test_keys


def test_countdown_problems_follow_the_options():
    task = get_task(
        "countdown", num_numbers=(3, 4), number_range=(2, 9), target_range=(10, 60), **SMALL
    )
    sizes = set()
    for p in task.problems("train") + task.problems("test"):
        nums, target = p.answer["numbers"], p.answer["target"]
        sizes.add(len(nums))
        assert all(2 <= n <= 9 for n in nums) and 10 <= target <= 60
        assert p.prompt == f"Use {' '.join(map(str, nums))} to make {target}."
    assert sizes == {3, 4}


def test_default_heldout_size_is_large():
    task = get_task("countdown")
    assert task.test_size >= 2000
    assert len(task.problems("test")) == task.test_size


@pytest.mark.parametrize(("name", "opts"), SYNTHETIC, ids=IDS)
def test_worked_solutions_score_one_unless_made_imperfect(name, opts):
    task = get_task(name, **SMALL, **opts)
    for p in task.problems("train")[:150] + task.problems("test")[:150]:
        solution = task.solution(p)
        assert task.score(solution, p) == 1.0, (p, solution)
        assert format_reward(solution) == 1.0
        assert trace_validity(solution) == 1.0
    rng = random.Random(0)
    for p in task.problems("train")[:100]:
        wrong_answer = task.worked_solution(p, "wrong_answer", rng)
        assert format_reward(wrong_answer) == 1.0
        assert task.score(wrong_answer, p) == 0.0, (p, wrong_answer)
        wrong_step = task.worked_solution(p, "wrong_step", rng)
        assert format_reward(wrong_step) == 1.0
        if name == "countdown":
            # a slip in the reasoning, but the final expression is the right one
            assert task.score(wrong_step, p) == 1.0
            assert trace_validity(wrong_step) < 1.0
        else:
            assert task.score(wrong_step, p) == 0.0, (p, wrong_step)


@pytest.mark.parametrize(
    ("name", "opts"),
    SYNTHETIC[:1] + SYNTHETIC[3:4] + SYNTHETIC[5:],
    ids=["countdown", "arithmetic", "linear"],
)
def test_sft_examples_are_imperfect_at_the_asked_rate(name, opts):
    task = get_task(name, **SMALL, **opts)
    examples = task.sft_examples(2000, seed=0, imperfect=0.3)
    flawed = [e for e in examples if e.flaw is not None]
    assert 0.25 < len(flawed) / len(examples) < 0.35
    assert {e.flaw for e in flawed} == set(FLAWS)
    for e in examples[:300]:
        assert e.prompt == task.format_prompt(e.problem)
        ok = task.score(e.response, e.problem)
        if e.flaw is None:
            assert ok == 1.0 and e.response == task.solution(e.problem)
        elif e.flaw == "wrong_answer":
            assert ok == 0.0
    assert not any(e.flaw for e in task.sft_examples(200, seed=0, imperfect=0.0))


def test_canonical_layout_example():
    task = get_task("countdown")
    from pivotrl.tasks.synthetic import Program

    # (5*3)+7 over the numbers [3, 5, 7]: slots 0..2 are the leaves
    program = Program((3, 5, 7), ((1, "*", 0), (3, "+", 2)))
    p = task.make_problem([3, 5, 7], program)
    assert p.answer == {"numbers": [3, 5, 7], "target": 22}
    assert task.solution(p) == "<think>5*3=15;15+7=22</think><answer>5*3+7</answer>"
    assert task.format_prompt(p) == "Use 3 5 7 to make 22.\n"


def test_minimal_parentheses_keep_the_value():
    from pivotrl.rewards import evaluate
    from pivotrl.tasks.synthetic import random_program

    rng = random.Random(1)
    for _ in range(500):
        leaves = [rng.randint(1, 12) for _ in range(rng.randint(2, 5))]
        program = random_program(rng, leaves, "+-*/", min_value=1)
        if program is not None:
            assert evaluate(program.text()).value == program.value


def test_responses_are_short():
    from pivotrl.modeling.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    task = get_task("countdown", **SMALL)
    lengths = [
        len(tok(e.response, add_special_tokens=False)["input_ids"]) for e in task.sft_examples(300)
    ]
    assert max(lengths) <= 40


# -- prompts -----------------------------------------------------------------------------


def test_plain_and_chat_prompts():
    from pivotrl.modeling.tokenizer import build_char_tokenizer

    task = get_task("linear", **SMALL)
    p = task.problems("test")[0]
    assert task.format_prompt(p) == p.prompt + "\n"
    tok = build_char_tokenizer()
    with pytest.raises(ValueError, match="chat template"):
        task.format_prompt(p, tokenizer=tok, chat=True)
    with pytest.raises(ValueError, match="tokenizer"):
        task.format_prompt(p, chat=True)
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    text = task.format_prompt(p, tokenizer=tok, chat=True)
    assert text == f"[user]{p.prompt}\n{task.instruction}\n[assistant]"
    sys_task = get_task("linear", system_prompt="Be brief.", **SMALL)
    assert sys_task.format_prompt(p, tokenizer=tok, chat=True).startswith(
        "[system]Be brief.\n[user]"
    )


# -- files and benchmarks -----------------------------------------------------------------


def _write_jsonl(path, rows, extra_lines=()):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return path


def test_file_task_skips_and_counts_bad_rows(tmp_path, caplog):
    path = _write_jsonl(
        tmp_path / "data.jsonl",
        [
            {"q": "1+1?", "a": "2"},
            {"q": "2+2?", "a": 4},
            {"q": "no answer"},
            {"q": "empty answer", "a": "  "},
            {"q": "null answer", "a": None},
            {"a": "5"},
            {"q": "", "a": "5"},
            {"q": "3+3?", "a": 6.0},
        ],
        extra_lines=["{not json", ""],
    )
    task = get_task(
        "file", path=str(path), question_field="q", answer_field="a", verifier="arithmetic"
    )
    with caplog.at_level(logging.WARNING, logger="pivotrl.tasks"):
        problems = task.problems("train")
    assert [p.prompt for p in problems] == ["1+1?", "2+2?", "3+3?"]
    assert [p.answer for p in problems] == ["2", "4", "6"]
    assert problems.skipped == 6
    assert "skipped 6" in caplog.text
    assert task.score("<think>3+3=6</think><answer>6</answer>", problems[2]) == 1.0
    assert task.format_prompt(problems[0]).startswith("1+1?\n")


def test_file_with_no_usable_rows_is_a_value_error(tmp_path):
    path = _write_jsonl(
        tmp_path / "bad.jsonl",
        [{"question": "x"}, {"answer": "1"}, {"question": "y", "answer": ""}],
    )
    with pytest.raises(ValueError, match="no usable rows"):
        get_task("file", path=str(path)).problems("test")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no usable rows"):
        get_task("file", path=str(empty)).problems("test")


def test_file_task_options(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", [{"p": {"text": "a"}, "s": "work\n#### 1,234"}])
    test = tmp_path / "test.json"
    test.write_text(
        json.dumps([{"p": {"text": "b"}, "s": "#### 7"}, {"p": {"text": "c"}, "s": "no marker"}])
    )
    task = get_task(
        "file",
        path={"train": str(train), "heldout": str(test)},
        question_field="p.text",
        answer_field="s",
        answer_after="####",
    )
    assert [(p.prompt, p.answer) for p in task.problems("train")] == [("a", "1234")]
    held = task.problems("test")
    assert [(p.prompt, p.answer) for p in held] == [("b", "7")] and held.skipped == 1
    with pytest.raises(FileNotFoundError):
        get_task("file", path=str(tmp_path / "missing.jsonl")).problems("train")
    with pytest.raises(ValueError, match="verifier"):
        get_task("file", path=str(train), verifier="nope")


def test_parquet_files(tmp_path):
    path = tmp_path / "data.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        try:
            import pandas  # noqa: F401
        except ImportError:
            path.write_bytes(b"PAR1")
            with pytest.raises(ImportError, match="pyarrow"):
                get_task("file", path=str(path)).problems("train")
            return
        pytest.skip("pandas without pyarrow: cannot write a parquet file here")
    pq.write_table(pa.table({"question": ["q1", "q2"], "answer": ["1", ""]}), path)
    problems = get_task("file", path=str(path)).problems("train")
    assert [p.prompt for p in problems] == ["q1"] and problems.skipped == 1


def test_hub_task_without_datasets_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    task = get_task("hub", dataset="openai/gsm8k", config="main", answer_after="####")
    with pytest.raises(ImportError, match="datasets"):
        task.problems("train")


def test_hub_task_offline_says_so(monkeypatch):
    def load_dataset(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    task = get_task("hub", dataset="openai/gsm8k", config="main")
    with pytest.raises(RuntimeError, match="Offline"):
        task.problems("test")


def test_hub_task_reads_rows_through_datasets(tmp_path):
    pytest.importorskip("datasets")
    path = _write_jsonl(
        tmp_path / "rows.jsonl", [{"question": "q1", "answer": "#### 1"}, {"question": "q2"}]
    )
    task = get_task(
        "hub",
        dataset="json",
        load_options={"data_files": {"train": str(path)}},
        splits={"train": "train"},
        answer_after="####",
    )
    problems = task.problems("train")
    assert [(p.prompt, p.answer) for p in problems] == [("q1", "1")] and problems.skipped == 1
    with pytest.raises(ValueError, match="split"):
        task.problems("test")


def test_gsm8k_answer():
    assert gsm8k_answer("a\nb\n#### 1,000") == "1000"
    assert gsm8k_answer("#### -3.5 ") == "-3.5"
    assert gsm8k_answer("no marker") is None


def test_missing_benchmark_folder_names_the_path(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv("PIVOTRL_BENCHMARKS", str(missing))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        get_task("gsm8k").problems("test")
    monkeypatch.setenv("PIVOTRL_BENCHMARKS", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="math500.jsonl"):
        get_task("math500").problems("test")


def test_benchmark_folder_from_the_environment(tmp_path, monkeypatch):
    _write_jsonl(tmp_path / "amc23.jsonl", [{"question": "q", "answer": 3.0}, {"question": "r"}])
    monkeypatch.setenv("PIVOTRL_BENCHMARKS", str(tmp_path))
    problems = get_task("amc23").problems("test")
    assert [(p.prompt, p.answer) for p in problems] == [("q", "3")] and problems.skipped == 1
    with pytest.raises(ValueError, match="no 'train' split"):
        get_task("amc23").problems("train")


@pytest.fixture
def real_benchmarks():
    try:
        return benchmarks_dir()
    except FileNotFoundError as exc:
        pytest.skip(f"benchmark files absent: {exc}")


@pytest.mark.parametrize(
    ("name", "split", "rows", "first_answer"),
    [
        ("gsm8k", "test", 1319, "18"),
        ("gsm8k", "train", 7473, "72"),
        ("math500", "test", 500, r"\left( 3, \frac{\pi}{2} \right)"),
        ("aime24", "test", 30, "204"),
        ("amc23", "test", 40, "27"),
    ],
)
def test_real_benchmark_files(real_benchmarks, name, split, rows, first_answer):
    problems = get_task(name).problems(split)
    assert len(problems) == rows and problems.skipped == 0
    assert problems[0].answer == first_answer
    assert all(p.prompt and p.answer for p in problems)
    assert str(real_benchmarks) in problems.source


def test_gsm8k_answers_are_numbers(real_benchmarks):
    from pivotrl.rewards import parse_number

    problems = get_task("gsm8k").problems("test")
    assert all(parse_number(p.answer) is not None for p in problems)


def test_math500_keeps_metadata_and_verifies(real_benchmarks):
    task = get_task("math500")
    p = next(p for p in task.problems("test") if p.answer == r"\frac{14}{3}")
    assert {"subject", "level", "unique_id"} <= set(p.meta)
    assert task.score(r"<think>...</think><answer>\frac{14}{3}</answer>", p) == 1.0
    assert task.score(r"<think>...</think><answer>5</answer>", p) == 0.0
