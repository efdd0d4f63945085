"""Loading the policy (and a frozen reference copy): the shipped tiny model, a fresh one, or any causal LM."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
    ('tiny', 'tiny-search'), 'tiny-random' or a path/hub id."""
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
        tokenizer = load_tokenizer(name_or_path)
        try:
            model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=DTYPES[dtype])
        except OSError as err:
            raise ValueError(f"model.name_or_path={name_or_path!r}: cannot load a causal LM ({err})") from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.to(device=resolve_device(device), dtype=DTYPES[dtype])
    return model, tokenizer


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a local folder or hub id (fast tokenizer when one exists)."""
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot load a tokenizer from {name_or_path!r} ({err})") from err


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
