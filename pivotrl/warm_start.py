"""A pretrained model's warm start on a task's worked solutions (``pivotrl pretrain --model NAME``).

Where a real model solves too few of a task's problems for RL to learn from, a short supervised
fine-tune on the task's correct worked solutions (``<think>27+76=103</think><answer>103</answer>``)
brings it to where RL has something to sharpen. It uses TRL's ``SFTTrainer`` with a LoRA adapter
(peft) on every linear layer, on prompt-completion pairs in the model's chat form, with the loss on
the completion only; the adapter is then merged, and the result saved as a plain Hugging Face
folder with the recipe (``warm_start.json``) and its held-out accuracy, measured as ``pivotrl
eval --chat`` measures it.

Everything is fixed by the recipe and its seed (data order, adapter initialisation, one torch
thread), so a recipe run twice on one machine and torch build gives the same weights.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from pivotrl.modeling.prompt_form import WARM_START_RECIPE, save_prompt_form

#: The file beside the weights that records how they were made.
RECIPE_FILE = WARM_START_RECIPE
#: The folder beside the weights that holds the trained adapter, before its merge.
ADAPTER_DIR = "adapter"


@dataclass(frozen=True)
class WarmStartConfig:
    """A warm start's recipe: the defaults made ``smollm2-135m-add_sub``, and with TASK_RECIPES'
    changes ``smollm2-135m-countdown`` (docs/EXPERIMENTS.md)."""

    model: str = "smollm2-135m"
    task: str = "add_sub"
    seed: int = 0
    steps: int = 100
    batch_size: int = 8
    lr: float = 3e-4
    warmup_steps: int = 5
    lora_rank: int = 16
    lora_alpha: int = 32
    threads: int = 1


#: Each task's recipe where it differs from the defaults (add_sub's): countdown's responses make
#: several decisions, and add_sub's 100 steps brought SmolLM2-135M to 0.115 on it (docs/EXPERIMENTS.md).
TASK_RECIPES: dict[str, dict[str, Any]] = {"countdown": {"steps": 400}}


def warm_start_recipe(model: str, task: str, **overrides: Any) -> WarmStartConfig:
    """The warm-start recipe of `model` on `task`: the defaults, then the task's (TASK_RECIPES), then
    `overrides` (None values ignored)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return WarmStartConfig(model=model, task=task, **{**TASK_RECIPES.get(task, {}), **given})


def training_pairs(task: Any, tokenizer: Any, n: int, seed: int) -> list[dict[str, list[dict[str, str]]]]:
    """`n` prompt-completion pairs in chat form: the task's train problems in a seeded order, each with
    its correct worked solution as the assistant's turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("a warm start trains on the model's chat form, and this tokenizer has no chat template")
    examples = task.sft_examples(n, seed=seed, imperfect=0.0)
    return [{"prompt": task.messages(e.problem), "completion": [{"role": "assistant", "content": e.response}]}
            for e in examples]


def warm_start(config: WarmStartConfig, output_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fine-tune `config.model` on `config.task`'s worked solutions, merge the adapter and save it all to
    `output_dir` (claimed by the caller: empty) with the recipe; returns the recipe and the training figures.

    The files are written to a folder beside it first and moved in when all are written, config.json
    last, so a crash never leaves a folder that loads."""
    from datasets import Dataset, disable_progress_bars
    from peft import LoraConfig
    from transformers import PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from pivotrl.modeling.policy import load_policy
    from pivotrl.tasks import get_task

    torch.set_num_threads(config.threads)
    disable_progress_bars()
    model, tokenizer = load_policy(config.model, device="cpu", seed=config.seed)
    task = get_task(config.task)
    pairs = training_pairs(task, tokenizer, config.steps * config.batch_size, config.seed)

    class Progress(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                log(f"step {state.global_step:4d}/{config.steps}  loss {float(logs['loss']):.4f}  "
                    f"token accuracy {float(logs.get('mean_token_accuracy', float('nan'))):.3f}")

    args = SFTConfig(
        output_dir=str(output_dir.parent / f".{output_dir.name}.trainer"), per_device_train_batch_size=config.batch_size,
        max_steps=config.steps, learning_rate=config.lr, lr_scheduler_type="cosine", warmup_steps=config.warmup_steps,
        logging_steps=10, save_strategy="no", report_to=[], use_cpu=True, seed=config.seed, data_seed=config.seed,
        dataloader_num_workers=0, disable_tqdm=True, gradient_checkpointing=False,
        bf16=False,  # TRL's default is bf16 autocast: emulated, about 10x slower, on a CPU without AVX512-BF16
    )
    adapter = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules="all-linear",
                         lora_dropout=0.0, task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(pairs), processing_class=tokenizer,
                         peft_config=adapter, callbacks=[Progress()])
    trainer.remove_callback(PrinterCallback)  # its dict of each log: Progress says it in a line
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    record = {"recipe": asdict(config), "train_s": round(wall, 1), "examples": len(pairs),
              "final_loss": trainer.state.log_history[-1].get("train_loss")}
    record = save_merged(trainer.model, tokenizer, record, output_dir)
    shutil.rmtree(args.output_dir, ignore_errors=True)
    return record


