"""Choosing a rollout engine by name."""

from __future__ import annotations

from typing import Any

from pivotrl.rollout.base import RolloutEngine


def make_engine(name: str, model: Any, tokenizer: Any, **options: Any) -> RolloutEngine:
    """The rollout engine `name` ('hf' or 'vllm') around a policy and its tokenizer."""
    if name == "hf":
        from pivotrl.rollout.hf import HFEngine

        return HFEngine(model, tokenizer, **options)
    if name == "vllm":
        from pivotrl.rollout.vllm import VLLMEngine

        return VLLMEngine(model, tokenizer, **options)
    raise ValueError(f"unknown rollout engine {name!r}; known: hf, vllm")
