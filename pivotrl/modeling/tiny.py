"""The built-in tiny policies: small ``LlamaForCausalLM`` models with a character tokenizer.

The package ships three checkpoints made by ``pivotrl pretrain`` (see
:data:`TINY_MODELS`): ``tiny`` (``pivotrl/assets/tiny-countdown``, ~0.9 M
parameters, warmed up on countdown worked solutions), ``tiny-search``
(``pivotrl/assets/tiny-countdown-search``, warmed up on the written searches
of ``countdown_search``) and ``tiny-free`` (``pivotrl/assets/tiny-countdown-free``,
warmed up on the worked solutions of ``countdown_free``, with filler words).
Each is a plain Hugging Face folder, so ``LlamaForCausalLM.from_pretrained(path)``
and ``PreTrainedTokenizerFast.from_pretrained(path)`` load it anywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TINY_NAME = "tiny-countdown"
#: Model names (``--model``, ``model.name_or_path``) of the shipped checkpoints -> their folders.
TINY_MODELS = {"tiny": TINY_NAME, "tiny-search": "tiny-countdown-search", "tiny-free": "tiny-countdown-free"}

#: The shipped architecture: hidden 128, 4 layers, 4 heads, MLP 384, tied embeddings.
TINY_ARCH: dict[str, Any] = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 384,
    "max_position_embeddings": 256,
}


def tiny_policy_path(name: str = "tiny") -> Path:
    """The folder of a shipped checkpoint (``tiny``: ``pivotrl/assets/tiny-countdown``)."""
    try:
        folder = TINY_MODELS[name]
    except KeyError:
        raise ValueError(f"no shipped tiny policy {name!r}; known: {', '.join(TINY_MODELS)}") from None
    return Path(__file__).resolve().parent.parent / "assets" / folder


def tiny_config(tokenizer: PreTrainedTokenizerFast, **arch: Any) -> LlamaConfig:
    """A LlamaConfig for ``tokenizer``; ``arch`` overrides :data:`TINY_ARCH` entries."""
    sizes = {**TINY_ARCH, **arch}
    return LlamaConfig(
        vocab_size=len(tokenizer),
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        initializer_range=0.02,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
        **sizes,
    )


def tiny_generation_config(
    tokenizer: PreTrainedTokenizerFast, max_new_tokens: int = 48
) -> GenerationConfig:
    """Plain temperature-1 sampling (no top-k/top-p truncation) up to ``max_new_tokens``."""
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast, *, seed: int = 0, **arch: Any
) -> LlamaForCausalLM:
    """A freshly initialised tiny Llama for ``tokenizer`` (weights fixed by ``seed``)."""
    config = tiny_config(tokenizer, **arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = tiny_generation_config(tokenizer)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def load_tiny_policy(
    path: str | Path | None = None, *, device: str | torch.device = "cpu"
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """(model in eval mode, tokenizer with left padding) from ``path`` (default: the shipped one)."""
    path = Path(path) if path is not None else tiny_policy_path()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"no tiny checkpoint at {path}; make one with `pivotrl pretrain --output-dir {path}`"
        )
    from pivotrl.modeling.quiet import quiet_loading

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    tokenizer.padding_side = "left"
    with quiet_loading():
        model = LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.to(device)
    model.eval()
    return model, tokenizer
