"""Checks of a run's config that need no model and no data: run before anything is loaded or written.

check_config: the device exists on this machine, the task and its options exist (with the
did-you-mean hint), and no setting makes the run degenerate: sampling at
temperature 0 with several responses per prompt gives every response of a group the same text,
hence equal rewards and all-zero advantages (nothing is learned), and k greedy evaluation
samples are k copies of one. Both are refused. A model.arch next to a model that brings its own
architecture is warned about (it is ignored).
"""

from __future__ import annotations

from pivotrl.errors import ConfigError
from pivotrl.modeling.devices import check_device
from pivotrl.train.config import RunConfig


def check_config(config: RunConfig) -> list[str]:
    """ConfigError naming the first setting of `config` that cannot work or would make the run
    degenerate; returns warnings (one sentence each) about settings that will be ignored."""
    try:
        check_device(config.model.device, "model.device")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    _check_task("task", config.task.name, config.task.options)
    if config.eval.task is not None:
        _check_task("eval.task", config.eval.task.name, config.eval.task.options)
    warnings = []
    if config.model.arch and config.model.name_or_path != "tiny-random":
        warnings.append(f"model.arch is ignored: it shapes a fresh model (model.name_or_path=tiny-random), and "
                        f"{config.model.name_or_path!r} brings its own architecture")
    r, e = config.rollout, config.eval
    if config.train.max_steps == 0 and not (e.before_after or e.every):
        raise ConfigError("train.max_steps=0 with eval.before_after=false: the run would do nothing; give "
                          "train.max_steps >= 1, or eval.before_after=true to evaluate the initial policy")
    if r.temperature == 0 and r.group_size > 1:
        raise ConfigError(
            f"rollout.temperature=0 samples greedily, so the rollout.group_size={r.group_size} responses to a "
            "prompt would be one and the same: equal rewards, every advantage 0, nothing learned; "
            "set rollout.temperature > 0 (e.g. 1.0) or rollout.group_size=1")
    if e.temperature == 0 and e.samples_per_problem > 1:
        raise ConfigError(
            f"eval.temperature=0 is greedy, so the eval.samples_per_problem={e.samples_per_problem} samples of a "
            "problem would be copies of one (pass@k = pass@1); set eval.samples_per_problem=1 or "
            "eval.temperature > 0")
    return warnings


def _check_task(where: str, name: str, options: dict) -> None:
    from pivotrl.tasks import TASKS  # noqa: F401 - registers the shipped tasks
    from pivotrl.tasks.base import check_task

    try:
        check_task(name, options)
    except KeyError as err:
        raise ConfigError(f"{where}.name: {err.args[0]}") from None
    except ValueError as err:
        raise ConfigError(f"{where}.options: {err}") from None
