"""compare / report / analyze on smoke-sized runs."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from PIL import Image

from pivotrl.algorithms import estimator_requirements
from pivotrl.analysis.compare import plan_runs, run_comparison, seed_list
from pivotrl.analysis.pivots import analyze_policy, flip_ratio_ci, paired_difference_ci
from pivotrl.analysis.report import mean_ci95, report_warnings, write_report
from pivotrl.analysis.runs import read_run
from pivotrl.modeling.policy import load_policy
from pivotrl.rollout import make_engine
from pivotrl.tasks import get_task
from pivotrl.train.config import load_config
from pivotrl.train.recipes import recipe_path

SMALL = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
         "intermediate_size": 64}


@pytest.fixture(scope="module")
def comparison(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compare")
    run_comparison(recipe_path("smoke"), ["grpo", "erpo"], 2, out, extra=["eval.every=2", "train.max_steps=4"])
    return out


def table_rows(report: Path) -> list[str]:
    return [line for line in report.read_text().splitlines() if line.startswith("| ") and not line.startswith("| method")]


def test_compare_writes_a_row_per_method_and_decodable_plots(comparison: Path) -> None:
    rows = table_rows(comparison / "report.md")
    assert [r.split("|")[1].strip() for r in rows] == ["grpo", "erpo"]
    assert all(r.split("|")[2].strip() == "2" for r in rows)  # two seeds each
    for name in ("accuracy", "entropy", "response_length", "clip"):
        with Image.open(comparison / f"{name}.png") as img:
            img.verify()
        with Image.open(comparison / f"{name}.png") as img:
            assert img.size[0] > 400 and img.size[1] > 300


def test_compare_is_resumable(comparison: Path) -> None:
    before = {p: p.stat().st_mtime for p in (comparison / "runs").rglob("summary.json")}
    run_comparison(recipe_path("smoke"), ["grpo", "erpo"], 2, comparison, extra=["eval.every=2", "train.max_steps=4"])
    after = {p: p.stat().st_mtime for p in (comparison / "runs").rglob("summary.json")}
    assert before == after  # finished runs were not trained again


def test_compare_jobs_in_parallel_log_the_same_metrics(comparison: Path, tmp_path: Path) -> None:
    run_comparison(recipe_path("smoke"), ["grpo"], 2, tmp_path, extra=["eval.every=2", "train.max_steps=4"], jobs=2)

    def untimed(run: Path) -> list[dict]:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "tokens_per_s"} for r in rows]

    for seed in (0, 1):
        name = f"grpo-seed{seed}"
        assert untimed(tmp_path / "runs" / name) == untimed(comparison / "runs" / name)
    with pytest.raises(ValueError, match="--jobs"):
        run_comparison(recipe_path("smoke"), ["grpo"], 1, tmp_path, jobs=0)


def test_report_over_existing_folders_gives_the_same_table(comparison: Path, tmp_path: Path) -> None:
    runs = sorted((comparison / "runs").iterdir())
    order = [r for r in runs if r.name.startswith("grpo")] + [r for r in runs if r.name.startswith("erpo")]
    report = write_report([read_run(r) for r in order], tmp_path)
    assert table_rows(report) == table_rows(comparison / "report.md")


def test_plan_and_ablation() -> None:
    plan = plan_runs(["grpo"], 2, ablate="erpo")
    assert [(label, seed) for label, seed, _ in plan][:3] == [("grpo", 0), ("grpo", 1), ("erpo:full", 0)]
    assert {label for label, _, _ in plan} == {"grpo", "erpo:full", "erpo:no_gate", "erpo:no_buckets", "erpo:no_anchor"}
    with pytest.raises(ValueError, match="unknown method"):
        plan_runs(["grpo", "erpp"], 1)


def test_seeds_are_a_count_or_seeds_and_ranges() -> None:
    assert seed_list(4) == seed_list("4") == [0, 1, 2, 3]
    assert seed_list("1-3") == [1, 2, 3] and seed_list("0,2-3") == [0, 2, 3] and seed_list("2") == [0, 1]
    assert seed_list("1-1") == [1]
    for bad in ("0", "3-1", "1,,2", "a", "1-2,2"):
        with pytest.raises(ValueError, match="--seeds"):
            seed_list(bad)


def test_compare_trains_only_the_seeds_named(tmp_path: Path) -> None:
    """A comparison split across machines: `--seeds 1,3` trains seeds 1 and 3 of each method, and nothing else."""
    from typer.testing import CliRunner

    from pivotrl.cli import app

    result = CliRunner().invoke(app, ["compare", "-c", str(recipe_path("smoke")), "--methods", "grpo", "--seeds", "1,3",
                                      "-o", str(tmp_path), "train.max_steps=2"])
    assert result.exit_code == 0, result.output
    runs = sorted((tmp_path / "runs").iterdir())
    assert [run.name for run in runs] == ["grpo-seed1", "grpo-seed3"]
    assert [read_run(run).seed for run in runs] == [1, 3]


def test_runs_of_one_estimator_with_other_hyperparameters_keep_their_own_labels(tmp_path: Path) -> None:
    """`pivotrl report` over folders labels each run from its config: ERPO's components stay apart."""
    labels = []
    for name, kwargs in (("full", {}), ("gate_only", {"eta": 0.0}), ("process_only", {"gate": False})):
        run = tmp_path / name
        run.mkdir()
        (run / "metrics.jsonl").write_text('{"step": 1}\n')
        (run / "config.yaml").write_text(json.dumps({"algorithm": {"estimator": "erpo", "estimator_kwargs": kwargs}}))
        labels.append(read_run(run).method)
    assert labels == ["erpo", "erpo(eta=0.0)", "erpo(gate=False)"]