def save_merged(adapted: Any, tokenizer: Any, record: dict[str, Any], output_dir: Path) -> dict[str, Any]:
    """Save the adapter (``adapter/``: a copy of it rebuilds these weights in seconds, `merge_kept_adapter`),
    then the model with it merged, its tokenizer, chat form and `record` with the merged weights' digest, all
    written beside `output_dir` and moved in when complete, config.json last."""
    from pivotrl.modeling.quiet import quiet_loading
    from pivotrl.train.before_cache import weights_digest

    work = output_dir.parent / f".{output_dir.name}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    adapted.save_pretrained(work / ADAPTER_DIR)
    merged = adapted.merge_and_unload()
    record = {**record, "weights_sha256": weights_digest(merged)}
    with quiet_loading():
        merged.save_pretrained(work)
        tokenizer.save_pretrained(work)
    write_record(work, record)
    save_prompt_form(work, chat=True)
    for path in sorted(work.iterdir(), key=lambda p: p.name == "config.json"):
        path.rename(output_dir / path.name)
    work.rmdir()
    return record


def write_record(folder: Path, record: dict[str, Any]) -> None:
    """The record beside the weights and beside the adapter, so that a kept adapter carries it."""
    for target in (folder, folder / ADAPTER_DIR):
        (target / RECIPE_FILE).write_text(json.dumps(record, indent=2) + "\n")


def merge_kept_adapter(config: WarmStartConfig, adapter: Path, output_dir: Path,
                       log: Callable[[str], None] = print) -> dict[str, Any]:
    """The warm start rebuilt from a kept copy of its ``adapter/`` folder: `config.model` with the adapter
    merged, saved as `warm_start` saves it; its record is the adapter's, and the merged weights' digest is
    checked against the one recorded when it was trained (a warning when they differ: another torch build
    or CPU rounds the merge otherwise)."""
    from peft import PeftModel

    from pivotrl.modeling.policy import load_policy

    kept = adapter / RECIPE_FILE
    if not (adapter / "adapter_config.json").is_file() or not kept.is_file():
        raise ValueError(f"--adapter {adapter}: not a kept warm-start adapter (it needs adapter_config.json, "
                         f"the adapter's weights and {RECIPE_FILE}: a copy of a warm start's {ADAPTER_DIR}/ folder)")
    record = json.loads(kept.read_text())
    if record.get("recipe", {}).get("model") != config.model or record.get("recipe", {}).get("task") != config.task:
        raise ValueError(f"--adapter {adapter} is the warm start of {record.get('recipe', {}).get('model')} on "
                         f"{record.get('recipe', {}).get('task')}, not of {config.model} on {config.task}")
    torch.set_num_threads(config.threads)
    model, tokenizer = load_policy(config.model, device="cpu", seed=config.seed)
    record = {**record, "merged_from": str(adapter)}
    expected = record.pop("weights_sha256", None)
    saved = save_merged(PeftModel.from_pretrained(model, adapter), tokenizer, record, output_dir)
    if saved["weights_sha256"] == expected:
        log(f"merged weights identical to the trained warm start's (sha256 {expected[:16]}...)")
    else:
        log(f"WARNING: the merged weights differ from the trained warm start's (sha256 {saved['weights_sha256'][:16]}... "
            f"against {str(expected)[:16]}...): another torch build or CPU; runs from it are not the runs made from that")
    return saved


