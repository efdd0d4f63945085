"""Report plots and labels: no axis below 0, no offset, n=1 instead of a zero interval, warnings on mixed runs."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
from cli_helpers import pivotrl

from pivotrl.analysis.report import by_method, metric_figure, report_warnings
from pivotrl.analysis.runs import RunRecord, read_run


def fake_run(folder: Path, method: str, seed: int, *, accuracies: list[float], entropies: list[float],
             problems: int, rewards: list[float] | None = None) -> Path:
    """A run folder as the trainer writes it, with chosen evaluations and per-step metrics."""
    (folder / "eval").mkdir(parents=True)
    (folder / "config.yaml").write_text(f"algorithm: {{estimator: {method}}}\ntrain: {{seed: {seed}}}\n")
    rewards = rewards if rewards is not None else [0.1] * len(entropies)
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "entropy/mean": e, "reward/mean": r, "response_length/mean": 20.0,
                    "clip/frac": 0.0}) + "\n" for i, (e, r) in enumerate(zip(entropies, rewards, strict=True))))
    for i, acc in enumerate(accuracies):
        (folder / "eval" / f"step-{i * 2:06d}.json").write_text(json.dumps(
            {"accuracy": acc, "num_problems": problems, "samples_per_problem": 1, "mean_length": 20.0}))
    (folder / "summary.json").write_text(json.dumps({"heldout_accuracy_after": accuracies[-1]}))
    return folder


def runs(tmp_path: Path, problems: tuple[int, int] = (8, 8)) -> list[RunRecord]:
    a = fake_run(tmp_path / "a", "grpo", 0, accuracies=[0.0, 0.0, 0.125], entropies=[4.6351, 4.6353, 4.6352, 4.6354],
                 problems=problems[0])
    b = fake_run(tmp_path / "b", "grpo", 1, accuracies=[0.0, 0.125, 0.0], entropies=[4.6350, 4.6352, 4.6351, 4.6355],
                 problems=problems[1])
    c = fake_run(tmp_path / "c", "erpo", 0, accuracies=[0.0, 0.0, 0.0], entropies=[4.6352, 4.6351, 4.6353, 4.6352],
                 problems=problems[1])
    return [read_run(p) for p in (a, b, c)]


def test_axes_start_at_zero_and_show_plain_values(tmp_path: Path) -> None:
    groups = by_method(runs(tmp_path))
    for key in ("accuracy", "entropy/mean"):
        fig = metric_figure(groups, key)
        fig.canvas.draw()
        ax = fig.axes[0]
        assert ax.get_ylim()[0] >= 0.0, key
        assert ax.yaxis.get_major_formatter().get_offset() == "", key
        if key == "entropy/mean":  # the tick labels are the entropies themselves
            labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
            assert all(label.startswith("4.63") for label in labels), labels
        fig.savefig(tmp_path / f"{key.split('/')[0]}.png")
        plt.close(fig)


def test_report_says_n1_and_warns_about_mixed_evaluations(tmp_path: Path) -> None:
    folders = [r.path for r in runs(tmp_path, problems=(1000, 8))]
    proc = pivotrl("report", *map(str, folders), "-o", str(tmp_path / "report"), "--baseline", "grpo")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    warning = " ".join(proc.stderr.split())
    assert "warning: the runs were evaluated on different numbers of problems" in warning
    assert "1000 problems x 1 sample(s); 8 problems x 1 sample(s)" in warning
    report = (tmp_path / "report" / "report.md").read_text()
    erpo_row = next(line for line in report.splitlines() if line.startswith("| erpo"))
    grpo_row = next(line for line in report.splitlines() if line.startswith("| grpo"))
    assert "(n=1, no interval)" in erpo_row and "± 0.000" not in erpo_row
    assert "± " in grpo_row  # two seeds: a real interval
    assert "**Warning:** the runs were evaluated on different numbers of problems" in report


def test_all_zero_rewards_are_flagged(tmp_path: Path) -> None:
    zero = fake_run(tmp_path / "z", "grpo", 0, accuracies=[0.0], entropies=[1.0, 1.0], problems=8,
                    rewards=[0.0, 0.0])
    assert any("every reward of every run is 0" in w for w in report_warnings([read_run(zero)]))
    assert report_warnings(runs(tmp_path / "mixed")) == []