def test_erpos_components_alone_read_only_what_they_need(tmp_path: Path) -> None:
    """erpo_gate_only (eta 0) needs no reference model; erpo_process_only (no gate) reads no entropies."""
    needs = {}
    for label, _, overrides in plan_runs(["erpo_gate_only", "erpo_process_only"], 1):
        algorithm = load_config(recipe_path("quick"), [f"output_dir={tmp_path}", *overrides]).algorithm
        needs[label] = set(estimator_requirements(algorithm.estimator, **algorithm.estimator_kwargs))
    assert "ref_logprobs" not in needs["erpo_gate_only"] and "entropies" in needs["erpo_gate_only"]
    assert "entropies" not in needs["erpo_process_only"] and "ref_logprobs" in needs["erpo_process_only"]


def test_mean_ci95_and_flip_ratio() -> None:
    mean, half = mean_ci95([0.2, 0.4])
    # t(1) = 12.706; stdev = 0.1414; half = 12.706 * 0.1414 / sqrt(2) = 1.2706
    assert mean == pytest.approx(0.3) and half == pytest.approx(1.2706, abs=1e-4)
    ratio, lo, hi = flip_ratio_ci(35, 100, 10, 100)
    # (35.5/101)/(10.5/101) = 3.381
    assert ratio == pytest.approx(35.5 / 10.5) and lo < ratio < hi


class TokenCounter(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.responses: list[int] = []
        self.rows: list[int] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("class") == "resp":
            self.responses.append(int(a["data-tokens"]))
        if a.get("class") == "row":
            self.rows.append(0)
        if a.get("class") == "tok":
            self.rows[-1] += 1


def test_analyze_writes_html_whose_token_count_matches_the_samples(tmp_path: Path) -> None:
    model, tok = load_policy("tiny-random", arch=SMALL)
    task = get_task("countdown", train_size=10, test_size=16)
    problems = task.problems("test")[:6]
    result = analyze_policy(model, tok, make_engine("hf", model, tok), task, problems,
                            [task.format_prompt(p) for p in problems], tmp_path, group_size=4, max_new_tokens=12,
                            num_perturbations=10)
    parser = TokenCounter()
    parser.feed((tmp_path / "tokens.html").read_text())
    assert len(parser.responses) == result["html_responses"] == 24
    assert sum(parser.responses) == result["tokens"]
    # three rows per response (entropy, estimator, grpo), each with one span per token
    assert parser.rows == [n for n in parser.responses for _ in range(3)]
    with Image.open(tmp_path / "entropy.png") as img:
        img.verify()
    assert result["n_high"] == 10 and result["n_low"] == 10
    # the control: the same positions with the sampled token kept
    for side in ("high", "low"):
        kept = result[f"flip_rate_{side}_kept"]
        assert result[f"flips_{side}_kept"] == round(kept * 10)
        assert result[f"attributable_{side}"] == pytest.approx(result[f"flip_rate_{side}"] - kept)
        lo, hi = result[f"attributable_{side}_ci95"]
        assert lo <= result[f"attributable_{side}"] <= hi
    assert result["attributable_difference"] == pytest.approx(result["attributable_high"] - result["attributable_low"])


def test_paired_difference_interval() -> None:
    a = torch.tensor([1, 1, 0, 1, 0, 1, 1, 0])
    b = torch.tensor([0, 1, 0, 0, 0, 1, 0, 0])
    mean, lo, hi = paired_difference_ci(a, b)
    d = [1, 0, 0, 1, 0, 0, 1, 0]  # mean 3/8, sample sd sqrt(15/56)
    assert mean == pytest.approx(3 / 8)
    assert hi - mean == pytest.approx(1.96 * math.sqrt(15 / 56) / math.sqrt(8))
    assert mean - lo == pytest.approx(hi - mean) and len(d) == 8


def test_report_table_has_the_tasks_counts_and_late_entropy(tmp_path: Path) -> None:
    """Columns from the final evaluation's mean_<count> keys, and entropy over the last 10 steps."""
    import json

    from pivotrl.analysis.report import markdown_table, method_rows
    from pivotrl.analysis.runs import read_run

    runs = []
    for seed, attempts in ((0, 2.0), (1, 3.0)):
        folder = tmp_path / f"run{seed}"
        (folder / "eval").mkdir(parents=True)
        (folder / "config.yaml").write_text(f"algorithm: {{estimator: erpo}}\ntrain: {{seed: {seed}}}\n")
        entropies = [1.0] * 5 + [0.2 + seed * 0.2] * 10  # only the last 10 steps count
        (folder / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "entropy/mean": h}) + "\n" for i, h in enumerate(entropies)))
        (folder / "eval" / "step-000015.json").write_text(json.dumps(
            {"accuracy": 0.5, "mean_length": 80.0, "mean_attempts": attempts, "num_problems": 10,
             "samples_per_problem": 1}))
        runs.append(read_run(folder))
    rows = method_rows({"erpo": runs})
    assert rows[0]["task_stats"] == {"mean_attempts": 2.5}
    assert rows[0]["entropy"] == pytest.approx(0.3)
    table = markdown_table(rows)
    assert "attempts per response" in table and "| 2.50 |" in table and "0.300" in table


