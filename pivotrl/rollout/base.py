"""What every rollout engine returns, and how to pick one by name."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

import torch
from torch import Tensor


def _per_row(layout: str, **kwargs: Any) -> Any:
    """A Rollout field holding one entry per row; `layout` says how rows are joined (see concat_rollouts)."""
    return field(metadata={"layout": layout}, **kwargs)


@dataclass
class Rollout:
    """G samples for each of P prompts, rows ordered prompt-major (row = p*G + g).

    prompt_ids (B,P) left-padded with prompt_mask; response_ids (B,R) right-padded
    with pad after the end, response_mask (B,R) bool covering the sampled tokens
    including a final EOS; texts: the decoded responses, special tokens removed;
    truncated (B,) bool: the response hit max_new_tokens without EOS;
    sampler_logprobs (B,R) float32, when the engine reports it: ℓ^sampler, the
    log-probability of each drawn token under the distribution it drew it from
    (softmax(logits / T) on the top-p nucleus, renormalised; T <= 0 scores at T = 1), 0 on padding;
    group_index (B,) int64: the prompt each row answers (by default row // group_size).

    Each per-row field is declared once, with its layout; select_rows and
    concat_rollouts derive what they do from these declarations.
    """

    prompt_ids: Tensor = _per_row("left-padded")
    prompt_mask: Tensor = _per_row("left-padded")
    response_ids: Tensor = _per_row("right-padded")
    response_mask: Tensor = _per_row("right-padded")
    texts: list[str] = _per_row("list")
    truncated: Tensor = _per_row("row")
    group_size: int = 1  # samples per prompt of the call that made it (0 after joining rollouts of several)
    sampler_logprobs: Tensor | None = _per_row("right-padded", default=None)
    group_index: Tensor | None = _per_row("group", default=None)

    def __post_init__(self) -> None:
        if self.group_index is None:
            groups = self.prompt_ids.shape[0] // max(self.group_size, 1)
            self.group_index = torch.arange(groups, device=self.prompt_ids.device).repeat_interleave(
                max(self.group_size, 1))


def row_fields(rollout: Rollout | type[Rollout] = Rollout) -> dict[str, str]:
    """{name: layout} of the per-row fields of a Rollout (class or instance, subclasses included)."""
    return {f.name: f.metadata["layout"] for f in fields(rollout) if "layout" in f.metadata}


def check_sampling(temperature: float, top_p: float) -> None:
    """ValueError unless temperature >= 0 (0: greedy) and top_p is in (0, 1] (the nucleus's mass)."""
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1: the whole distribution), got {top_p}")


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
    """Samples completions with the current policy: what the trainer, `credit` and `analyze` call on an engine."""

    tokenizer: Any  # the policy's tokenizer: pad_token_id, eos_token_id, decode, batch_decode

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

    def generate_from_ids(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        num_samples: int = 1,
        *,
        max_new_tokens: int | Tensor,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """Like generate, from left-padded token ids (B,P) and their mask (a prompt plus a forced prefix, say).

        max_new_tokens may be a (B,) tensor: each prompt's own limit (its samples stop there, truncated).
        """
        ...

    def sync_weights(self) -> None:
        """Make the engine sample from the policy's current weights."""
        ...


def pad_to(x: Tensor, width: int, value: float | bool | int, left: bool) -> Tensor:
    extra = width - x.shape[1]
    if extra == 0:
        return x
    fill = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
    return torch.cat([fill, x] if left else [x, fill], dim=1)


def select_rows(rollout: Rollout, rows: Tensor) -> Rollout:
    """The rollout restricted to `rows` (int64 indices; keep whole groups to keep group_size)."""
    idx = rows.tolist()
    picked = {}
    for name, layout in row_fields(rollout).items():
        value = getattr(rollout, name)
        picked[name] = None if value is None else [value[i] for i in idx] if layout == "list" else value[rows]
    return replace(rollout, **picked)


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Rollouts stacked row-wise: prompts re-left-padded, responses re-right-padded, groups kept apart.

    Padding takes `pad_id` for token ids, False for masks and 0 for floats; an optional
    field is kept only when every part has it. Joined rollouts of different group sizes
    get group_size 0 (group_index still says which rows share a prompt).
    """
    if len(parts) == 1:
        return parts[0]
    joined: dict[str, Any] = {}
    for name, layout in row_fields(parts[0]).items():
        values = [getattr(p, name) for p in parts]
        if any(v is None for v in values):
            joined[name] = None
        elif layout == "list":
            joined[name] = [item for v in values for item in v]
        elif layout == "group":  # each part numbers its groups from 0
            offsets = torch.tensor([0, *[int(v.max()) + 1 if len(v) else 0 for v in values[:-1]]]).cumsum(0)
            joined[name] = torch.cat([v + int(o) for v, o in zip(values, offsets, strict=True)])
        elif layout == "row":
            joined[name] = torch.cat(values)
        else:
            width = max(v.shape[1] for v in values)
            fill = False if values[0].dtype == torch.bool else 0.0 if values[0].is_floating_point() else pad_id
            joined[name] = torch.cat([pad_to(v, width, fill, left=layout == "left-padded") for v in values])
    sizes = {p.group_size for p in parts}
    return replace(parts[0], group_size=sizes.pop() if len(sizes) == 1 else 0, **joined)
