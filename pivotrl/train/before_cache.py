"""The held-out evaluation before training, reused by the runs that would draw it again.

The runs of a comparison start from the same weights and sample their evaluation with the same seed
(trainer.EVAL_SEED), so their "before" evaluations are equal draw for draw: on SmolLM2 with 1000
countdown problems one costs 10-15 minutes of a 105-minute run here. The key holds everything the draws
and their scores depend on: the weights, the prompts and answers, the evaluation's settings and engine,
the source of pivotrl's engines, tasks, verifiers and metrics (DRAWING_CODE), the versions of torch,
transformers and vllm, and torch's thread count.
The cache is ``$PIVOTRL_EVAL_CACHE``, else ``evaluations/`` in pivotrl's cache (``$PIVOTRL_CACHE``, ...).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

import pivotrl
from pivotrl.modeling.gguf import cache_dir


def evaluation_cache() -> Path:
    """Where reused evaluations live: $PIVOTRL_EVAL_CACHE, else <pivotrl's cache>/evaluations."""
    folder = os.environ.get("PIVOTRL_EVAL_CACHE")
    return Path(folder).expanduser() if folder else cache_dir() / "evaluations"


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer, by name, shape, dtype and bytes."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}\n".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


#: pivotrl's code that draws and scores an evaluation: the engines, the model's loading and dtypes, the tasks,
#: the verifiers and the metrics. A change to any of them is a new key; one to algorithms/ or train/ is not.
DRAWING_CODE = ("rollout", "modeling", "tasks", "rewards", "evaluation.py")


@functools.cache
def code_digest() -> str:
    """sha256 over the source of DRAWING_CODE."""
    digest = hashlib.sha256()
    root = Path(pivotrl.__file__).parent
    for part in DRAWING_CODE:
        for path in sorted((root / part).rglob("*.py")) if (root / part).is_dir() else [root / part]:
            digest.update(str(path.relative_to(root)).encode() + b"\n" + path.read_bytes())
    return digest.hexdigest()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def evaluation_key(model: torch.nn.Module, prompts: list[str], answers: list[Any], settings: dict[str, Any]) -> str:
    """The key of one evaluation: `settings` are the engine's and the sampling's (JSON-serialisable)."""
    content = {
        "weights": weights_digest(model), "prompts": prompts, "answers": answers, "settings": settings,
        "code": code_digest(), "threads": torch.get_num_threads(),
        "versions": {p: _version(p) for p in ("torch", "transformers", "vllm")},
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def load(key: str, samples_path: Path) -> tuple[dict[str, Any], Path] | None:
    """The stored result for `key` (its samples copied to samples_path) and its folder; None if absent."""
    folder = evaluation_cache() / key
    try:
        result = json.loads((folder / "result.json").read_text())
        samples_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / "samples.jsonl", samples_path)
    except (OSError, ValueError):
        return None
    return result, folder


def store(key: str, result: dict[str, Any], samples_path: Path) -> None:
    """Store a finished evaluation under `key`, whole or not at all (written aside, then renamed)."""
    cache = evaluation_cache()
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cache, prefix=".incoming-"))
    try:
        shutil.copyfile(samples_path, staging / "samples.jsonl")
        (staging / "result.json").write_text(json.dumps(result, indent=2))
        staging.rename(cache / key)
    except OSError:  # another run stored the same key first, or the disk is full: keep what is there
        shutil.rmtree(staging, ignore_errors=True)
