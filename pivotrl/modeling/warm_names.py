"""Warm-started real models by name: ``smollm2-135m-add_sub`` is SmolLM2-135M-Instruct after the
warm start on add_sub that ``pivotrl pretrain --model smollm2-135m --task add_sub`` makes
(pivotrl/warm_start.py), kept in pivotrl's cache (``<cache>/models/<name>``, beside the converted
GGUF files; modeling/gguf.py says where the cache is)."""

from __future__ import annotations

from pathlib import Path

from pivotrl.modeling.gguf import cache_dir

#: name -> (the base model it starts from, the task whose worked solutions it learned)
WARM_STARTS: dict[str, tuple[str, str]] = {
    "smollm2-135m-add_sub": ("smollm2-135m", "add_sub"),
    "smollm2-135m-countdown": ("smollm2-135m", "countdown"),
}


def warm_start_name(model: str, task: str) -> str | None:
    """The name of `model`'s warm start on `task`, where WARM_STARTS has one."""
    return next((name for name, pair in WARM_STARTS.items() if pair == (model, task)), None)


def warm_start_folder(name: str) -> Path:
    """Where the warm start `name` is kept."""
    return cache_dir() / "models" / name


def resolve_warm_start(name_or_path: str) -> str:
    """The folder of a warm start's name (ValueError naming the command that makes it, when it is not
    made yet); anything else as given."""
    if name_or_path not in WARM_STARTS:
        return name_or_path
    folder = warm_start_folder(name_or_path)
    if not (folder / "config.json").is_file():
        model, task = WARM_STARTS[name_or_path]
        raise ValueError(f"model {name_or_path!r} is {model} warm-started on {task}, made once with: pivotrl "
                         f"pretrain --model {model} --task {task} (20 to 90 minutes on a 2-core CPU; it saves to {folder})")
    return str(folder)
