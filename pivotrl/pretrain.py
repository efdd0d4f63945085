"""Supervised warm-up of the tiny policy on countdown worked solutions (``pivotrl pretrain``).

The recipe (:class:`PretrainConfig` defaults) is what made the shipped
checkpoint in ``pivotrl/assets/tiny-countdown``: a fresh tiny Llama, trained
on countdown problems of the train split (3 numbers) in the layout
``<think>STEPS</think><answer>EXPR</answer>``, where a share of the traces is
deliberately imperfect (a wrong step, or an expression that misses the
target), so the policy is not perfect and RL has room to improve it.

Everything is fixed by the seed: the data order, the initial weights, the
number of torch threads, and training stops after a number of steps (a time
limit exists, ``minutes``, but it is off by default because it is not
reproducible). Run twice, it writes bit-identical weights (on the same
machine and torch build).

:func:`heldout_accuracy` measures a policy on held-out problems with plain
temperature sampling.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger("pivotrl.pretrain")

RECIPE_FILE = "pretrain.json"


@dataclass
class PretrainConfig:
    """The warm-up recipe; the defaults made the shipped checkpoint."""

    seed: int = 0
    steps: int = 1500
    batch_size: int = 64
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    threads: int = 1  # one thread: fastest on a busy machine; bits do not depend on the core count
    minutes: float | None = None  # optional wall-clock stop (not reproducible); None = off
    # data
    num_numbers: int | tuple[int, int] = 3
    train_size: int = 20_000
    imperfect: float = 0.3
    arithmetic_fraction: float = 0.0  # share of batches' examples drawn from the arithmetic task
    four_number_fraction: float = 0.0  # share drawn from 4-number countdown
    # model (overrides of pivotrl.modeling.tiny.TINY_ARCH)
    arch: dict[str, Any] = field(default_factory=dict)
    # periodic evaluation while training (0 = off); does not change the weights
    eval_every: int = 0
    eval_n: int = 200

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if isinstance(data["num_numbers"], tuple):
            data["num_numbers"] = list(data["num_numbers"])
        return data


@contextlib.contextmanager
def deterministic_torch(threads: int) -> Iterator[None]:
    """Fixed thread count and deterministic kernels, restored on exit."""
    old_threads = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)


# -- data ------------------------------------------------------------------------


def _sft_sources(cfg: PretrainConfig) -> list[tuple[Any, float]]:
    from pivotrl.tasks import get_task

    sources = []
    rest = 1.0 - cfg.arithmetic_fraction - cfg.four_number_fraction
    if rest < 0:
        raise ValueError("arithmetic_fraction + four_number_fraction must be at most 1")
    common = {"seed": cfg.seed, "imperfect": cfg.imperfect}
    if rest > 0:
        sources.append(
            (
                get_task(
                    "countdown", num_numbers=cfg.num_numbers, train_size=cfg.train_size, **common
                ),
                rest,
            )
        )
    if cfg.four_number_fraction > 0:
        sources.append(
            (
                get_task("countdown", num_numbers=4, train_size=cfg.train_size, **common),
                cfg.four_number_fraction,
            )
        )
    if cfg.arithmetic_fraction > 0:
        sources.append(
            (get_task("arithmetic", train_size=cfg.train_size, **common), cfg.arithmetic_fraction)
        )
    return sources


def sft_texts(cfg: PretrainConfig, n: int) -> list[tuple[str, str]]:
    """The first ``n`` (prompt, response) pairs of the recipe's data stream, in training order."""
    sources = _sft_sources(cfg)
    rng = random.Random(f"pretrain-mix:{cfg.seed}")
    counts = [0] * len(sources)
    picks = []
    for _ in range(n):
        i = (
            rng.choices(range(len(sources)), weights=[w for _, w in sources])[0]
            if len(sources) > 1
            else 0
        )
        picks.append(i)
        counts[i] += 1
    streams = [
        iter(task.sft_examples(c, seed=cfg.seed))
        for (task, _), c in zip(sources, counts, strict=True)
    ]
    return [(ex.prompt, ex.response) for ex in (next(streams[i]) for i in picks)]


