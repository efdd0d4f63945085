"""Supervised warm-up of a tiny policy on worked solutions (``pivotrl pretrain``).

Three recipes, one per shipped checkpoint (:data:`RECIPES`, :func:`recipe`):

- ``countdown`` (the :class:`PretrainConfig` defaults) made
  ``pivotrl/assets/tiny-countdown`` (``--model tiny``): a fresh tiny Llama,
  trained on countdown problems of the train split (3 numbers) in the layout
  ``<think>STEPS</think><answer>EXPR</answer>``, where a share of the traces
  is deliberately imperfect (a wrong step, or an expression that misses the
  target), so the policy is not perfect and RL has room to improve it.
- ``countdown_search`` made ``pivotrl/assets/tiny-countdown-search``
  (``--model tiny-search``): the same tiny Llama (longer positions) trained
  on the written searches of :mod:`pivotrl.tasks.search` (4 numbers from 1
  to 10; attempts drawn by a guided random search; some with arithmetic
  slips, some given up).
- ``countdown_free`` made ``pivotrl/assets/tiny-countdown-free``
  (``--model tiny-free``): countdown's recipe with twice the steps, on the
  worked solutions of ``countdown_free``, countdown's with slots of filler
  words (:mod:`pivotrl.tasks.free`), so most of the policy's entropy sits on
  tokens no outcome depends on.

Everything is fixed by the seed: the data order, the initial weights, the
number of torch threads, and training stops after a number of steps (a time
limit exists, ``minutes``, but it is off by default because it is not
reproducible). Run twice, it writes bit-identical weights (on the same
machine and torch build).

The held-out measurement (periodic, after training, or ``--eval-only``) is
:func:`pivotrl.evaluation.evaluate_heldout`, what ``pivotrl eval`` reports with its
defaults (the same problems, response length, seed and batch); for a task with free
choices, after training or ``--eval-only``, also the share of the policy's entropy on
free tokens (:class:`pivotrl.analysis.free_share.FreeEntropy`).
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

from pivotrl.evaluation import evaluate_heldout
from pivotrl.progress import task_counts

logger = logging.getLogger("pivotrl.pretrain")

RECIPE_FILE = "pretrain.json"


@dataclass
class PretrainConfig:
    """The warm-up recipe; the defaults made the shipped countdown checkpoint."""

    task: str = "countdown"  # whose worked solutions are learned (and measured)
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
    task_options: dict[str, Any] = field(default_factory=dict)  # more options of the task
    group_by_length: int = 0  # >1: batches cut from this many batches' examples sorted by length
    # model (overrides of pivotrl.modeling.tiny.TINY_ARCH)
    arch: dict[str, Any] = field(default_factory=dict)
    # periodic evaluation while training (0 = off); does not change the weights
    eval_every: int = 0
    eval_n: int = 200
    max_new_tokens: int = 48  # longest response of the periodic evaluation (eval_every) while training

    def make_task(self, **sizes: Any) -> Any:
        """The recipe's task (``num_numbers`` and ``task_options`` applied) with ``sizes``."""
        from pivotrl.tasks import get_task

        return get_task(self.task, num_numbers=self.num_numbers, **self.task_options, **sizes)

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
        sources.append((cfg.make_task(train_size=cfg.train_size, **common), rest))
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


def group_by_length(
    texts: list[tuple[str, str]], batch_size: int, pool: int, seed: int
) -> list[tuple[str, str]]:
    """``texts`` with each run of ``pool`` batches cut into batches of similar length.

    Each run of ``pool * batch_size`` examples is sorted by length (stably),
    cut into ``pool`` batches, and the batches are put in a seeded random
    order; so a batch pads to a length close to its own, not to the longest
    trace of the run. Every example is still used once; ``pool <= 1`` changes
    nothing.
    """
    if pool <= 1:
        return texts
    rng = random.Random(f"group-by-length:{seed}")
    out: list[tuple[str, str]] = []
    run = pool * batch_size
    for start in range(0, len(texts), run):
        chunk = sorted(texts[start : start + run], key=lambda pr: len(pr[0]) + len(pr[1]))
        batches = [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
        rng.shuffle(batches)
        for batch in batches:
            out.extend(batch)
    return out


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
    from pivotrl.modeling.quiet import quiet_loading
    from pivotrl.modeling.tiny import build_tiny_model, count_parameters
    from pivotrl.modeling.tokenizer import build_char_tokenizer

    cfg = config or PretrainConfig()
    start = time.perf_counter()
    history: list[dict[str, float]] = []
    with deterministic_torch(cfg.threads):
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, seed=cfg.seed, **cfg.arch)
        texts = group_by_length(
            sft_texts(cfg, cfg.steps * cfg.batch_size), cfg.batch_size, cfg.group_by_length, cfg.seed
        )
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
                task = cfg.make_task(test_size=cfg.eval_n)
                model.eval()
                record["heldout_accuracy"] = evaluate_heldout(
                    model, tokenizer, task, n=cfg.eval_n, max_new_tokens=cfg.max_new_tokens
                )["accuracy"]
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
            with quiet_loading():  # no "Writing model shards" bar in pretrain's output
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


