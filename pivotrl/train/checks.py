"""Checks of a run's config that need no model and no data: run before anything is loaded or written.

:func:`check_run` is the one entry point (the trainer and `compare` both call it). It runs, in order:

- :func:`check_algorithm`: the estimator, policy loss and aggregation exist, their
  hyperparameters are valid, and what they read can be provided (a reference model, branches).
- :func:`check_config`: the device exists on this machine, vLLM is installed where
  rollout.engine=vllm, peft where model.lora is set (on a base model a folder holds), the task
  and its options exist (with the did-you-mean hint), and no setting makes the run degenerate:
  sampling at temperature 0 with several responses per prompt gives every response of a group
  the same text, hence equal rewards and all-zero advantages (nothing is learned), and k greedy
  evaluation samples are k copies of one. Both are refused. A model.arch next to a model that brings its own architecture is warned
  about (it is ignored).
- :func:`check_group_size`: a group of one response is refused where nothing could be learned,
  and warned about otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pivotrl.algorithms import (
    ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    TokenBatch,
    compute_advantages,
)
from pivotrl.algorithms.registry import Entry, Registry, unknown
from pivotrl.errors import ConfigError
from pivotrl.modeling.devices import check_device, cpu_has_fast_bf16
from pivotrl.modeling.policy import resolve_device
from pivotrl.rollout.vllm import check_vllm_installed
from pivotrl.train.config import RunConfig


@dataclass(frozen=True)
class RunChecks:
    """What the checks found: what the estimator and the policy loss read, and warnings to print."""

    estimator_needs: frozenset[str]
    loss_needs: frozenset[str]
    warnings: list[str]

    @property
    def needs_ref(self) -> bool:
        """Whether the estimator or the loss reads the reference model's log-probs."""
        return "ref_logprobs" in self.estimator_needs | self.loss_needs


def check_run(config: RunConfig) -> RunChecks:
    """ConfigError naming the first setting of `config` that cannot work or would make the run
    degenerate; else what the run's estimator and loss read, and the warnings to print."""
    estimator_needs, loss_needs = check_algorithm(config)
    warnings = check_config(config)
    group_warning = check_group_size(config)
    return RunChecks(estimator_needs, loss_needs, [*warnings, *filter(None, [group_warning])])


def check_config(config: RunConfig) -> list[str]:
    """ConfigError naming the first bad device, task or degenerate sampling setting; returns
    warnings (one sentence each) about settings that will be ignored."""
    try:
        check_device(config.model.device, "model.device")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if config.rollout.engine == "vllm":
        check_vllm_installed(resolve_device(config.model.device).type)
    _check_task("task", config.task.name, config.task.options)
    if config.eval.task is not None:
        _check_task("eval.task", config.eval.task.name, config.eval.task.options)
    warnings = []
    if (config.model.dtype != "float32" and resolve_device(config.model.device).type == "cpu"
            and not cpu_has_fast_bf16()):
        warnings.append(f"model.dtype={config.model.dtype} on a CPU without AVX512-BF16 or AMX: its matmuls are "
                        "emulated, about 15x slower than float32 on an AVX2-only CPU (docs/PERFORMANCE.md); "
                        "model.dtype=float32 is faster on this machine")
    _check_lora(config)
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


def _check_lora(config: RunConfig) -> None:
    """ConfigError when model.lora is set and cannot work here: peft missing, or a base model that no folder
    holds (a checkpoint's adapter names its base by path)."""
    if config.model.lora is None:
        return
    from pivotrl.modeling.lora import INSTALL, peft_installed

    if not peft_installed():
        raise ConfigError(f"model.lora needs peft: {INSTALL}")
    if config.model.name_or_path == "tiny-random":
        raise ConfigError("model.lora with model.name_or_path=tiny-random: a LoRA checkpoint names its base model by "
                          "its folder, and tiny-random is built at run time; use tiny (or another model folder), "
                          "or unset model.lora")


