"""scripts/keep_runs.py on a real `pivotrl compare` folder: what it keeps, what it leaves, and that the
analyses read the kept records as they read the runs themselves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pivotrl.analysis.compare import run_comparison
from pivotrl.train.recipes import recipe_path

ROOT = Path(__file__).resolve().parent.parent


def script(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def comparison(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compare") / "cd_smoke"
    run_comparison(recipe_path("smoke"), ["grpo", "erpo"], 2, out, extra=["eval.every=2", "train.max_steps=4"])
    return out


@pytest.mark.filterwarnings("ignore")
def test_kept_records_give_the_same_analysis_without_the_checkpoints(comparison: Path, tmp_path: Path) -> None:
    kept = tmp_path / "records"
    result = script(ROOT / "scripts" / "keep_runs.py", comparison, "-o", kept)
    assert result.returncode == 0, result.stderr
    runs = sorted(p.name for p in (kept / "cd_smoke" / "runs").iterdir())
    assert runs == ["erpo-seed0", "erpo-seed1", "grpo-seed0", "grpo-seed1"]
    assert not list(kept.rglob("checkpoints")) and list((comparison / "runs").rglob("checkpoints"))
    for run in runs:
        source, copy = comparison / "runs" / run, kept / "cd_smoke" / "runs" / run
        for rel in ["config.yaml", "metrics.jsonl", "summary.json", "eval/step-000000_samples.jsonl",
                    "eval/step-000004.json"]:
            assert (copy / rel).read_bytes() == (source / rel).read_bytes()

    tables = {}
    for name, folder in (("runs", comparison), ("kept", kept / "cd_smoke")):
        analysis = script(ROOT / "scripts" / "ceilings.py", folder, "-o", tmp_path / name, "--pooled")
        assert analysis.returncode == 0, analysis.stderr
        tables[name] = (tmp_path / name / "summary.json").read_text()
    assert tables["kept"] == tables["runs"]

    again = script(ROOT / "scripts" / "keep_runs.py", comparison, "-o", kept)
    assert again.returncode == 0 and "kept 0 files" in again.stdout


def test_unfinished_runs_are_skipped_and_a_differing_record_is_refused(comparison: Path, tmp_path: Path) -> None:
    folder = tmp_path / "cd_smoke"
    subprocess.run(["cp", "-r", str(comparison), str(folder)], check=True)
    (folder / "runs" / "erpo-seed1" / "summary.json").unlink()  # the trainer writes it last: a run stopped before
    kept = tmp_path / "records"
    result = script(ROOT / "scripts" / "keep_runs.py", folder, "-o", kept)
    assert result.returncode == 0 and "erpo-seed1: not finished" in result.stdout
    assert not (kept / "cd_smoke" / "runs" / "erpo-seed1").exists()

    metrics = folder / "runs" / "grpo-seed0" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 5}\n')
    kept_before = (kept / "cd_smoke" / "runs" / "grpo-seed0" / "metrics.jsonl").read_text()
    refused = script(ROOT / "scripts" / "keep_runs.py", folder, "-o", kept)
    assert refused.returncode == 1 and "grpo-seed0/metrics.jsonl" in refused.stderr
    assert (kept / "cd_smoke" / "runs" / "grpo-seed0" / "metrics.jsonl").read_text() == kept_before
