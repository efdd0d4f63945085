"""Loading the policy (and a frozen reference copy): the shipped tiny model, a fresh one, or any causal LM."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from pivotrl.modeling.quiet import quiet_loading

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def compute_precision(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """The context a forward of float32 weights runs in to compute in `dtype`: torch.autocast to
    bfloat16 or float16 (the matmuls in that dtype, the weights left as they are), nothing for float32."""
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[dtype])


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; anything else as given."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_policy(
    name_or_path: str, *, dtype: str = "float32", device: str = "auto", seed: int = 0,
    arch: dict[str, int] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer with left padding and a pad token) for a shipped tiny policy
    ('tiny', 'tiny-search', 'tiny-free'), 'tiny-random', a packaged GGUF model ('smollm2-135m') or its
    warm start ('smollm2-135m-add_sub', made by pivotrl pretrain: modeling/warm_names.py),
    a .gguf file (both converted once into a cached folder: modeling/gguf.py) or a path/hub id; a run
    folder means its newest checkpoint, and a LoRA run's checkpoint (a saved adapter) loads as its base
    with the adapter merged (modeling/lora.py)."""
    from pivotrl.modeling.tiny import TINY_MODELS

    if dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if name_or_path in TINY_MODELS:
        from pivotrl.modeling.tiny import load_tiny_policy, tiny_policy_path

        model, tokenizer = load_tiny_policy(tiny_policy_path(name_or_path))
    elif name_or_path == "tiny-random":
        from pivotrl.modeling.tiny import build_tiny_model
        from pivotrl.modeling.tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, seed=seed, **(arch or {}))
    else:
        from pivotrl.modeling.gguf import resolve_gguf
        from pivotrl.modeling.lora import is_adapter_folder
        from pivotrl.modeling.warm_names import resolve_warm_start

        name_or_path = model_in_folder(resolve_gguf(resolve_warm_start(name_or_path)))
        if is_adapter_folder(name_or_path):  # a LoRA run's checkpoint: its base with the adapter merged
            model, tokenizer = _load_adapted(name_or_path, device=device)
        else:
            options = model_source(name_or_path)
            tokenizer = load_tokenizer(name_or_path, **options)
            try:
                with quiet_loading():
                    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=DTYPES[dtype], **options)
            except (OSError, ValueError) as err:
                raise ValueError(f"model {name_or_path!r}: cannot load a causal LM ({_first_line(err)})") from None
    # The tokenizer warns once when a text is longer than its model_max_length ("will result in
    # indexing errors"); rotary models (every model here) have no position table to index out of,
    # and prompt length is bounded where it matters, by rollout.max_prompt_tokens.
    getattr(tokenizer, "deprecation_warnings", {})["sequence-length-is-longer-than-the-specified-maximum"] = True
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.to(device=resolve_device(device), dtype=DTYPES[dtype])
    return model, tokenizer