def run_warm_start_command(*, config: WarmStartConfig, output_dir: Path | None, overwrite: bool, evaluate: bool,
                           eval_n: int, temperature: float, eval_seed: int, max_new_tokens: int | None,
                           adapter: Path | None = None) -> None:
    """What ``pivotrl pretrain --model NAME`` does for a pretrained model: the warm start (or with `adapter`,
    the warm start rebuilt from a kept copy of its adapter), saved to `output_dir` (default: the warm start's
    named folder in the cache, where it has a name), then its held-out accuracy in chat form."""
    from pivotrl.errors import ConfigError
    from pivotrl.evaluation import evaluate_heldout
    from pivotrl.modeling.policy import load_policy
    from pivotrl.modeling.warm_names import warm_start_folder, warm_start_name
    from pivotrl.tasks import get_task
    from pivotrl.train.run_folder import claim_model_folder

    name = warm_start_name(config.model, config.task)
    if output_dir is None:
        if name is None:
            raise ConfigError(f"--output-dir is needed: {config.model} warm-started on {config.task} has no name "
                              "of its own (pivotrl.modeling.warm_names.WARM_STARTS)")
        output_dir = warm_start_folder(name)
    task = get_task(config.task)  # an unknown task fails here, before any work
    lock = claim_model_folder(output_dir, overwrite=overwrite, say=print)
    try:
        if adapter is not None:
            print(f"merging the kept adapter {adapter} into {config.model} -> {output_dir}", flush=True)
            record = merge_kept_adapter(config, adapter, output_dir, log=lambda line: print(line, flush=True))
        else:
            print(f"warm start of {config.model} on {config.task}'s worked solutions: {config.steps} steps x "
              f"{config.batch_size}, LoRA rank {config.lora_rank}, lr {config.lr:g}, seed {config.seed}, "
              f"{config.threads} thread(s) -> {output_dir}", flush=True)
            record = warm_start(config, output_dir, log=lambda line: print(line, flush=True))
    finally:
        lock.release()
    named = name is not None and output_dir == warm_start_folder(name)
    how = "merged" if adapter is not None else f"after {record['train_s']:.0f} s"
    print(f"saved {output_dir} {how}" + (f": --model {name}" if named else ""), flush=True)
    if evaluate:
        model, tokenizer = load_policy(str(output_dir), device="cpu")
        length = max_new_tokens or task.response_limit(tokenizer)
        print(f"measuring on {eval_n} held-out {config.task} problems, chat form (T={temperature}, seed {eval_seed}, "
              f"at most {length} tokens)", flush=True)
        res = evaluate_heldout(model, tokenizer, task, n=eval_n, temperature=temperature, seed=eval_seed,
                               max_new_tokens=length, chat=True)
        trained = record.get("heldout")
        record["heldout"] = {k: res[k] for k in ("accuracy", "mean_length", "num_problems")}
        write_record(output_dir, record)
        print(f"held-out accuracy {res['accuracy']:.3f}  mean response {res['mean_length']:.1f} tokens  "
              f"(n={res['num_problems']})" + (f"; when trained: {trained['accuracy']:.3f}, {trained['mean_length']:.1f} "
                                              f"tokens (n={trained['num_problems']})" if trained else ""), flush=True)
