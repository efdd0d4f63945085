"""``pivotrl export RUN_DIR -o DIR``: a run's policy as a plain Hugging Face model folder.

The model is the run's newest checkpoint (or the checkpoint folder given): a LoRA run's adapter is
merged into its base, W + alpha/r·B A (modeling/lora.py), a full run's weights are written as they
are. The folder holds the model (float32 safetensors), its tokenizer and the prompt form the run
trained in (``prompt_form.json``), so ``--model DIR`` (and transformers, vLLM, TRL) load it as any
model. The files are written to a folder beside DIR first and moved in when all are written,
config.json last, so a crash never leaves a folder that loads.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from pivotrl.modeling.lora import adapter_base, is_adapter_folder
from pivotrl.modeling.policy import load_policy, model_in_folder
from pivotrl.modeling.prompt_form import save_prompt_form, saved_prompt_form
from pivotrl.modeling.quiet import quiet_loading
from pivotrl.train.run_folder import claim_model_folder


def export_source(run_dir: Path) -> Path:
    """The checkpoint that `pivotrl export RUN_DIR` writes out: RUN_DIR's newest, or RUN_DIR itself when it
    holds a model. ValueError naming RUN_DIR when it holds neither, or naming a LoRA adapter's missing base."""
    if not run_dir.is_dir():
        what = "is a file" if run_dir.exists() else "does not exist"
        raise ValueError(f"RUN_DIR {run_dir} {what}; give a run folder (pivotrl train -o) or one of its checkpoints")
    try:
        source = Path(model_in_folder(str(run_dir)))
    except ValueError:
        raise ValueError(f"RUN_DIR {run_dir} holds no model: no checkpoints/step-* of a run, and no config.json or "
                         "adapter_config.json of its own") from None
    if is_adapter_folder(source):
        base = adapter_base(source)
        if Path(base).is_absolute() and not Path(base).is_dir():
            raise ValueError(f"{source} is a LoRA adapter whose base model {base} (base_model_name_or_path in its "
                             "adapter_config.json) does not exist")
    return source


def export_model(run_dir: Path, output_dir: Path, *, overwrite: bool = False,
                 say: Callable[[str], None] = print) -> Path:
    """Write the policy of `run_dir` (export_source) into `output_dir` as a plain model folder; returns the
    checkpoint it came from. The output folder is checked (new or empty; with `overwrite` what it holds is
    moved aside) and locked before the model is loaded."""
    source = export_source(run_dir)
    out, held = output_dir.resolve(), source.resolve()
    if out == held or out in held.parents:
        raise ValueError(f"--output-dir {output_dir} holds the run being exported; give a folder outside it")
    lock = claim_model_folder(output_dir, overwrite=overwrite, what="--output-dir", say=say)
    try:
        model, tokenizer = load_policy(str(source), device="cpu")
        work = output_dir.parent / f".{output_dir.name}.export-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        with quiet_loading():
            model.save_pretrained(work, safe_serialization=True)
            tokenizer.save_pretrained(work)
        save_prompt_form(work, bool(saved_prompt_form(str(source))))
        for path in sorted(work.iterdir(), key=lambda p: p.name == "config.json"):
            path.rename(output_dir / path.name)
        work.rmdir()
    finally:
        lock.release()
    return source