def check_algorithm(config: RunConfig) -> tuple[frozenset[str], frozenset[str]]:
    """Check the algorithm section before anything is loaded; return (estimator, loss) requirements."""
    alg = config.algorithm

    def lookup(key: str, registry: Registry) -> Entry:
        try:
            return registry.lookup(getattr(alg, key))
        except ValueError as err:
            raise ConfigError(f"algorithm.{key}: {err}") from None

    estimator, loss = lookup("estimator", ESTIMATORS), lookup("policy_loss", POLICY_LOSSES)
    if alg.loss_agg_mode is not None and alg.loss_agg_mode not in LOSS_AGG_MODES:
        raise ConfigError(f"algorithm.loss_agg_mode: {unknown('loss_agg_mode', alg.loss_agg_mode, LOSS_AGG_MODES)}")
    try:
        est_needs = estimator.requirements(alg.estimator_kwargs)
    except ValueError as err:
        raise ConfigError(f"algorithm.estimator_kwargs: {err}") from None
    try:
        loss_needs = loss.requirements(alg.loss_kwargs)
    except ValueError as err:
        raise ConfigError(f"algorithm.loss_kwargs: {err}") from None
    if "entropies_new" in loss_needs and config.train.ppo_epochs * config.train.num_minibatches == 1:
        raise ConfigError(
            f"the {alg.policy_loss} loss's KL mask fires where the current policy's entropy is below the rollout "
            "policy's, and the two are equal on the only update of a rollout: set train.num_minibatches=2 "
            "(or train.ppo_epochs=2), or algorithm.loss_kwargs.beta_kl=0 to drop the masked KL"
        )
    if "pivot_values" in est_needs and config.rollout.branch.pivots == 0:
        raise ConfigError(f"{alg.estimator!r} reads the values of branches sampled at the pivots, and "
                          "rollout.branch.pivots is 0: set rollout.branch.pivots >= 1 (see configs/pivot_mc.yaml)")
    if "ref_logprobs" in est_needs | loss_needs and config.model.ref_model == "none":
        who = alg.estimator if "ref_logprobs" in est_needs else alg.policy_loss
        raise ConfigError(
            f"{who!r} needs a reference model but model.ref_model is 'none': unset model.ref_model "
            "(the initial policy is used) or give a path"
        )
    return est_needs, loss_needs


def check_group_size(config: RunConfig) -> str | None:
    """For rollout.group_size=1: ConfigError where nothing could be learned, else a warning to print.

    A group of one response has mean 0 and std 1 (docs/ALGORITHMS.md, as verl does), so the
    shipped estimators still give it an advantage (GRPO: the raw reward, i.e. REINFORCE without
    a baseline): legal, but not the group comparison these methods are built on; warn. An
    estimator that gives every one-response group a zero advantage would make the loss and its
    gradient 0 at every step; whether it does is measured, not listed (on four one-response
    groups with mixed rewards), and is refused. Dynamic sampling drops every one-response group
    (its rewards are always all equal): refused too.
    """
    r, alg = config.rollout, config.algorithm
    if r.group_size > 1:
        return None
    if r.dynamic_sampling:
        raise ConfigError("rollout.group_size=1 with rollout.dynamic_sampling=true: a one-response group never has "
                          "mixed rewards, so every group would be dropped; use rollout.group_size >= 2")
    n, t = 4, 3
    probe = TokenBatch(rewards=torch.tensor([1.0, 0.0, 1.0, 0.5]), group_index=torch.arange(n),
                       response_mask=torch.ones(n, t, dtype=torch.bool),
                       old_logprobs=-torch.linspace(0.1, 2.0, n * t).view(n, t),
                       ref_logprobs=-torch.linspace(0.3, 1.5, n * t).view(n, t),
                       entropies=torch.tensor([[0.1, 2.0, 0.4], [1.5, 0.2, 2.5], [0.7, 3.0, 0.05], [1.1, 0.9, 2.2]]),
                       pivot_values=torch.tensor([[torch.nan, 0.5, torch.nan]]).expand(n, t),
                       free_mask=torch.tensor([[0.0, 1.0, 0.0]]).expand(n, t),
                       reachable=torch.tensor([[1.0, 1.0, 0.0]]).expand(n, t))
    if bool((compute_advantages(alg.estimator, probe, **alg.estimator_kwargs) == 0).all()):
        raise ConfigError(
            f"rollout.group_size=1: estimator {alg.estimator!r} gives a response alone in its group a zero "
            "advantage, so the loss and its gradient would be 0 at every step; use rollout.group_size >= 2")
    return (f"rollout.group_size=1: each response is alone in its group, so {alg.estimator!r} has nothing to "
            "compare it with; a lone response's group has mean 0 and std 1 (docs/ALGORITHMS.md), so its reward "
            "itself is its sequence advantage (REINFORCE without a baseline); the group-relative methods are meant "
            "for rollout.group_size >= 2")


def _check_task(where: str, name: str, options: dict) -> None:
    from pivotrl.tasks import TASKS  # noqa: F401 - registers the shipped tasks
    from pivotrl.tasks.base import check_task

    try:
        check_task(name, options)
    except KeyError as err:
        raise ConfigError(f"{where}.name: {err.args[0]}") from None
    except ValueError as err:
        raise ConfigError(f"{where}.options: {err}") from None
