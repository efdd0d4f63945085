"""The hf rollout engine samples with the shared policy, leaves it as it found it, and grows its cache in place."""

from __future__ import annotations

import torch

from pivotrl.modeling.tiny import build_tiny_model
from pivotrl.modeling.tokenizer import build_char_tokenizer
from pivotrl.rollout.hf import HFEngine, growing_cache


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
        assert torch.equal(out[False, k].sampler_logprobs, out[True, k].sampler_logprobs)
        assert out[True, k].response_mask.sum(dim=1).max() > 30
