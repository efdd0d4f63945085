"""Reading finished (or running) run folders: config, per-step metrics, evaluations, summary."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class RunRecord:
    """What a run folder holds, parsed."""

    path: Path
    method: str
    seed: int
    metrics: list[dict[str, Any]]
    evals: dict[int, dict[str, Any]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a per-step metric, skipping steps without a finite value."""
        steps, values = [], []
        for record in self.metrics:
            value = record.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                steps.append(int(record["step"]))
                values.append(float(value))
        return steps, values


def method_label(config: dict[str, Any]) -> str:
    """'erpo', or 'grpo+tepo' when the loss is not ppo, plus DAPO's sampling options."""
    alg = config.get("algorithm", {})
    label = alg.get("estimator", "?")
    if alg.get("policy_loss", "ppo") != "ppo":
        label += f"+{alg['policy_loss']}"
    if config.get("rollout", {}).get("dynamic_sampling"):
        label += "+dyn"
    return config.get("label") or label


def read_run(path: str | Path, label: str | None = None) -> RunRecord:
    """Parse one run folder; ValueError when it has no metrics.jsonl."""
    path = Path(path)
    metrics_file = path / "metrics.jsonl"
    if not metrics_file.is_file():
        raise ValueError(f"{path} is not a run folder: no metrics.jsonl")
    metrics = []
    for line in metrics_file.read_text().splitlines():
        try:
            metrics.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line of a killed run
    config = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").is_file() else {}
    evals = {}
    for f in sorted((path / "eval").glob("step-*.json")) if (path / "eval").is_dir() else []:
        evals[int(f.stem.split("-")[1])] = json.loads(f.read_text())
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").is_file() else {}
    seed = int(config.get("train", {}).get("seed", 0))
    return RunRecord(path, label or method_label(config), seed, metrics, evals, summary)
