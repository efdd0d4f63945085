"""A tiny verl run's inputs, built locally: model folder, countdown parquet files, reward function.

Used by scripts/verl_e2e.sh (and tests/verl/test_verl_e2e.py):

    python tests/verl/tiny_verl.py OUT_DIR [--train N] [--val N]

writes ``OUT_DIR/model`` (pivotrl's shipped tiny Llama, 0.9 M parameters, with its
character tokenizer and a chat template, so that verl's data set and agent loop can
render prompts), ``OUT_DIR/train.parquet`` and ``OUT_DIR/val.parquet`` (countdown problems
in verl's RL data layout). verl scores them with :func:`compute_score`, named by
``reward.custom_reward_function.path=<this file>`` (verl loads it by path in its reward
workers; ``name`` defaults to ``compute_score``).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pivotrl

DATA_SOURCE_PREFIX = "pivotrl/"

#: pivotrl.modeling.tiny.tiny_policy_path("tiny"), found without importing transformers
SHIPPED_POLICY = Path(pivotrl.__file__).resolve().parent / "assets" / "tiny-countdown"
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)

#: The tiny policy was trained on ``<bos>{prompt}\n`` prompts; this renders a chat as exactly that.
CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}\n{% endfor %}"


def build_model(path: str | Path) -> Path:
    """Copy the shipped tiny policy to ``path`` and give its tokenizer the chat template; returns it.

    The files are copied as they are (transformers is not imported: this runs before every
    verl e2e run); the template goes where transformers 5 keeps it, ``chat_template.jinja``.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        shutil.copyfile(SHIPPED_POLICY / name, path / name)
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return path


def countdown_rows(split: str, n: int) -> list[dict[str, Any]]:
    """``n`` countdown problems of ``split`` as verl RL rows (data_source, prompt, reward_model, ...)."""
    from pivotrl.tasks import get_task

    problems = get_task("countdown").problems(split)[:n]
    return [
        {
            "data_source": DATA_SOURCE_PREFIX + "countdown",
            "prompt": [{"role": "user", "content": problem.prompt}],
            "ability": "countdown",
            "reward_model": {"style": "rule", "ground_truth": json.dumps(problem.answer)},
            "extra_info": {"index": i, "split": split},
        }
        for i, problem in enumerate(problems)
    ]


def write_parquet(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path)
    return Path(path)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any) -> float:
    """verl's reward-function signature: the pivotrl task's verifier on the decoded response."""
    from pivotrl.tasks import get_task

    if not data_source.startswith(DATA_SOURCE_PREFIX):
        raise ValueError(f"data_source {data_source!r} is not a pivotrl task ({DATA_SOURCE_PREFIX}<task>)")
    task = get_task(data_source[len(DATA_SOURCE_PREFIX):])
    return float(task.verifier(solution_str, json.loads(ground_truth)))


def build(out: str | Path, train: int = 64, val: int = 16) -> dict[str, Path]:
    """Model folder and parquet files under ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {
        "model": build_model(out / "model"),
        "train": write_parquet(out / "train.parquet", countdown_rows("train", train)),
        "val": write_parquet(out / "val.parquet", countdown_rows("test", val)),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--train", type=int, default=64)
    parser.add_argument("--val", type=int, default=16)
    args = parser.parse_args()
    for name, path in build(args.out, args.train, args.val).items():
        print(f"{name}: {path}")
