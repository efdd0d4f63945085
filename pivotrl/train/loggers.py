"""Metric sinks: metrics.jsonl always; TensorBoard, W&B (offline) and MLflow (local files) on request."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _finite(value: Any) -> Any:
    """JSON has no NaN: non-finite floats are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep the lines of metrics.jsonl with step <= last_step (drops a torn last line too)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("step", math.inf) <= last_step:
            kept.append(line)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)


class MetricsLogger:
    """Writes one JSON object per step to output_dir/metrics.jsonl and to the optional backends."""

    def __init__(self, output_dir: Path, *, tensorboard: bool = False, wandb: bool = False, mlflow: bool = False,
                 config: dict[str, Any] | None = None, run_name: str = "pivotrl") -> None:
        self.path = output_dir / "metrics.jsonl"
        output_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")  # noqa: SIM115 - closed in close()
        self._tb = self._wandb = self._mlflow = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ValueError("log.tensorboard=true needs tensorboard: pip install 'pivotrl[tensorboard]'") from err
            self._tb = SummaryWriter(str(output_dir / "tensorboard"))
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError as err:
                raise ValueError("log.wandb=true needs wandb: pip install 'pivotrl[wandb]'") from err
            self._wandb = wandb_module.init(mode="offline", dir=str(output_dir), config=config, name=run_name)
        if mlflow:
            try:
                import mlflow as mlflow_module
            except ImportError as err:
                raise ValueError("log.mlflow=true needs mlflow: pip install 'pivotrl[mlflow]'") from err
            mlflow_module.set_tracking_uri((output_dir / "mlruns").resolve().as_uri())
            self._mlflow = mlflow_module
            mlflow_module.start_run(run_name=run_name)
            if config:
                mlflow_module.log_params({k: str(v)[:250] for k, v in _flatten(config).items()})

    def log(self, metrics: dict[str, Any]) -> None:
        """Append one record (must contain 'step') to every sink."""
        step = int(metrics["step"])
        self._file.write(json.dumps({k: _finite(v) for k, v in metrics.items()}) + "\n")
        self._file.flush()
        numeric = {k: float(v) for k, v in metrics.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        if self._mlflow is not None:
            self._mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in numeric.items()}, step=step)

    def close(self) -> None:
        """Flush and close every sink."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def mean_metrics(items: list[dict[str, float]]) -> dict[str, float]:
    """Each key's mean over the dicts that have it."""
    keys = {k for m in items for k in m}
    return {k: sum(m[k] for m in items if k in m) / sum(1 for m in items if k in m) for k in keys}