def test_gain_and_welch_difference_to_the_baseline(tmp_path: Path) -> None:
    """The report's paired gain (after - before per run) and its Welch interval against grpo's,
    checked against the formulas worked by hand."""
    from pivotrl.analysis.report import difference_ci95, markdown_table, method_rows
    from pivotrl.analysis.runs import read_run

    # by hand: a = [0.1, 0.2, 0.3], b = [0.0, 0.1]; var/n: 0.01/3, 0.005/2; diff 0.15
    # df = (0.01/3 + 0.0025)^2 / ((0.01/3)^2/2 + 0.0025^2/1) = 2.88 -> rounded down to 2: t = 4.303
    diff, half = difference_ci95([0.1, 0.2, 0.3], [0.0, 0.1])
    assert diff == pytest.approx(0.15)
    assert half == pytest.approx(4.303 * math.sqrt(0.01 / 3 + 0.0025))
    assert math.isnan(difference_ci95([0.1], [0.0, 0.1])[1])

    groups = {}
    for method, gains in (("grpo", (0.0, 0.1)), ("erpo", (0.1, 0.2, 0.3))):
        runs = []
        for seed, gain in enumerate(gains):
            folder = tmp_path / f"{method}{seed}"
            folder.mkdir()
            (folder / "config.yaml").write_text(f"algorithm: {{estimator: {method}}}\ntrain: {{seed: {seed}}}\n")
            (folder / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
            before = 0.1 * seed  # every seed starts elsewhere: the gain is per run
            (folder / "summary.json").write_text(json.dumps(
                {"heldout_accuracy_before": before, "heldout_accuracy_after": before + gain}))
            runs.append(read_run(folder))
        groups[method] = runs
    rows = {r["method"]: r for r in method_rows(groups)}
    assert rows["erpo"]["gain"] == pytest.approx(0.2)
    assert rows["erpo"]["gain_vs_baseline"] == pytest.approx((diff, half))
    table = markdown_table(list(rows.values()))
    assert f"+0.150 ({0.15 - half:+.3f} to {0.15 + half:+.3f})" in table
    without_baseline = markdown_table([rows["erpo"]])
    assert "grpo's gain" not in without_baseline and "+0.200" in without_baseline
    assert "steps to grpo" not in without_baseline


def test_compare_holds_methods_to_a_token_budget_and_reports_every_methods_tokens(tmp_path: Path) -> None:
    from pivotrl.analysis.compare import parse_sets

    with pytest.raises(ValueError, match="METHOD:KEY=VALUE"):
        parse_sets(["grpo=rollout.group_size"], ["grpo"])
    with pytest.raises(ValueError, match="'dapo' is not among the compared methods"):
        parse_sets(["dapo:rollout.group_size=2"], ["grpo"])
    warnings: list[str] = []
    report = run_comparison(recipe_path("smoke"), ["grpo", "pivot_mc"], 1, tmp_path,
                            extra=["train.max_steps=1", "eval.before_after=false"],
                            sets=["pivot_mc:rollout.branch.pivots=1", "pivot_mc:rollout.branch.branches=2"],
                            warn=warnings.append)
    text = report.read_text()
    assert "pivot_mc: `rollout.branch.pivots=1 rollout.branch.branches=2`" in text
    assert "generated tokens per run (branches)" in text
    row = next(line for line in text.splitlines() if line.startswith("| pivot_mc"))
    assert "(0)" not in row.split("|")[-3]  # branch tokens were counted
    assert any("unequal numbers of tokens" in w for w in warnings)  # G=4 grpo vs branching: not one budget


def test_runs_that_differ_only_in_reusing_the_evaluation_before_are_comparable(tmp_path: Path) -> None:
    runs = []
    for name, reuse in (("old", None), ("new", True)):
        run = tmp_path / name
        run.mkdir()
        (run / "metrics.jsonl").write_text('{"step": 1}\n')
        (run / "config.yaml").write_text(json.dumps({"algorithm": {"estimator": "grpo"}, "eval": {"reuse_before": reuse}}))
        runs.append(read_run(run))
    assert not [w for w in report_warnings(runs) if "differ in more than" in w]
