"""The single-process RLVR trainer: rollouts -> rewards -> advantages -> clipped policy updates.

One step, top to bottom (Trainer.train_step):
  1. sample G responses for each of P prompts (DAPO dynamic sampling optionally refills
     groups whose rewards are all equal) and score them with the task's verifier;
  2. one forward of the policy (old log-probs, entropies) and, when the method needs it,
     of the frozen reference model;
  3. the estimator turns rewards into token advantages (N,T);
  4. ppo_epochs x num_minibatches updates, every row once per epoch (the last minibatch
     may be smaller): policy forward, policy loss, backward (micro-batches normalised by
     the minibatch's token count), grad clipping, AdamW.
With one epoch, one minibatch and no micro-batching, steps 2 and 4 share a single
forward: on-policy, π_old = π_θ at that point, so its detached log-probs are ℓ^old.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from pivotrl.algorithms import (
    ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    TokenBatch,
    compute_advantages,
    compute_policy_loss,
    default_loss_agg_mode,
    estimator_diagnostics,
    loss_denominators,
)
from pivotrl.algorithms.batch import concat_batches
from pivotrl.algorithms.registry import Entry, Registry, unknown
from pivotrl.errors import ConfigError, TrainingAborted, TrainingInterrupted
from pivotrl.evaluation import evaluate_policy
from pivotrl.modeling.policy import describe, frozen_copy, load_policy
from pivotrl.rewards.safe import safe_score
from pivotrl.rollout import Rollout, concat_rollouts, make_engine, select_rows
from pivotrl.rollout.branching import branch_and_value
from pivotrl.rollout.forward import response_logprobs
from pivotrl.tasks import get_task
from pivotrl.train import checkpoint as ckpt
from pivotrl.train import run_folder
from pivotrl.train.checks import check_config
from pivotrl.train.config import RunConfig, dump_config
from pivotrl.train.interrupts import sigint_stops_after_step
from pivotrl.train.loggers import MetricsLogger, truncate_metrics
from pivotrl.train.sampler_check import SamplerCheck, logprob_diff

#: The held-out evaluation's sampling seed: the same for every run, whatever train.seed, so that
#: the seeds of a comparison start from one "before" accuracy (and end on the same draws).
EVAL_SEED = 10_000


def preflight(config: RunConfig) -> tuple[frozenset[str], frozenset[str]]:
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


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache: int) -> torch.Tensor:
    """DAPO's soft overlong penalty: 0 up to L_max - L_cache, linear to -1 at L_max, -1 beyond."""
    start = max_len - cache
    penalty = (start - lengths.to(torch.float32)) / cache
    return torch.where(lengths <= start, 0.0, torch.where(lengths > max_len, -1.0, penalty))


def _mean_metrics(items: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for m in items for k in m}
    return {k: sum(m[k] for m in items if k in m) / sum(1 for m in items if k in m) for k in keys}


