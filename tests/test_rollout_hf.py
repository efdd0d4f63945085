"""The hf rollout engine samples with the shared policy and leaves it as it found it."""

from __future__ import annotations

import torch

from pivotrl.modeling.tiny import build_tiny_model
from pivotrl.modeling.tokenizer import build_char_tokenizer
from pivotrl.rollout.hf import HFEngine


def test_sampling_leaves_the_shared_model_as_it_found_it() -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2)
    model.set_attn_implementation("sdpa")
    seen: set[str] = set()
    model.register_forward_pre_hook(lambda module, args: seen.add(module.config._attn_implementation))
    engine = HFEngine(model, tokenizer)
    engine.generate(["Use 3 5 7 to make 8", "Use 1 2 to make 3"], 3, max_new_tokens=12,
                    generator=torch.Generator().manual_seed(4))
    assert seen == {"sdpa"}  # every prefill and decode step ran the model's own attention
    assert model.config._attn_implementation == "sdpa"
    assert model.training  # build_tiny_model returns a module in train mode; the engine restores it
