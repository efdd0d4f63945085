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
    config: dict[str, Any] = field(default_factory=dict)
    """The run's own settings: its folder's config.yaml (empty when it has none)."""

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
    """'erpo', 'erpo(eta=0.0)' with estimator_kwargs, or 'grpo+tepo' when the loss is not ppo, plus DAPO's
    sampling options."""
    alg = config.get("algorithm", {})
    label = alg.get("estimator", "?")
    if alg.get("estimator_kwargs"):
        label += "(" + ", ".join(f"{k}={v}" for k, v in sorted(alg["estimator_kwargs"].items())) + ")"
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
    for line in _text(metrics_file).splitlines():
        try:
            metrics.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line of a killed run
    config: Any = {}
    if (path / "config.yaml").is_file():
        try:
            config = yaml.safe_load(_text(path / "config.yaml")) or {}
        except yaml.YAMLError as err:
            raise ValueError(f"{path / 'config.yaml'}: not valid YAML: {' '.join(str(err).split())}") from None
        if not isinstance(config, dict):
            raise ValueError(f"{path / 'config.yaml'}: not a mapping of settings")
    evals = {}
    for f in sorted((path / "eval").glob("step-*.json")) if (path / "eval").is_dir() else []:
        evals[int(f.stem.split("-")[1])] = _json(f)
    summary = _json(path / "summary.json") if (path / "summary.json").is_file() else {}
    seed = int(config.get("train", {}).get("seed", 0))
    return RunRecord(path, label or method_label(config), seed, metrics, evals, summary, config)


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start}: {err.reason})") from None


def _json(path: Path) -> Any:
    try:
        return json.loads(_text(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