def encode_sft(
    tokenizer: Any, prompts: Sequence[str], responses: Sequence[str]
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 on prompt and padding).

    A sequence is ``<bos> prompt response <eos>``; the loss covers the response and ``<eos>``.
    """
    rows, targets = [], []
    for prompt, response in zip(prompts, responses, strict=True):
        p = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        r = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + r)
        targets.append([-100] * len(p) + r)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, (row, target) in enumerate(zip(rows, targets, strict=True)):
        ids[k, : len(row)] = torch.tensor(row)
        labels[k, : len(row)] = torch.tensor(target)
        mask[k, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _lr_at(step: int, cfg: PretrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


# -- training ----------------------------------------------------------------------


@dataclass
class PretrainResult:
    output_dir: Path | None
    steps: int
    final_loss: float
    wall_s: float
    parameters: int
    history: list[dict[str, float]]


def pretrain(
    output_dir: str | Path | None,
    config: PretrainConfig | None = None,
    *,
    log: Callable[[dict[str, float]], None] | None = None,
    log_every: int = 50,
) -> tuple[Any, Any, PretrainResult]:
    """Train the tiny policy with ``config`` and save it to ``output_dir`` (unless None).

    Returns (model, tokenizer, result). The folder gets ``model.safetensors``,
    ``config.json``, ``generation_config.json``, the tokenizer files and
    ``pretrain.json`` (the recipe).
    """
    from pivotrl.modeling.tiny import build_tiny_model, count_parameters
    from pivotrl.modeling.tokenizer import build_char_tokenizer

    cfg = config or PretrainConfig()
    start = time.perf_counter()
    history: list[dict[str, float]] = []
    with deterministic_torch(cfg.threads):
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, seed=cfg.seed, **cfg.arch)
        texts = sft_texts(cfg, cfg.steps * cfg.batch_size)
        decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": cfg.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=cfg.lr,
            betas=(0.9, 0.98),
            eps=1e-8,
        )
        model.train()
        loss_value = float("nan")
        steps_done = 0
        for step in range(cfg.steps):
            if cfg.minutes is not None and time.perf_counter() - start > 60 * cfg.minutes:
                logger.info("stopping at step %d: the %.1f minute limit", step, cfg.minutes)
                break
            lr = _lr_at(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            chunk = texts[step * cfg.batch_size : (step + 1) * cfg.batch_size]
            batch = encode_sft(tokenizer, [p for p, _ in chunk], [r for _, r in chunk])
            loss = model(**batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            steps_done = step + 1
            loss_value = float(loss.detach())
            record = {"step": step + 1, "loss": loss_value, "lr": lr}
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0:
                from pivotrl.tasks import get_task

                task = get_task("countdown", num_numbers=cfg.num_numbers, test_size=cfg.eval_n)
                model.eval()
                record["heldout_accuracy"] = heldout_accuracy(model, tokenizer, task, n=cfg.eval_n)[
                    "accuracy"
                ]
                model.train()
            if (step + 1) % log_every == 0 or step + 1 == cfg.steps or "heldout_accuracy" in record:
                record["elapsed_s"] = time.perf_counter() - start
                history.append(record)
                if log is not None:
                    log(record)
        model.eval()
        if output_dir is not None:
            out = Path(output_dir)
            out.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(str(out))
            # a fresh copy: calling the tokenizer (as the periodic evaluation does) leaves
            # padding settings in it that would otherwise end up in tokenizer.json
            build_char_tokenizer().save_pretrained(str(out))
            recipe = {
                "recipe": cfg.to_json(),
                "steps_done": steps_done,
                "parameters": count_parameters(model),
            }
            (out / RECIPE_FILE).write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
    result = PretrainResult(
        output_dir=Path(output_dir) if output_dir is not None else None,
        steps=steps_done,
        final_loss=loss_value,
        wall_s=time.perf_counter() - start,
        parameters=count_parameters(model),
        history=history,
    )
    return model, tokenizer, result


# -- evaluation --------------------------------------------------------------------


def heldout_accuracy(
    model: Any,
    tokenizer: Any,
    task: Any,
    n: int = 1000,
    temperature: float = 1.0,
    seed: int = 0,
    *,
    batch_size: int = 250,
    max_new_tokens: int = 48,
    split: str = "test",
    chat: bool = False,
) -> dict[str, Any]:
    """Share of the first ``n`` problems of ``split`` that one sampled response each solves.

    :func:`pivotrl.evaluation.evaluate_policy` with the HF engine (``temperature=0``
    means greedy; sampling draws from a generator seeded with ``seed``, leaving the
    global RNG alone). Returns ``{"accuracy", "format", "n", "mean_response_tokens",
    "temperature", "seed", "examples"}`` (``format``: share in the exact think/answer
    layout; ``examples``: the first eight responses).
    """
    from pivotrl.evaluation import evaluate_policy
    from pivotrl.rollout.hf import HFEngine

    problems = list(task.problems(split)[:n])
    if not problems:
        raise ValueError(f"task {task.name!r} has no {split} problems")
    prompts = [task.format_prompt(p, tokenizer=tokenizer, chat=chat) for p in problems]
    result = evaluate_policy(HFEngine(model, tokenizer), task, problems, prompts=prompts, temperature=temperature,
                             max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed, num_examples=8)
    return {"accuracy": result["accuracy"], "format": result["format"], "n": len(problems),
            "mean_response_tokens": result["mean_length"], "temperature": temperature, "seed": seed,
            "examples": result["examples"]}


# -- the command line ------------------------------------------------------------------


def evaluate_policy(
    model_path: str | Path | None = None,
    *,
    n: int = 1000,
    temperature: float = 1.0,
    seed: int = 0,
    num_numbers: int = 3,
    threads: int | None = 1,
) -> dict[str, Any]:
    """:func:`heldout_accuracy` of a saved tiny policy (default: the shipped one) on countdown.

    ``threads``: torch threads while measuring (None: leave torch's setting).
    """
    from pivotrl.modeling.tiny import load_tiny_policy
    from pivotrl.tasks import get_task

    model, tokenizer = load_tiny_policy(model_path)
    task = get_task("countdown", num_numbers=num_numbers, test_size=max(n, 1))
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return heldout_accuracy(model, tokenizer, task, n=n, temperature=temperature, seed=seed)
    finally:
        torch.set_num_threads(old)


def run_pretrain_command(
    *,
    output_dir: Path,
    config: PretrainConfig,
    evaluate: bool,
    eval_only: bool,
    model_path: Path | None,
    eval_n: int,
    temperature: float,
    eval_seed: int,
) -> None:
    """What ``pivotrl pretrain`` does: train and save (unless ``eval_only``), then measure."""
    from rich.console import Console

    from pivotrl.modeling.tiny import tiny_policy_path

    console = Console()
    target = model_path
    if not eval_only:
        console.print(
            f"pretraining the tiny policy: seed {config.seed}, {config.steps} steps x "
            f"{config.batch_size}, {config.threads} threads -> {output_dir}"
        )

        def log(rec: dict[str, float]) -> None:
            extra = f"  heldout {rec['heldout_accuracy']:.3f}" if "heldout_accuracy" in rec else ""
            console.print(
                f"step {int(rec['step']):5d}  loss {rec['loss']:.4f}  lr {rec['lr']:.2e}  "
                f"{rec.get('elapsed_s', 0):6.0f}s{extra}"
            )

        _, _, result = pretrain(output_dir, config, log=log)
        console.print(
            f"saved {result.parameters:,} parameters after {result.steps} steps "
            f"in {result.wall_s:.0f}s to {output_dir}"
        )
        target = output_dir
    if eval_only or evaluate:
        where = target or tiny_policy_path()
        console.print(
            f"measuring {where} on {eval_n} held-out countdown problems (T={temperature})"
        )
        res = evaluate_policy(
            where,
            n=eval_n,
            temperature=temperature,
            seed=eval_seed,
            num_numbers=config.num_numbers if isinstance(config.num_numbers, int) else 3,
            threads=config.threads,
        )
        console.print(
            f"held-out accuracy {res['accuracy']:.3f}  format {res['format']:.3f}  "
            f"mean response {res['mean_response_tokens']:.1f} tokens  (n={res['n']})"
        )
