"""The single-process RLVR trainer: rollouts -> rewards -> advantages -> clipped policy updates.

One step, top to bottom (Trainer.train_step), each phase timed as `time/<phase>_s`:
  1. rollout: sample G responses for each of P prompts (DAPO dynamic sampling optionally
     refills groups whose rewards are all equal) and score them with the task's verifier;
  2. forward: one forward of the policy (old log-probs, entropies) and, when the method
     needs it, of the frozen reference model (with model.lora: the policy with its adapter off);
  3. branch (rollout.branch.pivots > 0): K continuations before each response's pivots,
     whose mean reward is V̂ there (pivot_mc);
  4. estimator: rewards -> token advantages (N,T);
  5. update: ppo_epochs x num_minibatches updates, every row once per epoch (the last
     minibatch may be smaller): policy forward, policy loss, backward (micro-batches
     normalised by the minibatch's token count), grad clipping, AdamW.
With one epoch, one minibatch and no micro-batching, phases 2 and 5 share a single
forward: on-policy, π_old = π_θ at that point, so its detached log-probs are ℓ^old.

Run checks live in train/checks.py, reward shaping in train/rewards.py, checkpoint files in
train/checkpoint.py, the progress bar and summary table in pivotrl/progress.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from pivotrl.algorithms import (
    TokenBatch,
    compute_advantages,
    estimator_diagnostics,
)
from pivotrl.errors import ConfigError, TrainingAborted, TrainingInterrupted
from pivotrl.evaluation import evaluate_policy
from pivotrl.modeling.lora import add_lora
from pivotrl.modeling.policy import (
    compute_precision,
    describe,
    frozen_copy,
    load_policy,
    model_location,
)
from pivotrl.modeling.prompt_form import prompt_form
from pivotrl.progress import TrainProgress, heldout_table, task_counts
from pivotrl.rollout import Rollout, make_engine
from pivotrl.rollout.branching import Branches
from pivotrl.rollout.forward import response_logprobs, response_logprobs_no_grad
from pivotrl.rollout.marks import MARK_FIELDS, TokenPieces, rollout_marks
from pivotrl.tasks import get_task
from pivotrl.train import before_cache, run_folder
from pivotrl.train import checkpoint as ckpt
from pivotrl.train.branches import branch_phase
from pivotrl.train.checks import check_run
from pivotrl.train.collect import Collected, collect
from pivotrl.train.config import RunConfig, dump_config
from pivotrl.train.interrupts import sigint_stops_after_step
from pivotrl.train.loggers import MetricsLogger, truncate_metrics
from pivotrl.train.rewards import score_texts, shape_rewards
from pivotrl.train.sampler_check import SamplerCheck, logprob_diff, sampler_bound
from pivotrl.train.schedule import ProblemStream, lr_factor
from pivotrl.train.update import update_policy

#: The held-out evaluation's sampling seed, on every engine: the same for every run, whatever train.seed
#: or method, so that the runs of a comparison start from the same "before" draws (and their "after"
#: draws share one random stream; the vllm engine seeds each request from it).
EVAL_SEED = 10_000


class Trainer:
    """Owns the policy, reference, optimizer, data order and RNGs of one run."""

    def __init__(self, config: RunConfig, *, resume: bool = False, overwrite: bool = False,
                 console: Console | None = None) -> None:
        if resume and overwrite:
            raise ConfigError("--resume continues the run in output_dir and --overwrite moves it aside: give one")
        self.config = config
        self.console = console or Console()
        self.out = Path(config.output_dir)
        self.checks = check_run(config)
        self._lock = run_folder.claim_folder(self.out)  # one writer per folder, until run() ends
        try:
            self._start(config, resume=resume, overwrite=overwrite)
        except BaseException:
            self._lock.release()
            raise

    def _start(self, cfg: RunConfig, *, resume: bool, overwrite: bool) -> None:
        """The rest of __init__, with the run folder locked: check what it holds, load, restore."""
        used = run_folder.run_contents(self.out)
        if used and not (resume or overwrite):
            run_folder.refuse_used_folder(self.out)
        if resume and used:
            run_folder.check_resume(self.out, cfg)
        for warning in self.checks.warnings:
            self.console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
        if cfg.train.num_threads:
            torch.set_num_threads(cfg.train.num_threads)
        torch.manual_seed(cfg.train.seed)
        self.task = get_task(cfg.task.name, **cfg.task.options)
        self.train_problems = self.task.problems("train")
        self.eval_task = get_task(cfg.eval.task.name, **cfg.eval.task.options) if cfg.eval.task else self.task
        evaluates = cfg.eval.before_after or cfg.eval.every
        self.eval_problems = self.eval_task.problems("test")[: cfg.eval.num_problems] if evaluates else []
        if not self.train_problems:
            raise ConfigError(f"task.name={cfg.task.name!r} has no training problems")
        self.task_fields = {MARK_FIELDS[mark] for mark in self.task.marks}
        unmarked = self.checks.estimator_needs & set(MARK_FIELDS.values()) - self.task_fields
        if unmarked:
            raise ConfigError(f"algorithm.estimator={cfg.algorithm.estimator!r} reads {', '.join(sorted(unmarked))}, "
                              f"token marks that task {cfg.task.name!r} does not give (countdown, countdown_search "
                              "and countdown_free do; free_mask needs the task option free)")
        # float32 weights whatever model.dtype: the master copy AdamW updates (docs/PERFORMANCE.md, "bfloat16")
        self.model, self.tokenizer = load_policy(cfg.model.name_or_path, device=cfg.model.device,
                                                 seed=cfg.train.seed, arch=cfg.model.arch)
        #: with model.lora, peft's PeftModel around self.model (which keeps its LoRA layers injected): the handle
        #: that switches the adapter off and saves it; None when every weight trains
        self.lora = self._add_lora(cfg) if cfg.model.lora is not None else None
        self.chat = prompt_form(cfg.model.name_or_path, cfg.model.chat_template)
        #: cfg.rollout with its max_new_tokens resolved (None: the task's limit for this tokenizer)
        self.rollout_config = cfg.rollout.model_copy(
            update={"max_new_tokens": cfg.rollout.max_new_tokens or self.task.response_limit(self.tokenizer)})
        self.ref = None  # with model.lora and no model.ref_model: the base, the adapter switched off (no copy)
        if self.checks.needs_ref and (cfg.model.ref_model is not None or self.lora is None):
            ref = self.model if cfg.model.ref_model is None else load_policy(
                cfg.model.ref_model, device=cfg.model.device)[0]
            self.ref = frozen_copy(ref)
        self.step, self.elapsed, self.nan_steps = 0, 0.0, 0
        self.problems = ProblemStream(self.train_problems, cfg.train.seed + 1)
        self.sample_generator = torch.Generator().manual_seed(cfg.train.seed + 2)
        self.shuffle_generator = torch.Generator().manual_seed(cfg.train.seed + 3)
        self.before: dict[str, Any] | None = None
        resume_from = None
        if resume:
            resume_from = ckpt.newest_intact(self.out / "checkpoints", self.model, self._warn, lora=self.lora)
            if resume_from is not None:
                self.model = resume_from[2]
        self.model.train()
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        engine_options: dict[str, Any] = {"max_prompt_tokens": cfg.rollout.max_prompt_tokens, "dtype": cfg.model.dtype}
        if cfg.rollout.engine == "vllm":
            engine_options.update(gpu_memory_utilization=cfg.rollout.gpu_memory_utilization, seed=cfg.train.seed,
                                  enforce_eager=cfg.rollout.enforce_eager)
        self.engine = make_engine(cfg.rollout.engine, self.model, self.tokenizer, **engine_options)
        self.pieces = TokenPieces(self.tokenizer)
        self.device = next(self.model.parameters()).device
        self.sampler_check = SamplerCheck(sampler_bound(cfg.rollout.max_logprob_diff, cfg.model.dtype),
                                          cfg.rollout.logprob_diff_patience)
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # with model.lora: the adapter's
        self.optimizer = torch.optim.AdamW(trainable, lr=cfg.train.lr, betas=cfg.train.adam_betas,
                                           weight_decay=cfg.train.weight_decay)
        if resume_from is not None:
            self._load_state(resume_from[0], resume_from[1])
            self.console.print(f"resumed from {resume_from[0]} (step {self.step})", soft_wrap=True)
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
        (self.out / "config.yaml").write_text(dump_config(cfg))
        self.logger = MetricsLogger(self.out, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb,
                                    mlflow=cfg.log.mlflow, config=cfg.model_dump(mode="json"),
                                    run_name=self.out.name)

    def _add_lora(self, cfg: RunConfig) -> Any:
        """model.lora's adapter injected into self.model, its initial draws seeded from train.seed; the PeftModel."""
        lc = cfg.model.lora
        try:
            return add_lora(self.model, r=lc.r, alpha=lc.alpha, target_modules=lc.target_modules, dropout=lc.dropout,
                            seed=cfg.train.seed, base_path=model_location(cfg.model.name_or_path))
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def _warn(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/] {message}", soft_wrap=True)

    # -- one step -------------------------------------------------------------
    def prompts_for(self, problems: list) -> list[str]:
        """The model-facing text of each problem (plain template or the tokenizer's chat template)."""
        return [self.task.format_prompt(p, self.tokenizer, chat=self.chat) for p in problems]

    def collect(self) -> Collected:
        """Phase 1 (train/collect.py): the step's scored rollout."""
        return collect(self.engine, self.task.verifier, self.problems.next, self.prompts_for, self.rollout_config,
                       self.sample_generator)

    def _forward(self, model: torch.nn.Module, rollout: Rollout, rows: torch.Tensor | None = None,
                 entropies: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        m, r = self.config.model, self.config.rollout
        with compute_precision(self.device, m.dtype):
            return response_logprobs(model, rollout, rows, temperature=r.temperature,
                                     chunk_size=m.logprob_chunk_size, entropies=entropies)

    def _forward_all_no_grad(self, model: torch.nn.Module, rollout: Rollout,
                             entropies: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probs, entropies or None) of every response, in micro-batches, without gradients."""
        m, r = self.config.model, self.config.rollout
        with compute_precision(self.device, m.dtype):
            return response_logprobs_no_grad(model, rollout, micro_batch_size=self.config.train.micro_batch_size,
                                             temperature=r.temperature, chunk_size=m.logprob_chunk_size,
                                             entropies=entropies)

    def _single_forward(self, n: int) -> bool:
        """True when the step makes one update from one forward of all n rows (one epoch, one
        minibatch, no micro-batching): that forward then also gives ℓ^old, since π_θ = π_old there."""
        t = self.config.train
        branches_join = self.config.rollout.branch.pivots and self.config.rollout.branch.train_on_branches
        return (t.ppo_epochs == 1 and t.num_minibatches == 1 and not branches_join
                and (t.micro_batch_size is None or t.micro_batch_size >= n))

    @contextmanager
    def _phase(self, name: str, metrics: dict[str, Any]) -> Iterator[None]:
        """Time one phase of the step as metrics['time/<name>_s'] (on a GPU, its queued work included)."""
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        metrics[f"time/{name}_s"] = time.perf_counter() - start

    def train_step(self) -> dict[str, Any]:
        """One RLVR step, in the phases of the module docstring; returns its metrics."""
        lr = self.config.train.lr * lr_factor(self.step, self.config.train)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        metrics: dict[str, Any] = {"step": self.step + 1, "lr": lr}
        with self._phase("rollout", metrics):
            collected = self.collect()
        metrics.update(collected.metrics)
        if collected.rollout is None:  # dynamic sampling found no group with mixed rewards
            return {**metrics, "skipped": True, "time/step_s": metrics.pop("time/rollout_s")}
        return self.learn_from(collected, metrics)

    def learn_from(self, collected: Collected, metrics: dict[str, Any]) -> dict[str, Any]:
        """Phases 2-5 of a step on a scored rollout; returns `metrics` with the step's added."""
        alg = self.config.algorithm
        rollout, rewards, scores = collected.rollout, collected.rewards, collected.scores
        start = time.perf_counter()
        with self._phase("forward", metrics):  # ℓ^ref, then ℓ^old and H of the policy before any update
            batch, kept = self.token_batch(rollout, rewards, self.marks(rollout, collected.problems))
            if rollout.sampler_logprobs is not None:  # does the engine sample from this policy?
                metrics["rollout/logprob_diff"] = logprob_diff(rollout.sampler_logprobs, batch.old_logprobs,
                                                               batch.response_mask)
        with self._phase("branch", metrics):  # V̂ before each pivot token
            if self.config.rollout.branch.pivots:
                rollout, batch, branch_metrics = self.branch(rollout, batch, collected.problems)
                metrics.update(branch_metrics)
                metrics["rollout/tokens_generated"] += branch_metrics["rollout/branch_tokens"]
        diffs = [metrics[k] for k in ("rollout/logprob_diff", "rollout/branch_logprob_diff") if k in metrics]
        if diffs:  # does the engine sample from this policy, branches included?
            self.sampler_check.observe(max(diffs), self.step + 1)
        with self._phase("estimator", metrics):
            advantages = compute_advantages(alg.estimator, batch, **alg.estimator_kwargs)
        with self._phase("update", metrics):
            update = self.update(rollout, batch, advantages, kept)
        step_s = metrics.get("time/rollout_s", 0.0) + time.perf_counter() - start
        metrics.update({
            "rollout/rows": float(batch.num_responses),
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "accuracy": float((scores >= 1.0).float().mean()),
            "truncated/frac": float(rollout.truncated.float().mean()),
            **estimator_diagnostics(batch, advantages),
            **update,
            "time/step_s": step_s,
            "tokens_per_s": float(batch.lengths.sum()) / step_s if step_s > 0 else 0.0,
        })
        return metrics

    def marks(self, rollout: Rollout, problems: list, prefixes: list | None = None) -> dict[str, torch.Tensor]:
        """The task's token marks of the responses (rollout/marks.py): free_mask when the task has free
        choices, reachable when the estimator reads it; {} otherwise (nothing is computed)."""
        wanted = {"free_mask"} & self.task_fields | {"reachable"} & self.checks.estimator_needs
        if not wanted:
            return {}
        marks = rollout_marks(rollout, self.pieces, lambda pieces, row: self.task.token_marks(pieces, problems[row]),
                              prefixes)
        return {field: value for field, value in marks.items() if field in wanted}

    def token_batch(self, rollout: Rollout, rewards: torch.Tensor,
                    marks: dict[str, torch.Tensor]) -> tuple[TokenBatch, tuple | None]:
        """The TokenBatch of a scored rollout (ℓ^ref when the method reads it; ℓ^old and H always; the task's
        marks), and the single forward's (ℓ^θ, H^θ) with their graph when one forward serves the update too."""
        device = rollout.response_ids.device
        ref_lp = self.reference_logprobs(rollout) if self.checks.needs_ref else None
        kept = self._forward(self.model, rollout) if self._single_forward(rollout.response_ids.shape[0]) else None
        if kept is not None:
            old_lp, entropies = kept[0].detach(), kept[1].detach()
        else:
            old_lp, entropies = self._forward_all_no_grad(self.model, rollout)
        batch = TokenBatch(rewards.to(device), rollout.group_index.to(device), rollout.response_mask, old_lp,
                           ref_logprobs=ref_lp, entropies=entropies, **marks)
        return batch, kept

    def reference_logprobs(self, rollout: Rollout) -> torch.Tensor:
        """ℓ^ref of every response: the reference model's, or with model.lora (and no model.ref_model) the
        policy's with its adapter switched off, i.e. the base model's."""
        if self.ref is not None:
            return self._forward_all_no_grad(self.ref, rollout, entropies=False)[0]
        with self.lora.disable_adapter():
            return self._forward_all_no_grad(self.model, rollout, entropies=False)[0]

    def branch(self, rollout: Rollout, batch: TokenBatch, problems: list) -> tuple[Rollout, TokenBatch, dict]:
        """Phase 3 (train/branches.py): pivot_values, and with train_on_branches the branches as rows."""
        r = self.rollout_config

        def reward_of(parents: torch.Tensor, texts: list[str], lengths: torch.Tensor) -> torch.Tensor:
            scores = score_texts(self.task.verifier, texts, [problems[i].answer for i in parents.tolist()])
            return shape_rewards(scores, lengths, r)

        def branch_batch(found: Branches, rewards: torch.Tensor) -> TokenBatch:
            parents = found.parent.tolist()
            prefixes = [rollout.response_ids[i, :p].tolist() for i, p in zip(parents, found.position.tolist(), strict=True)]
            marks = self.marks(found.rollout, [problems[i] for i in parents], prefixes)
            return self.token_batch(found.rollout, rewards, marks)[0]

        return branch_phase(self.engine, rollout, batch, reward_of, branch_batch,
                            lambda sample: self._forward_all_no_grad(self.model, sample, entropies=False)[0],
                            config=r, generator=self.sample_generator)

    def update(self, rollout: Rollout, batch: TokenBatch, advantages: torch.Tensor,
               kept: tuple | None) -> dict[str, float]:
        """Phase 5 (train/update.py); `kept` is token_batch's single forward, used instead of a new one."""
        def forward(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            return (kept[0][rows], kept[1][rows]) if kept is not None else self._forward(self.model, rollout, rows)

        metrics, bad = update_policy(self.model, self.optimizer, batch, advantages, forward, self.config,
                                     self.shuffle_generator, self.engine.sync_weights)
        self.nan_steps = self.nan_steps + 1 if bad else 0
        return metrics

    # -- evaluation and checkpoints -----------------------------------------------
    def evaluate(self, tag: str, progress: TrainProgress | None = None, reuse: bool = False) -> dict[str, Any]:
        """Held-out evaluation of the current policy; writes eval/<tag>.json and eval/<tag>_samples.jsonl.
        With `reuse`, an identical evaluation another run drew is taken from the cache (train/before_cache.py)."""
        e, r = self.config.eval, self.rollout_config
        prompts = [self.eval_task.format_prompt(p, self.tokenizer, chat=self.chat) for p in self.eval_problems]
        sampling = {"samples_per_problem": e.samples_per_problem, "temperature": e.temperature,
                    "max_new_tokens": e.max_new_tokens or r.max_new_tokens, "batch_size": e.batch_size}
        samples_path = self.out / "eval" / f"{tag}_samples.jsonl"
        key = self._evaluation_key(prompts, sampling) if reuse else None
        stored = before_cache.load(key, samples_path) if key else None
        if stored is not None:
            result, folder = stored
            self.console.print(f"held-out evaluation {tag}: the same as {folder} "
                               "(eval.reuse_before=false computes it again)", soft_wrap=True)
        else:
            result = evaluate_policy(
                self.engine, self.eval_task, self.eval_problems, prompts=prompts, **sampling,
                seed=EVAL_SEED, samples_path=samples_path, progress=progress.evaluation(tag) if progress else None,
            )
            if key:
                before_cache.store(key, result, samples_path)
        (self.out / "eval" / f"{tag}.json").write_text(json.dumps(result, indent=2))
        return result

    def _evaluation_key(self, prompts: list[str], sampling: dict[str, Any]) -> str:
        """The cache key of an evaluation of the current weights (train/before_cache.py)."""
        r = self.rollout_config
        settings = {**sampling, "seed": EVAL_SEED, "task": self.eval_task.name, "engine": r.engine, "top_p": r.top_p,
                    "dtype": self.config.model.dtype, "device": str(self.device), "max_prompt_tokens": r.max_prompt_tokens}
        return before_cache.evaluation_key(self.model, prompts, [p.answer for p in self.eval_problems], settings)

    def save(self) -> Path:
        """Checkpoint the current step atomically."""
        state = {
            "step": self.step, "elapsed": self.elapsed, "nan_steps": self.nan_steps,
            "optimizer": self.optimizer.state_dict(),
            "rng": ckpt.rng_states(), **self.problems.state(), "sample_generator": self.sample_generator.get_state(),
            "shuffle_generator": self.shuffle_generator.get_state(), "before": self.before,
            "sampler_streak": self.sampler_check.streak,
        }
        return ckpt.save_checkpoint(self.out / "checkpoints", self.step, model=self.model, tokenizer=self.tokenizer,
                                    state=state, keep=self.config.checkpoint.keep, chat=self.chat, lora=self.lora)

    def _load_state(self, path: Path, state: dict[str, Any]) -> None:
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            ckpt.restore_rng_states(state["rng"])
            self.problems.restore(state)
            self.sample_generator.set_state(state["sample_generator"])
            self.shuffle_generator.set_state(state["shuffle_generator"])
            self.step, self.elapsed, self.nan_steps = int(state["step"]), float(state["elapsed"]), int(state["nan_steps"])
            self.before = state["before"]
            self.sampler_check.streak = int(state.get("sampler_streak", 0))  # older checkpoints: 0
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise ckpt.CheckpointError(f"{path}: its trainer state does not fit this run "
                                       f"({ckpt.first_line(err)})") from None

    # -- the loop -------------------------------------------------------------
    def _compute_note(self) -> str:
        """', bfloat16 compute' where the forwards run in another dtype than the float32 master weights;
        ', LoRA r=8 (0.08 M trainable)' with model.lora."""
        weights = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        note = "" if self.config.model.dtype == weights else f", {self.config.model.dtype} compute"
        if self.lora is not None:
            trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            note += f", LoRA r={self.config.model.lora.r} ({trainable / 1e6:.2f} M trainable)"
        return note

    def run(self) -> dict[str, Any]:
        """Train to train.max_steps (evaluating and checkpointing on the way); returns the summary.

        Ctrl-C (SIGINT) during the steps finishes the current step, saves a checkpoint and
        raises TrainingInterrupted; a second Ctrl-C, or one outside the steps, stops at once
        (TrainingInterrupted names the newest checkpoint to resume from).
        """
        cfg = self.config
        self.console.print(f"[bold]pivotrl train[/] {cfg.algorithm.estimator} + {cfg.algorithm.policy_loss} on "
                           f"{cfg.task.name}: {describe(self.model)}{self._compute_note()}; "
                           f"{'chat' if self.chat else 'plain'} prompts, responses of at most "
                           f"{self.rollout_config.max_new_tokens} tokens; output {self.out}",
                           soft_wrap=True)
        started = time.perf_counter()
        elapsed_before = self.elapsed
        progress = TrainProgress(self.console, enabled=cfg.log.progress, print_every=cfg.log.print_every,
                                 total=cfg.train.max_steps)
        try:
            with sigint_stops_after_step() as stop:
                if cfg.eval.before_after and self.before is None:
                    self.before = self.evaluate("step-000000", progress, reuse=cfg.eval.reuse_before)
                    self.console.print(f"held-out accuracy before: {self.before['accuracy']:.3f}")
                with progress:
                    progress.start(self.step)
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
                            result = self.evaluate(f"step-{self.step:06d}", progress)
                            metrics.update({f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))})
                        self.logger.log(metrics)
                        now = time.perf_counter()
                        progress.step(self.step, metrics, (now - loop_started) / (self.step - first_step), now - started)
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
                summary = self._finish(elapsed_before + time.perf_counter() - started, progress)
        except KeyboardInterrupt:
            raise TrainingInterrupted(ckpt.interrupted_message(self.out / "checkpoints", self.step)) from None
        finally:
            self.logger.close()
            self._lock.release()
        return summary

    def _finish(self, wall_time: float, progress: TrainProgress) -> dict[str, Any]:
        summary: dict[str, Any] = {"steps": self.step, "estimator": self.config.algorithm.estimator,
                                   "policy_loss": self.config.algorithm.policy_loss, "wall_time_s": wall_time}
        if self.config.eval.before_after:
            after = self.evaluate(f"step-{self.step:06d}", progress)
            before = self.before or {}
            summary.update({
                "heldout_accuracy_before": before.get("accuracy"), "heldout_accuracy_after": after["accuracy"],
                "mean_length_before": before.get("mean_length"), "mean_length_after": after["mean_length"],
                "eval_problems": after["num_problems"], "eval_samples_per_problem": after["samples_per_problem"],
            })
            for key in task_counts(after):
                summary[f"{key}_before"], summary[f"{key}_after"] = before.get(key), after[key]
            self.console.print(heldout_table(self.eval_task.name, before, after))
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        self.console.print(f"wall time {wall_time:.0f} s; summary in {self.out / 'summary.json'}")
        return summary
