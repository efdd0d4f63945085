"""Atomic checkpoints: written to a temporary folder, then renamed into place.

checkpoints/step-000040/ holds the model and tokenizer (save_pretrained, safetensors;
for a LoRA run the adapter instead of the model: adapter_config.json, naming the base
model's folder, and adapter_model.safetensors, modeling/lora.py) and the trainer state:
optimizer, every RNG state, step and data position, as trainer_state.json (numbers,
strings, lists) plus trainer_state.safetensors (its tensors). Neither format can run
code when read, so a checkpoint from anyone is safe to resume from. A folder named step-* is complete by construction (rename is
atomic), so a run killed at any instant leaves every finished checkpoint intact.

Checkpoints written before this format hold a pickled trainer_state.pt; it is read
with torch.load(weights_only=True), which refuses anything but tensors and plain
containers, and a file it refuses is reported, never executed.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pivotrl.errors import CheckpointError
from pivotrl.modeling.lora import ADAPTER_WEIGHTS, load_adapter_weights, save_adapter
from pivotrl.modeling.prompt_form import save_prompt_form

PREFIX = "step-"
STATE_JSON = "trainer_state.json"
STATE_TENSORS = "trainer_state.safetensors"
LEGACY_STATE = "trainer_state.pt"
MODEL_FILE = "model.safetensors"



def checkpoint_dir(root: Path, step: int) -> Path:
    """root/step-000042."""
    return root / f"{PREFIX}{step:06d}"


def _is_checkpoint(path: Path) -> bool:
    return (path.is_dir() and path.name.startswith(PREFIX) and path.name[len(PREFIX):].isdigit()
            and ((path / STATE_JSON).is_file() or (path / LEGACY_STATE).is_file()))


def list_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if _is_checkpoint(p)), key=lambda p: int(p.name[len(PREFIX):]))


def latest_checkpoint(root: Path) -> Path | None:
    """The newest finished checkpoint under root, or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def rng_states() -> dict[str, Any]:
    """The global RNG states (python, torch CPU, and CUDA when present)."""
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Undo rng_states()."""
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


# -- the trainer state as JSON + safetensors ----------------------------------------
# JSON keeps what it can (numbers, strings, None, str-keyed dicts, lists); the rest is
# tagged: {"__tensor__": name} (stored in the safetensors file), {"__tuple__": [...]},
# {"__items__": [[key, value], ...]} (a dict whose keys are not all plain strings).


def encode_state(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """`obj` as JSON-ready data; its tensors are moved into `tensors` under fresh names."""
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": name}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode_state(v, tensors) for k, v in obj.items()}
        return {"__items__": [[encode_state(k, tensors), encode_state(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode_state(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [encode_state(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store a {type(obj).__name__} in a checkpoint's trainer state")


def decode_state(data: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Undo encode_state; KeyError when a tensor it names is missing."""
    if isinstance(data, list):
        return [decode_state(v, tensors) for v in data]
    if not isinstance(data, dict):
        return data
    if data.keys() == {"__tensor__"}:
        return tensors[data["__tensor__"]]
    if data.keys() == {"__tuple__"}:
        return tuple(decode_state(v, tensors) for v in data["__tuple__"])
    if data.keys() == {"__items__"}:
        return {_hashable(decode_state(k, tensors)): decode_state(v, tensors) for k, v in data["__items__"]}
    return {k: decode_state(v, tensors) for k, v in data.items()}


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def save_state(folder: Path, state: dict[str, Any]) -> None:
    """Write `state` as folder/trainer_state.json + folder/trainer_state.safetensors."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    data = encode_state(state, tensors)
    save_file(tensors, str(folder / STATE_TENSORS))
    (folder / STATE_JSON).write_text(json.dumps(data))


def load_state(path: Path) -> dict[str, Any]:
    """The trainer state of checkpoint folder `path`, read without running any code from it.

    Raises CheckpointError naming the file when it is missing, damaged, or (a legacy
    trainer_state.pt) holds objects that only an unsafe unpickling could build.
    """
    if (path / STATE_JSON).is_file():
        return _load_json_state(path)
    legacy = path / LEGACY_STATE
    if legacy.is_file():
        try:
            with warnings.catch_warnings():  # torch warns about pickle protocols it reads anyway
                warnings.simplefilter("ignore")
                state = torch.load(legacy, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise CheckpointError(
                f"{legacy}: cannot be read safely: torch.load(weights_only=True), which builds nothing but "
                "tensors and plain containers, refused it (objects that could run code, or a damaged file); "
                "it was not loaded, and nothing in it ran") from None
        except Exception as err:  # noqa: BLE001 - a damaged file raises whatever the zip/pickle reader hits
            raise CheckpointError(f"{legacy}: damaged ({first_line(err)})") from None
        if not isinstance(state, dict):
            raise CheckpointError(f"{legacy}: not a trainer state (a {type(state).__name__})")
        return state
    raise CheckpointError(f"{path}: no {STATE_JSON} (nor a legacy {LEGACY_STATE})")


def _load_json_state(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    try:
        data = json.loads((path / STATE_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path / STATE_JSON}: unreadable ({first_line(err)})") from None
    try:
        tensors = load_file(str(path / STATE_TENSORS)) if (path / STATE_TENSORS).is_file() else {}
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path / STATE_TENSORS}: damaged ({first_line(err)})") from None
    try:
        state = decode_state(data, tensors)
    except KeyError as err:
        raise CheckpointError(f"{path / STATE_JSON} names tensor {err.args[0]!r}, which "
                              f"{STATE_TENSORS} lacks") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path / STATE_JSON}: not a trainer state")
    return state


def check_model_file(path: Path, name: str = MODEL_FILE) -> None:
    """CheckpointError unless path/`name` (model.safetensors, or a LoRA run's adapter_model.safetensors)
    is present and complete.

    safetensors checks on opening that the header parses and that the tensors it
    lists cover the file exactly, so a truncated file is caught without reading it.
    """
    from safetensors import safe_open

    model_file = path / name
    if not model_file.is_file():
        raise CheckpointError(f"{model_file}: missing")
    try:
        with safe_open(str(model_file), framework="pt"):
            pass
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise CheckpointError(f"{model_file}: damaged ({first_line(err)})") from None


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def save_checkpoint(root: Path, step: int, *, model: Any, tokenizer: Any, state: dict[str, Any], keep: int,
                    chat: bool = False, lora: Any = None) -> Path:
    """Write checkpoint `step` atomically and keep only the newest `keep`; `lora`: a LoRA run's PeftModel,
    whose adapter is saved instead of the model's weights."""
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir(root, step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    from pivotrl.modeling.quiet import quiet_loading

    with quiet_loading():  # no "Writing model shards" bar in the trainer's output
        if lora is not None:
            save_adapter(lora, tmp)
        else:
            model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        save_prompt_form(tmp, chat)
    save_state(tmp, state)
    _fsync_tree(tmp)
    if final.exists():  # the same step saved again (e.g. the final save after a periodic one)
        trash = root / f".trash-{final.name}-{os.getpid()}"
        os.rename(final, trash)
        shutil.rmtree(trash)
    os.rename(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(root)[:-keep]:
        trash = root / f".trash-{old.name}-{os.getpid()}"
        os.rename(old, trash)  # atomic: never a half-deleted step-* folder
        shutil.rmtree(trash, ignore_errors=True)
    for stale in root.glob(".t*-*"):  # leftovers of a run killed mid-write or mid-delete
        if stale.is_dir() and str(os.getpid()) not in stale.name:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def _fsync_tree(folder: Path) -> None:
    for p in folder.iterdir():
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_weights(path: Path, like: torch.nn.Module) -> torch.nn.Module:
    """The model of checkpoint `path` on the device and dtype of `like` (safetensors only: nothing in it can run)."""
    from transformers import AutoModelForCausalLM

    from pivotrl.modeling.quiet import quiet_loading

    device, dtype = next(like.parameters()).device, next(like.parameters()).dtype
    try:
        with quiet_loading():
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, use_safetensors=True)
    except Exception as err:  # noqa: BLE001 - whatever the damage, this checkpoint cannot be used
        raise CheckpointError(f"{path}: cannot load the model ({first_line(err)})") from None
    return model.to(device)


def load_adapter(path: Path, lora: Any) -> None:
    """Set the adapter of a LoRA run's PeftModel to the one checkpoint `path` holds (safetensors only)."""
    try:
        load_adapter_weights(lora, path)
    except ValueError as err:
        raise CheckpointError(f"{path}: cannot load the LoRA adapter ({err})") from None


def newest_intact(root: Path, like: torch.nn.Module, warn: Callable[[str], None],
                  lora: Any = None) -> tuple[Path, dict[str, Any], torch.nn.Module] | None:
    """(path, trainer state, model) of the newest intact checkpoint under `root`, or None if there is none.
    For a LoRA run (`lora`: its PeftModel around `like`) the checkpoint's adapter is loaded into `lora`,
    and the model returned is `like`.

    A damaged or unsafe checkpoint is skipped with a warning that names it, and set aside
    (renamed step-N.damaged, which nothing loads or rotates) once an older one is usable.
    When checkpoints exist but none is intact, CheckpointError lists what is wrong with each.
    """
    unusable: list[tuple[Path, str]] = []
    for path in reversed(list_checkpoints(root)):
        try:
            check_model_file(path, MODEL_FILE if lora is None else ADAPTER_WEIGHTS)
            state = load_state(path)
            if lora is None:
                model = load_weights(path, like)
            else:
                load_adapter(path, lora)
                model = like
        except CheckpointError as err:
            unusable.append((path, str(err)))
            continue
        for bad, why in unusable:
            aside = bad.with_name(f"{bad.name}.damaged")
            bad.rename(aside)
            warn(f"checkpoint {bad.name} is not usable ({why}); set aside as {aside.name}, "
                 f"resuming from the older {path.name}")
        return path, state, model
    if unusable:
        raise CheckpointError(f"no intact checkpoint in {root}: " + "; ".join(why for _, why in unusable))
    return None


def interrupted_message(root: Path, step: int) -> str:
    """What to tell a user whose run was stopped at `step`: which checkpoint a rerun resumes from."""
    latest = latest_checkpoint(root)
    if latest is None:
        return f"interrupted at step {step}, before the first checkpoint: a rerun starts from step 0"
    saved = int(latest.name[len(PREFIX):])
    return (f"interrupted at step {step}; the newest checkpoint, {latest}, holds step {saved}: "
            "rerun the same command with --resume to continue from it")