# -- the recipes and the command line ------------------------------------------------------

#: The recipe of each shipped checkpoint, by task, and the model name it ships as.
RECIPES: dict[str, PretrainConfig] = {
    "countdown": PretrainConfig(),
    "countdown_search": PretrainConfig(
        task="countdown_search",
        num_numbers=4,
        steps=1800,
        batch_size=32,
        train_size=10_000,
        imperfect=0.2,
        max_new_tokens=224,
        group_by_length=16,
        arch={"max_position_embeddings": 384},  # tiny size (0.87 M), chosen by measuring (docs/EXPERIMENTS.md)
    ),
    "countdown_free": PretrainConfig(  # countdown's, on worked solutions with fillers (docs/EXPERIMENTS.md)
        task="countdown_free",
        steps=3000,  # countdown's 1500 gave 0.252 held-out, 6 points under tiny's 0.312; 3000: 0.318
        max_new_tokens=160,
        group_by_length=16,  # the traces are 40 to 118 tokens long: batches of like lengths pad less
    ),
}
SHIPPED_AS = {"countdown": "tiny", "countdown_search": "tiny-search", "countdown_free": "tiny-free"}


def recipe(task: str = "countdown", **overrides: Any) -> PretrainConfig:
    """A copy of the shipped recipe for ``task``, with ``overrides`` (None values ignored)."""
    import dataclasses

    if task not in RECIPES:
        raise ValueError(f"pretrain has no recipe for task {task!r}; known: {', '.join(RECIPES)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(RECIPES[task], **given)


def shipped_policy_path(task: str = "countdown") -> Path:
    """The folder of the checkpoint shipped for ``task``."""
    from pivotrl.modeling.tiny import tiny_policy_path

    return tiny_policy_path(SHIPPED_AS[task])


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
    max_new_tokens: int | None = None,
) -> None:
    """What ``pivotrl pretrain`` does: train and save (unless ``eval_only``), then measure."""
    from rich.console import Console

    console = Console()
    target = model_path
    if not eval_only:
        console.print(
            f"pretraining the tiny policy on {config.task}: seed {config.seed}, {config.steps} steps x "
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
        where = target or shipped_policy_path(config.task)
        length = max_new_tokens or config.make_task().max_new_tokens
        console.print(
            f"measuring {where} on {eval_n} held-out {config.task} problems "
            f"(T={temperature}, seed {eval_seed}, at most {length} tokens)", soft_wrap=True
        )
        res = measure(where, config, n=eval_n, temperature=temperature, seed=eval_seed, max_new_tokens=length)
        counts = "".join(f"  mean {k.removeprefix('mean_').replace('_', ' ')} {res[k]:.2f}" for k in task_counts(res))
        free = res.get("free")
        shares = "" if free is None else (
            f"  free entropy share {free['free_entropy_share']:.3f}  free tokens {free['free_token_share']:.3f}"
            f"  entropy {free['entropy_per_response']:.1f} nats a response")
        console.print(
            f"held-out accuracy {res['accuracy']:.3f}  format {res['format']:.3f}  "
            f"mean response {res['mean_length']:.1f} tokens{counts}{shares}  (n={res['num_problems']})", soft_wrap=True
        )


def measure(model_path: Path, config: PretrainConfig, *, n: int, temperature: float, seed: int,
            max_new_tokens: int) -> dict[str, Any]:
    """The held-out evaluation of a saved tiny policy on `config`'s task, with the recipe's torch threads;
    for a task with free choices, ``"free"``: the :class:`~pivotrl.analysis.free_share.FreeEntropy`
    shares of the same responses."""
    from pivotrl.analysis.free_share import FreeEntropy
    from pivotrl.modeling.tiny import load_tiny_policy

    model, tokenizer = load_tiny_policy(model_path)
    task = config.make_task(test_size=max(n, 1))  # the first n held-out problems, whatever n
    free = FreeEntropy(model, tokenizer, task, temperature) if "free" in task.marks else None
    old = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        res = evaluate_heldout(model, tokenizer, task, n=n, temperature=temperature, seed=seed,
                               max_new_tokens=max_new_tokens, on_batch=None if free is None else free.add)
        if free is not None:
            res["free"] = free.result()
        return res
    finally:
        torch.set_num_threads(old)
