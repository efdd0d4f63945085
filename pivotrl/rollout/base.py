"""What every rollout engine returns, and how to pick one by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor


@dataclass
class Rollout:
    """G samples for each of P prompts, rows ordered prompt-major (row = p*G + g).

    prompt_ids (B,P) left-padded with prompt_mask; response_ids (B,R) right-padded
    with pad after the end, response_mask (B,R) bool covering the sampled tokens
    including a final EOS; texts: the decoded responses, special tokens removed;
    truncated (B,) bool: the response hit max_new_tokens without EOS;
    sampler_logprobs (B,R) float32, when the engine reports it: ℓ^sampler, the
    log-probability of each drawn token under the distribution the sampler drew it from
    (softmax(logits / T) on the top-p nucleus, renormalised; T <= 0 scores at T = 1), 0 on padding.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    texts: list[str]
    truncated: Tensor

    @property
    def group_index(self) -> Tensor:
        """(B,) int64: the prompt each row answers."""
        groups = self.prompt_ids.shape[0] // max(self.group_size, 1)
        return torch.arange(groups).repeat_interleave(self.group_size)

    group_size: int = 1
    sampler_logprobs: Tensor | None = None


def tokenize_prompts(tokenizer: Any, prompts: list[str], max_prompt_tokens: int | None) -> list[list[int]]:
    """Each prompt's token ids (special tokens added, truncated to max_prompt_tokens): what every engine feeds its model."""
    enc = tokenizer(prompts, add_special_tokens=True, truncation=max_prompt_tokens is not None,
                    max_length=max_prompt_tokens)
    return [list(ids) for ids in enc["input_ids"]]


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token-id lists as left-padded ids (B,P) int64 and their bool mask."""
    width = max(1, max((len(r) for r in rows), default=0))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):  # once per prompt, off the hot path
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = True
    return ids, mask


class RolloutEngine(Protocol):
    """Samples completions for prompts with the current policy."""

    def generate(
        self,
        prompts: list[str],
        num_samples: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """num_samples completions of every prompt, as a Rollout (with sampler_logprobs for the trainer's sampler check)."""
        ...

    def sync_weights(self) -> None:
        """Make the engine sample from the policy's current weights."""
        ...


def make_engine(name: str, model: Any, tokenizer: Any, **options: Any) -> RolloutEngine:
    """The rollout engine `name` ('hf' or 'vllm') around a policy and its tokenizer."""
    if name == "hf":
        from pivotrl.rollout.hf import HFEngine

        return HFEngine(model, tokenizer, **options)
    if name == "vllm":
        from pivotrl.rollout.vllm import VLLMEngine

        return VLLMEngine(model, tokenizer, **options)
    raise ValueError(f"unknown rollout engine {name!r}; known: hf, vllm")


def _pad_to(x: Tensor, width: int, value: float | bool, left: bool) -> Tensor:
    extra = width - x.shape[1]
    if extra == 0:
        return x
    fill = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
    return torch.cat([fill, x] if left else [x, fill], dim=1)


def select_rows(rollout: Rollout, rows: Tensor) -> Rollout:
    """The rollout restricted to `rows` (int64 indices; keep whole groups to keep group_size)."""
    idx = rows.tolist()
    sampler = rollout.sampler_logprobs
    return Rollout(rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows],
                   rollout.response_mask[rows], [rollout.texts[i] for i in idx], rollout.truncated[rows],
                   group_size=rollout.group_size, sampler_logprobs=None if sampler is None else sampler[rows])


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Rollouts of one group size stacked row-wise, prompts re-left-padded, responses re-right-padded."""
    if len(parts) == 1:
        return parts[0]
    p_width = max(r.prompt_ids.shape[1] for r in parts)
    r_width = max(r.response_ids.shape[1] for r in parts)
    sampler = None
    if all(r.sampler_logprobs is not None for r in parts):
        sampler = torch.cat([_pad_to(r.sampler_logprobs, r_width, 0.0, left=False) for r in parts])
    return Rollout(
        torch.cat([_pad_to(r.prompt_ids, p_width, pad_id, left=True) for r in parts]),
        torch.cat([_pad_to(r.prompt_mask, p_width, False, left=True) for r in parts]),
        torch.cat([_pad_to(r.response_ids, r_width, pad_id, left=False) for r in parts]),
        torch.cat([_pad_to(r.response_mask, r_width, False, left=False) for r in parts]),
        [t for r in parts for t in r.texts],
        torch.cat([r.truncated for r in parts]),
        group_size=parts[0].group_size,
        sampler_logprobs=sampler,
    )
