"""The hf rollout engine: its decode-attention switch and in-place cache change nothing but speed."""

from __future__ import annotations

import torch

from pivotrl.modeling.tiny import build_tiny_model
from pivotrl.modeling.tokenizer import build_char_tokenizer
from pivotrl.rollout.hf import HFEngine, decode_attention_for, growing_cache


def test_eager_decode_samples_what_the_model_samples_and_is_undone() -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2)
    model.set_attn_implementation("sdpa")
    assert decode_attention_for(model, "auto") == "eager"  # a CPU model
    assert decode_attention_for(model, None) is None
    prompts = ["Use 3 5 7 to make 8", "Use 1 2 to make 3"]
    out = {}
    for choice in (None, "auto"):
        engine = HFEngine(model, tokenizer, decode_attention=choice)
        out[choice, 0] = engine.generate(prompts, 2, max_new_tokens=12, temperature=0.0)
        out[choice, 1] = engine.generate(prompts, 3, max_new_tokens=12, generator=torch.Generator().manual_seed(4))
        assert model.config._attn_implementation == "sdpa"
        assert model.training  # build_tiny_model returns a module in train mode; the engine restores it
    for k in (0, 1):
        assert torch.equal(out[None, k].response_ids, out["auto", k].response_ids)
        assert torch.equal(out[None, k].response_mask, out["auto", k].response_mask)


def test_cache_grown_in_place_samples_exactly_what_the_concatenating_cache_samples() -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=1, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2)
    cache = growing_cache(model)
    assert cache is not None and type(cache.layers[0]).__name__ == "GrowingDynamicLayer"
    prompts = ["Use 3 5 7 to make 8", "Use 1 2 to make 3", "x"]
    out = {}
    for grow in (False, True):
        engine = HFEngine(model, tokenizer, grow_cache_in_place=grow)
        # 40 new tokens after a prompt of up to 20: the buffer is regrown more than once
        out[grow, 0] = engine.generate(prompts, 1, max_new_tokens=40, temperature=0.0)
        out[grow, 1] = engine.generate(prompts, 4, max_new_tokens=40, generator=torch.Generator().manual_seed(2))
    for k in (0, 1):
        assert torch.equal(out[False, k].response_ids, out[True, k].response_ids)
        assert out[True, k].response_mask.sum(dim=1).max() > 30
