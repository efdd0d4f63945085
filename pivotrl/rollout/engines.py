"""Choosing a rollout engine by name."""

from __future__ import annotations

from typing import Any

from pivotrl.rollout.base import RolloutEngine

ENGINES = ("hf", "vllm")


def check_engine(name: str, device: str = "auto") -> None:
    """ValueError for an unknown engine name; ConfigError when `name` is vllm and vLLM is not installed for
    `device` (checked without loading anything)."""
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; known: {', '.join(ENGINES)}")
    if name == "vllm":
        from pivotrl.modeling.policy import resolve_device
        from pivotrl.rollout.vllm import check_vllm_installed

        check_vllm_installed(resolve_device(device).type)


def make_engine(name: str, model: Any, tokenizer: Any, **options: Any) -> RolloutEngine:
    """The rollout engine `name` ('hf' or 'vllm') around a policy and its tokenizer."""
    if name == "hf":
        from pivotrl.rollout.hf import HFEngine

        return HFEngine(model, tokenizer, **options)
    if name == "vllm":
        from pivotrl.rollout.vllm import VLLMEngine

        return VLLMEngine(model, tokenizer, **options)
    raise ValueError(f"unknown rollout engine {name!r}; known: hf, vllm")