def _clock(seconds: float) -> str:
    """'0:03:07'."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


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
                       pivot_values=torch.tensor([[torch.nan, 0.5, torch.nan]]).expand(n, t))
    if bool((compute_advantages(alg.estimator, probe, **alg.estimator_kwargs) == 0).all()):
        raise ConfigError(
            f"rollout.group_size=1: estimator {alg.estimator!r} gives a response alone in its group a zero "
            "advantage, so the loss and its gradient would be 0 at every step; use rollout.group_size >= 2")
    return (f"rollout.group_size=1: each response is alone in its group, so {alg.estimator!r} has nothing to "
            "compare it with; a lone response's group has mean 0 and std 1 (docs/ALGORITHMS.md), so its reward "
            "itself is its sequence advantage (REINFORCE without a baseline); the group-relative methods are meant "
            "for rollout.group_size >= 2")


class Trainer:
    """Owns the policy, reference, optimizer, data order and RNGs of one run."""

    def __init__(self, config: RunConfig, *, resume: bool = False, overwrite: bool = False,
                 console: Console | None = None) -> None:
        if resume and overwrite:
            raise ConfigError("--resume continues the run in output_dir and --overwrite moves it aside: give one")
        self.config = config
        self.console = console or Console()
        self.out = Path(config.output_dir)
        self.est_needs, self.loss_needs = preflight(config)
        warnings = check_config(config)
        group_warning = check_group_size(config)
        self._lock = run_folder.claim_folder(self.out)  # one writer per folder, until run() ends
        try:
            self._start(config, resume=resume, overwrite=overwrite, warnings=[*warnings, group_warning])
        except BaseException:
            self._lock.release()
            raise

    def _start(self, config: RunConfig, *, resume: bool, overwrite: bool, warnings: list[str | None]) -> None:
        """The rest of __init__, with the run folder locked: check what it holds, load, restore."""
        used = run_folder.run_contents(self.out)
        if used and not (resume or overwrite):
            run_folder.refuse_used_folder(self.out)
        if resume and used:
            run_folder.check_resume(self.out, config)
        for warning in filter(None, warnings):
            self.console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
        cfg = config
        if cfg.train.num_threads:
            torch.set_num_threads(cfg.train.num_threads)
        torch.manual_seed(cfg.train.seed)
        self.task = get_task(cfg.task.name, **cfg.task.options)
        self.train_problems = self.task.problems("train")
        self.eval_task = get_task(cfg.eval.task.name, **cfg.eval.task.options) if cfg.eval.task else self.task
        self.eval_problems = self.eval_task.problems("test")[: cfg.eval.num_problems] if cfg.eval.before_after or cfg.eval.every else []
        if not self.train_problems:
            raise ConfigError(f"task.name={cfg.task.name!r} has no training problems")
        self.model, self.tokenizer = load_policy(cfg.model.name_or_path, dtype=cfg.model.dtype,
                                                 device=cfg.model.device, seed=cfg.train.seed, arch=cfg.model.arch)
        self.ref = None
        if "ref_logprobs" in self.est_needs | self.loss_needs:
            if cfg.model.ref_model is None:
                self.ref = frozen_copy(self.model)
            else:
                self.ref = frozen_copy(load_policy(cfg.model.ref_model, dtype=cfg.model.dtype,
                                                   device=cfg.model.device)[0])
        self.step = 0
        self.elapsed = 0.0
        self.nan_steps = 0
        self.data_generator = torch.Generator().manual_seed(cfg.train.seed + 1)
        self.sample_generator = torch.Generator().manual_seed(cfg.train.seed + 2)
        self.shuffle_generator = torch.Generator().manual_seed(cfg.train.seed + 3)
        self.order = torch.randperm(len(self.train_problems), generator=self.data_generator)
        self.position = 0
        self.before: dict[str, Any] | None = None
        resume_from = self._resume_point() if resume else None
        self.model.train()
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        engine_options: dict[str, Any] = {"max_prompt_tokens": cfg.rollout.max_prompt_tokens}
        if cfg.rollout.engine == "vllm":
            engine_options.update(gpu_memory_utilization=cfg.rollout.gpu_memory_utilization, seed=cfg.train.seed)
        self.engine = make_engine(cfg.rollout.engine, self.model, self.tokenizer, **engine_options)
        self.device = next(self.model.parameters()).device
        self.sampler_check = SamplerCheck(cfg.rollout.max_logprob_diff, cfg.rollout.logprob_diff_patience)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.train.lr, betas=cfg.train.adam_betas,
                                           weight_decay=cfg.train.weight_decay)
        if resume_from is not None:
            path, state = resume_from
            self._load_state(path, state)
            self.console.print(f"resumed from {path} (step {self.step})", soft_wrap=True)
        elif resume and used:
            self.console.print(f"--resume: no checkpoint in {self.out / 'checkpoints'}; starting from step 0 "
                               "(the logged steps are dropped)", soft_wrap=True)
        elif resume:
            self.console.print(f"--resume: {self.out} holds no run yet; starting a new one", soft_wrap=True)
        if overwrite and used:
            aside, self._lock = run_folder.move_aside_locked(self.out, self._lock)
            self.console.print(f"--overwrite: moved the previous run in {self.out} to {aside}", soft_wrap=True)
        truncate_metrics(self.out / "metrics.jsonl", self.step)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "config.yaml").write_text(dump_config(config))
        self.logger = MetricsLogger(self.out, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb,
                                    mlflow=cfg.log.mlflow, config=config.model_dump(mode="json"),
                                    run_name=self.out.name)

    # -- schedule, data ------------------------------------------------------
    def _lr_factor(self, step: int) -> float:
        """Linear warm-up, then cosine decay to min_lr_ratio: a pure function of the step."""
        t = self.config.train
        if t.warmup_steps and step < t.warmup_steps:
            return (step + 1) / t.warmup_steps
        span = max(t.max_steps - t.warmup_steps, 1)
        progress = min(max(step - t.warmup_steps, 0) / span, 1.0)
        return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def next_problems(self, count: int) -> list:
        """The next `count` training problems in the run's shuffled order (reshuffled each epoch)."""
        picked = []
        while len(picked) < count:
            if self.position >= len(self.order):
                self.order = torch.randperm(len(self.train_problems), generator=self.data_generator)
                self.position = 0
            take = min(count - len(picked), len(self.order) - self.position)
            picked.extend(self.train_problems[i] for i in self.order[self.position : self.position + take].tolist())
            self.position += take
        return picked

    def prompts_for(self, problems: list) -> list[str]:
        """The model-facing text of each problem (plain template or the tokenizer's chat template)."""
        chat = self.config.model.chat_template
        return [self.task.format_prompt(p, self.tokenizer, chat=chat) for p in problems]

    # -- one step -------------------------------------------------------------
    def collect(self) -> tuple[Rollout | None, torch.Tensor | None, torch.Tensor | None, list, dict[str, float]]:
        """Rollouts, shaped rewards (N,), raw verifier scores (N,) and each row's answer, with DAPO dynamic sampling."""
        r = self.config.rollout
        parts, score_parts, answers, kept_groups, sampled_groups, rounds, generated = [], [], [], 0, 0, 0, 0
        while True:
            need = r.prompts_per_step - kept_groups if r.dynamic_sampling else r.prompts_per_step
            problems = self.next_problems(need)
            rollout = self.engine.generate(self.prompts_for(problems), r.group_size, max_new_tokens=r.max_new_tokens,
                                           temperature=r.temperature, top_p=r.top_p, generator=self.sample_generator)
            row_answers = [p.answer for p in problems for _ in range(r.group_size)]
            scores = self.verify(rollout.texts, row_answers)
            sampled_groups += len(problems)
            generated += int(rollout.response_mask.sum())
            if r.dynamic_sampling:
                grouped = scores.view(-1, r.group_size)
                mixed = (grouped.max(dim=1).values != grouped.min(dim=1).values).nonzero().squeeze(1)
                rows = (mixed.unsqueeze(1) * r.group_size + torch.arange(r.group_size)).reshape(-1)
                rollout, scores = select_rows(rollout, rows), scores[rows]
                row_answers = [row_answers[i] for i in rows.tolist()]
                kept_groups += mixed.numel()
            if rollout.texts:
                parts.append(rollout)
                score_parts.append(scores)
                answers.extend(row_answers)
            rounds += 1
            if not r.dynamic_sampling or kept_groups >= r.prompts_per_step or rounds > r.max_resample_rounds:
                break
        info = {"rollout/sampled_groups": float(sampled_groups), "rollout/rounds": float(rounds),
                "rollout/tokens_generated": float(generated)}
        if not parts:
            return None, None, None, [], info
        rollout = concat_rollouts(parts, self.tokenizer.pad_token_id)
        scores = torch.cat(score_parts)
        return rollout, self.shaped(scores, rollout.response_mask.sum(dim=1).cpu()), scores, answers, info

    def verify(self, texts: list[str], answers: list) -> torch.Tensor:
        """The task verifier's score of each response text (N,) float32 (0 for one that cannot be scored)."""
        return torch.tensor([safe_score(self.task.verifier, text, answer) for text, answer in
                             zip(texts, answers, strict=True)], dtype=torch.float32)

    def shaped(self, scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The rewards the estimator sees: the scores, plus DAPO's overlong penalty when it is on."""
        r = self.config.rollout
        if not r.overlong_shaping:
            return scores.clone()
        return scores + overlong_penalty(lengths, r.max_new_tokens, r.overlong_cache)

    def _forward(self, model: torch.nn.Module, rollout: Rollout, rows: torch.Tensor | None = None,
                 entropies: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        m, r = self.config.model, self.config.rollout
        return response_logprobs(model, rollout, rows, temperature=r.temperature, chunk_size=m.logprob_chunk_size,
                                 entropies=entropies)

    def _forward_all_no_grad(self, model: torch.nn.Module, rollout: Rollout,
                             entropies: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probs, entropies or None) of every response, in micro-batches, without gradients."""
        n = rollout.response_ids.shape[0]
        size = self.config.train.micro_batch_size or n
        with torch.no_grad():
            outs = [self._forward(model, rollout, torch.arange(i, min(i + size, n)), entropies)
                    for i in range(0, n, size)]
        return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs]) if entropies else None

    def _single_forward(self, n: int) -> bool:
        """True when the step makes one update from one forward of all n rows (one epoch, one
        minibatch, no micro-batching): that forward then also gives ℓ^old, since π_θ = π_old there."""
        t = self.config.train
        branches_join = self.config.rollout.branch.pivots and self.config.rollout.branch.train_on_branches
        return (t.ppo_epochs == 1 and t.num_minibatches == 1 and not branches_join
                and (t.micro_batch_size is None or t.micro_batch_size >= n))

    def _sync(self) -> None:
        """Wait for the GPU's queued work, so that a phase's time is its own."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def train_step(self) -> dict[str, Any]:
        """One RLVR step, in the phases of the module docstring; returns its metrics."""
        start = time.perf_counter()
        lr = self.config.train.lr * self._lr_factor(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

        # 1. rollout: G responses to each of P prompts, scored by the task's verifier
        rollout, rewards, scores, answers, info = self.collect()
        info = {"step": self.step + 1, "lr": lr, **info}
        if rollout is None:  # dynamic sampling found no group with mixed rewards
            return {**info, "skipped": True, "time/step_s": time.perf_counter() - start}
        self._sync()
        return self.learn_from(rollout, rewards, scores, answers,
                               {**info, "time/rollout_s": time.perf_counter() - start})

    def learn_from(self, rollout: Rollout, rewards: torch.Tensor, scores: torch.Tensor, answers: list,
                   metrics: dict[str, Any]) -> dict[str, Any]:
        """Phases 2-5 of a step on a scored rollout; returns `metrics` with the step's added."""
        alg = self.config.algorithm
        start = time.perf_counter()

        # 2. forwards: ℓ^ref, then ℓ^old and H of the policy before any update
        batch, kept = self.token_batch(rollout, rewards)
        if rollout.sampler_logprobs is not None:  # does the engine sample from this policy?
            metrics["rollout/logprob_diff"] = logprob_diff(rollout.sampler_logprobs, batch.old_logprobs,
                                                           batch.response_mask)
            self.sampler_check.observe(metrics["rollout/logprob_diff"], self.step + 1)
        self._sync()
        t_forward = time.perf_counter()

        # 3. branches at the pivots (rollout.branch.pivots > 0): V̂ before each pivot token
        if self.config.rollout.branch.pivots:
            rollout, batch, branch_metrics = self.branch(rollout, batch, answers)
            metrics.update(branch_metrics)
            metrics["rollout/tokens_generated"] += branch_metrics["rollout/branch_tokens"]
        self._sync()
        t_branch = time.perf_counter()

        # 4. estimator: the token advantages (N,T)
        advantages = compute_advantages(alg.estimator, batch, **alg.estimator_kwargs)
        self._sync()
        t_estimator = time.perf_counter()

        # 5. updates: ppo_epochs x minibatches, every row once per epoch
        update = self.update(rollout, batch, advantages, kept)
        self._sync()
        end = time.perf_counter()

        step_s = metrics.get("time/rollout_s", 0.0) + end - start
        metrics.update({
            "rollout/rows": float(batch.num_responses),
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "accuracy": float((scores >= 1.0).float().mean()),
            "truncated/frac": float(rollout.truncated.float().mean()),
            **estimator_diagnostics(batch, advantages),
            **update,
            "time/forward_s": t_forward - start,
            "time/branch_s": t_branch - t_forward,
            "time/estimator_s": t_estimator - t_branch,
            "time/update_s": end - t_estimator,
            "time/step_s": step_s,
            "tokens_per_s": float(batch.lengths.sum()) / step_s if step_s > 0 else 0.0,
        })
        return metrics

    def token_batch(self, rollout: Rollout, rewards: torch.Tensor) -> tuple[TokenBatch, tuple | None]:
        """The TokenBatch of a scored rollout (ℓ^ref when the method reads it; ℓ^old and H always), and
        the single forward's (ℓ^θ, H^θ) with their graph when one forward serves the update too."""
        device = rollout.response_ids.device
        needs_ref = "ref_logprobs" in self.est_needs | self.loss_needs
        ref_lp = self._forward_all_no_grad(self.ref, rollout, entropies=False)[0] if needs_ref else None
        kept = self._forward(self.model, rollout) if self._single_forward(rollout.response_ids.shape[0]) else None
        if kept is not None:
            old_lp, entropies = kept[0].detach(), kept[1].detach()
        else:
            old_lp, entropies = self._forward_all_no_grad(self.model, rollout)
        batch = TokenBatch(rewards.to(device), rollout.group_index.to(device), rollout.response_mask, old_lp,
                           ref_logprobs=ref_lp, entropies=entropies)
        return batch, kept

    def branch(self, rollout: Rollout, batch: TokenBatch, answers: list) -> tuple[Rollout, TokenBatch, dict]:
        """Branches at each response's pivots: the batch gains pivot_values and, with
        rollout.branch.train_on_branches, the branches as responses (each pivot's K in one group)."""
        r, b = self.config.rollout, self.config.rollout.branch

        def reward_of(parents: torch.Tensor, texts: list[str], lengths: torch.Tensor) -> torch.Tensor:
            return self.shaped(self.verify(texts, [answers[i] for i in parents.tolist()]), lengths)

        values, found, branch_rewards = branch_and_value(
            self.engine, rollout, batch.entropies, batch.rewards, reward_of, pivots=b.pivots, spacing=b.spacing,
            branches=b.branches, max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
            generator=self.sample_generator)
        metrics = {"rollout/branch_tokens": float(found.tokens if found else 0),
                   "rollout/pivots_per_response": float((~values.isnan()).sum()) / batch.num_responses}
        batch = replace(batch, pivot_values=values)
        if not (b.train_on_branches and found):
            return rollout, batch, metrics
        joint = concat_rollouts([rollout, found.rollout], self.tokenizer.pad_token_id)
        batch = concat_batches([batch, self.token_batch(found.rollout, branch_rewards.to(batch.rewards.device))[0]])
        return joint, batch, {**metrics, "rollout/branch_rows_trained": float(found.rollout.response_ids.shape[0])}

    def update(self, rollout: Rollout, batch: TokenBatch, advantages: torch.Tensor,
               kept: tuple | None) -> dict[str, float]:
        """ppo_epochs x minibatches x micro-batches of policy forward, loss, backward and AdamW step.

        Every row is trained on once per epoch (the last minibatch may be smaller); the
        micro-batches of a minibatch share its loss denominators, so their gradients sum to
        the minibatch's. `kept` is the single forward of token_batch, used instead of a new one.
        """
        cfg, alg = self.config, self.config.algorithm
        mode = alg.loss_agg_mode or default_loss_agg_mode(alg.policy_loss)
        n = batch.num_responses
        device = batch.response_mask.device
        micro = cfg.train.micro_batch_size or n
        loss_metrics: list[dict[str, float]] = []
        grad_norms: list[float] = []
        bad = False
        rows_per_epoch = 0
        for _ in range(cfg.train.ppo_epochs):
            order = torch.randperm(n, generator=self.shuffle_generator).to(device)
            rows_per_epoch = 0
            for rows in order.tensor_split(cfg.train.num_minibatches):
                if len(rows) == 0:  # fewer rows than minibatches
                    continue
                denominators = loss_denominators(batch.response_mask[rows], mode)
                self.optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for part in rows.split(micro):
                    logprobs, entropies_new = (kept[0][part], kept[1][part]) if kept is not None else \
                        self._forward(self.model, rollout, part)
                    loss, lm = compute_policy_loss(
                        alg.policy_loss, batch.select(part), advantages=advantages[part], logprobs=logprobs,
                        entropies_new=entropies_new, loss_agg_mode=mode, max_len=batch.response_mask.shape[1],
                        **denominators, **alg.loss_kwargs)
                    loss.backward()
                    total += float(loss.detach())
                    loss_metrics.append(lm)
                bad |= self._clip_and_step(total, grad_norms)
                rows_per_epoch += len(rows)
        self.nan_steps = self.nan_steps + 1 if bad else 0
        out = {**_mean_metrics(loss_metrics), "grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
               "train/rows_per_epoch": float(rows_per_epoch), "train/updates": float(len(grad_norms))}
        if bad:
            out["skipped"] = True
        return out

    def _clip_and_step(self, loss_value: float, grad_norms: list[float]) -> bool:
        """Clip and apply the gradients; skip the update (True) when the loss or gradient is not finite."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.config.train.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else float("inf"))
        grad_norms.append(float(norm))
        if not math.isfinite(loss_value) or not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return True
        self.optimizer.step()
        self.engine.sync_weights()  # the next rollout samples from the updated policy
        return False

    # -- evaluation -----------------------------------------------------------
    def evaluate(self, tag: str) -> dict[str, Any]:
        """Held-out evaluation of the current policy; writes eval/<tag>.json and eval/<tag>_samples.jsonl."""
        e, r = self.config.eval, self.config.rollout
        chat = self.config.model.chat_template
        prompts = [self.eval_task.format_prompt(p, self.tokenizer, chat=chat) for p in self.eval_problems]
        result = evaluate_policy(
            self.engine, self.eval_task, self.eval_problems, prompts=prompts,
            samples_per_problem=e.samples_per_problem, temperature=e.temperature,
            max_new_tokens=e.max_new_tokens or r.max_new_tokens, batch_size=e.batch_size,
            seed=EVAL_SEED, samples_path=self.out / "eval" / f"{tag}_samples.jsonl",
            progress=self._eval_progress(tag),
        )
        (self.out / "eval" / f"{tag}.json").write_text(json.dumps(result, indent=2))
        return result

    # -- checkpoints ----------------------------------------------------------
    def save(self) -> Path:
        """Checkpoint the current step atomically."""
        state = {
            "step": self.step, "elapsed": self.elapsed, "nan_steps": self.nan_steps,
            "optimizer": self.optimizer.state_dict(),
            "rng": ckpt.rng_states(), "data_generator": self.data_generator.get_state(),
            "sample_generator": self.sample_generator.get_state(),
            "shuffle_generator": self.shuffle_generator.get_state(),
            "order": self.order, "position": self.position, "before": self.before,
            "sampler_streak": self.sampler_check.streak,
        }
        return ckpt.save_checkpoint(self.out / "checkpoints", self.step, model=self.model, tokenizer=self.tokenizer,
                                    state=state, keep=self.config.checkpoint.keep)

    def _resume_point(self) -> tuple[Path, dict[str, Any]] | None:
        """Load the weights of the newest intact checkpoint; return it and its trainer state.

        A damaged or unsafe checkpoint is skipped with a warning that names it, and set aside
        (renamed step-N.damaged, which nothing loads or rotates) once an older one is usable.
        When checkpoints exist but none is intact, CheckpointError lists what is wrong with each.
        """
        found = ckpt.list_checkpoints(self.out / "checkpoints")
        unusable: list[tuple[Path, str]] = []
        for path in reversed(found):
            try:
                ckpt.check_model_file(path)
                state = ckpt.load_state(path)
                model = self._load_weights(path)
            except ckpt.CheckpointError as err:
                unusable.append((path, str(err)))
                continue
            for bad, why in unusable:
                aside = bad.with_name(f"{bad.name}.damaged")
                bad.rename(aside)
                self.console.print(f"[yellow]warning:[/] checkpoint {bad.name} is not usable ({why}); "
                                   f"set aside as {aside.name}, resuming from the older {path.name}", soft_wrap=True)
            self.model = model
            return path, state
        if unusable:
            raise ckpt.CheckpointError(f"no intact checkpoint in {self.out / 'checkpoints'}: "
                                       + "; ".join(why for _, why in unusable))
        return None

    def _load_weights(self, path: Path) -> torch.nn.Module:
        """The policy with the weights of checkpoint `path` (safetensors only: nothing in it can run)."""
        from transformers import AutoModelForCausalLM

        from pivotrl.modeling.quiet import quiet_loading

        device, dtype = next(self.model.parameters()).device, next(self.model.parameters()).dtype
        try:
            with quiet_loading():
                model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, use_safetensors=True)
        except Exception as err:  # noqa: BLE001 - whatever the damage, this checkpoint cannot be used
            raise ckpt.CheckpointError(f"{path}: cannot load the model ({ckpt.first_line(err)})") from None
        return model.to(device)

    def _load_state(self, path: Path, state: dict[str, Any]) -> None:
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            ckpt.restore_rng_states(state["rng"])
            self.data_generator.set_state(state["data_generator"])
            self.sample_generator.set_state(state["sample_generator"])
            self.shuffle_generator.set_state(state["shuffle_generator"])
            self.order, self.position = state["order"], int(state["position"])
            self.step, self.elapsed, self.nan_steps = int(state["step"]), float(state["elapsed"]), int(state["nan_steps"])
            self.before = state["before"]
            self.sampler_check.streak = int(state.get("sampler_streak", 0))  # checkpoints before 2026-12-04: 0
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise ckpt.CheckpointError(f"{path}: its trainer state does not fit this run "
                                       f"({ckpt.first_line(err)})") from None

    # -- the loop -------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to train.max_steps (evaluating and checkpointing on the way); returns the summary.

        Ctrl-C (SIGINT) during the steps finishes the current step, saves a checkpoint and
        raises TrainingInterrupted; a second Ctrl-C, or one outside the steps, stops at once
        (TrainingInterrupted names the newest checkpoint to resume from).
        """
        cfg = self.config
        self.console.print(f"[bold]pivotrl train[/] {cfg.algorithm.estimator} + {cfg.algorithm.policy_loss} on "
                           f"{cfg.task.name}: {describe(self.model)}; output {self.out}", soft_wrap=True)
        started = time.perf_counter()
        elapsed_before = self.elapsed
        try:
            with sigint_stops_after_step() as stop:
                if cfg.eval.before_after and self.before is None:
                    self.before = self.evaluate("step-000000")
                    self.console.print(f"held-out accuracy before: {self.before['accuracy']:.3f}")
                with self._progress() as progress:
                    task_id = progress.add_task("train", total=cfg.train.max_steps, completed=self.step, reward="")
                    first_step, loop_started = self.step, time.perf_counter()
                    stop.defer = True  # from here on, a first Ctrl-C waits for the step (and a save) to end
                    while self.step < cfg.train.max_steps:
                        metrics = self.train_step()
                        self.step += 1
                        self.elapsed = elapsed_before + time.perf_counter() - started
                        if self.nan_steps >= cfg.train.max_nan_steps:
                            raise TrainingAborted(
                                f"{self.nan_steps} consecutive steps with a NaN/inf loss or gradient at step {self.step}: "
                                f"stopped; the last checkpoint in {self.out / 'checkpoints'} is intact. "
                                "Lower train.lr or check the reward function.")
                        if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.train.max_steps:
                            result = self.evaluate(f"step-{self.step:06d}")
                            metrics.update({f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))})
                        self.logger.log(metrics)
                        progress.update(task_id, advance=1, reward=f"reward {metrics.get('reward/mean', float('nan')):.3f}")
                        now = time.perf_counter()
                        self._plain_progress(metrics, (now - loop_started) / (self.step - first_step), now - started)
                        if stop.requested:
                            path = self.save()
                            raise TrainingInterrupted(
                                f"interrupted: saved step {self.step} of {cfg.train.max_steps} to {path}; "
                                "rerun the same command with --resume to continue")
                        if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                            self.save()
                    path = self.save()
                    stop.defer = False
                    if stop.requested:
                        raise TrainingInterrupted(
                            f"interrupted: saved the last step ({self.step}) to {path}; rerun the same command "
                            "with --resume to run the final evaluation and write summary.json")
                summary = self._finish(elapsed_before + time.perf_counter() - started)
        except KeyboardInterrupt:
            raise TrainingInterrupted(self._interrupted_message()) from None
        finally:
            self.logger.close()
            self._lock.release()
        return summary

    def _interrupted_message(self) -> str:
        latest = ckpt.latest_checkpoint(self.out / "checkpoints")
        if latest is None:
            return f"interrupted at step {self.step}, before the first checkpoint: a rerun starts from step 0"
        saved = int(latest.name[len(ckpt.PREFIX):])
        return (f"interrupted at step {self.step}; the newest checkpoint, {latest}, holds step {saved}: "
                "rerun the same command with --resume to continue from it")

    def _progress(self) -> Progress:
        """The live bar (a terminal only: elsewhere it would print nothing until the end; see _plain_progress)."""
        live = self.config.log.progress and self.console.is_terminal
        return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[reward]}"), TimeElapsedColumn(), TextColumn("ETA"),
                        TimeRemainingColumn(), console=self.console, disable=not live)

    def _plain_progress(self, metrics: dict[str, Any], per_step: float, seconds: float) -> None:
        """Every log.print_every steps, one plain line, when the output is not a terminal (a log file)."""
        log, total = self.config.log, self.config.train.max_steps
        if not log.progress or self.console.is_terminal:
            return
        if self.step % log.print_every and self.step != total:
            return
        eta = per_step * (total - self.step)
        self.console.print(
            f"step {self.step}/{total}  reward {metrics.get('reward/mean', float('nan')):.3f}  "
            f"accuracy {metrics.get('accuracy', float('nan')):.3f}  {per_step:.2f} s/step  "
            f"elapsed {_clock(seconds)}  ETA {_clock(eta)}", soft_wrap=True, highlight=False)

    def _eval_progress(self, tag: str):
        """A callback printing one line per evaluated batch (only when an evaluation spans several batches)."""
        started = time.perf_counter()

        def report(done: int, total: int) -> None:
            if self.config.log.progress and done < total:
                self.console.print(f"evaluating {tag}: {done}/{total} problems, {_clock(time.perf_counter() - started)}",
                                   soft_wrap=True, highlight=False)

        return report

    def _finish(self, wall_time: float) -> dict[str, Any]:
        summary: dict[str, Any] = {"steps": self.step, "estimator": self.config.algorithm.estimator,
                                   "policy_loss": self.config.algorithm.policy_loss, "wall_time_s": wall_time}
        if self.config.eval.before_after:
            after = self.evaluate(f"step-{self.step:06d}")
            before = self.before or {}
            summary.update({
                "heldout_accuracy_before": before.get("accuracy"), "heldout_accuracy_after": after["accuracy"],
                "mean_length_before": before.get("mean_length"), "mean_length_after": after["mean_length"],
                "eval_problems": after["num_problems"], "eval_samples_per_problem": after["samples_per_problem"],
            })
            title = f"held-out {self.eval_task.name} ({after['num_problems']} problems)"
            table = Table(title=title, min_width=len(title))  # the title on one line, also in a log file
            for col in ("", "before", "after"):
                table.add_column(col, justify="right")
            table.add_row("accuracy", f"{before.get('accuracy', float('nan')):.3f}", f"{after['accuracy']:.3f}")
            table.add_row("mean length", f"{before.get('mean_length', float('nan')):.1f}", f"{after['mean_length']:.1f}")
            for key in sorted(k for k in after if k.startswith("mean_") and k != "mean_length"):  # the task's counts
                summary[f"{key}_before"], summary[f"{key}_after"] = before.get(key), after[key]
                table.add_row(key.removeprefix("mean_").replace("_", " ") + " per response",
                              f"{before.get(key, float('nan')):.2f}", f"{after[key]:.2f}")
            self.console.print(table)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        self.console.print(f"wall time {wall_time:.0f} s; summary in {self.out / 'summary.json'}")
        return summary