def _load_adapted(folder: str, *, device: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) of a saved LoRA adapter: its base (float32) with the adapter merged, and the tokenizer
    saved beside the adapter."""
    from pivotrl.modeling.lora import INSTALL, adapter_base, load_merged, peft_installed

    if not peft_installed():
        raise ValueError(f"model {folder!r} is a LoRA adapter, and loading one needs peft: {INSTALL}")
    base = adapter_base(folder)
    try:
        model = load_policy(base, device=device)[0]
    except ValueError as err:
        raise ValueError(f"model {folder!r} is a LoRA adapter whose base model (base_model_name_or_path in its "
                         f"adapter_config.json) does not load: {err}") from None
    tokenizer = load_tokenizer(folder)
    try:
        model = load_merged(folder, model)
    except ValueError as err:
        raise ValueError(f"model {folder!r}: {err}") from None
    return model, tokenizer


def model_location(name_or_path: str) -> str:
    """Where load_policy reads a model from: a shipped tiny policy's folder, the cached folder of a GGUF model
    or a warm start, a run folder's newest checkpoint, a model folder (absolute paths), or a hub id as given.
    ValueError for 'tiny-random', which is built, not read."""
    from pivotrl.modeling.gguf import resolve_gguf
    from pivotrl.modeling.tiny import TINY_MODELS, tiny_policy_path
    from pivotrl.modeling.warm_names import resolve_warm_start

    if name_or_path == "tiny-random":
        raise ValueError("model 'tiny-random' is built at run time from model.arch and train.seed: no folder holds it")
    if name_or_path in TINY_MODELS:
        return str(tiny_policy_path(name_or_path).resolve())
    found = model_in_folder(resolve_gguf(resolve_warm_start(name_or_path)))
    return str(Path(found).resolve()) if Path(found).is_dir() else found


def _holds_model(folder: Path) -> bool:
    """Whether `folder` holds a model: a full one (config.json) or a LoRA adapter (adapter_config.json)."""
    return (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file()


def model_in_folder(name_or_path: str) -> str:
    """The model a local folder holds: the folder itself (a model, or a LoRA adapter), or for a training run's
    folder (which holds checkpoints/step-N, not a model) its newest checkpoint. ValueError for a folder with
    neither."""
    folder = Path(name_or_path)
    if not folder.is_dir() or _holds_model(folder):
        return name_or_path
    steps = sorted(p for p in (folder / "checkpoints").glob("step-*") if _holds_model(p))
    if steps:
        return str(steps[-1])
    raise ValueError(f"model {name_or_path!r} is a folder without a model (no config.json) and without "
                     "checkpoints/step-* of a training run; give a model folder, a run folder, or a hub id")


def load_tokenizer(name_or_path: str, **options: Any) -> PreTrainedTokenizerBase:
    """The tokenizer of a local folder or hub id (fast tokenizer when one exists)."""
    try:
        return AutoTokenizer.from_pretrained(name_or_path, **options)
    except (OSError, ValueError) as err:
        raise ValueError(f"model {name_or_path!r}: cannot load its tokenizer ({_first_line(err)})") from None


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


def model_source(name_or_path: str) -> dict[str, Any]:
    """Where a model comes from, checked before anything waits on the network.

    An existing folder must hold config.json. Anything else must look like a hub id
    ('name' or 'org/name') and be either in the local hub cache or on a reachable hub;
    otherwise ValueError says which, at once. Returns extra from_pretrained options
    ({'local_files_only': True} for a cached model while the hub is unreachable).
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model folder {name_or_path} has no config.json: not a saved model")
        return {}
    if path.exists():
        raise ValueError(f"model {name_or_path} is a file; give a model folder (with config.json) or a hub id")
    if not _HUB_ID.fullmatch(name_or_path) or ".." in name_or_path:
        raise ValueError(f"model path {name_or_path} does not exist")
    from huggingface_hub import try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(name_or_path, "config.json"), str)
    if _hub_reachable():
        return {}
    if cached:
        return {"local_files_only": True}
    raise ValueError(f"model {name_or_path!r}: no such local folder, and not in the hub cache while the hub is "
                     "unreachable (offline?); give a model folder")


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to the hub opens within timeout_s (False when HF_HUB_OFFLINE is set)."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout_s).close()
    except OSError:
        return False
    return True


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def frozen_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A deep copy with gradients off, in eval mode: the reference model."""
    import copy

    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    ref.eval()
    return ref


def lm_parts(model: PreTrainedModel) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the decoder returning hidden states, the LM head) of a causal LM."""
    head = model.get_output_embeddings()
    body = getattr(model, model.base_model_prefix, None)
    if head is None or body is None:
        raise ValueError(f"{type(model).__name__} has no separate decoder and LM head")
    return body, head


def describe(model: Any) -> str:
    """'LlamaForCausalLM, 0.86 M parameters, float32 on cpu'."""
    n = sum(p.numel() for p in model.parameters())
    p = next(model.parameters())
    return f"{type(model).__name__}, {n / 1e6:.2f} M parameters, {str(p.dtype).split('.')[-1]} on {p.device}"


def cache_kwarg(module: torch.nn.Module) -> str:
    """The name a model's forward gives its KV-cache argument ('cache' from transformers 5.x, else 'past_key_values')."""
    import inspect

    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def output_cache(output: Any) -> Any:
    """The KV cache a forward returned, under either attribute name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def positions_from_mask(attention: torch.Tensor) -> torch.Tensor:
    """Position ids (B,T) of left-padded rows: 0 at each row's first real token, 0 on its padding."""
    return (attention.long().cumsum(dim=1) - 1).clamp(min=0)
