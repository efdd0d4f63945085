"""TokenBatch: the tensors every estimator and policy loss reads."""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields

import torch
from torch import Tensor


def optional_field(meaning: str, *, nan_means: str | None = None) -> Tensor | None:
    """An optional (N,T) float field of TokenBatch, None when absent; `meaning` names it in errors.

    Declaring a field this way is all it takes: validation, row selection and the
    "needs ..., which the batch does not have" errors of the registry derive from it.
    With `nan_means`, NaN at a valid position is a value with that meaning, not an error.
    """
    return field(default=None, metadata={"meaning": meaning, "nan_means": nan_means})


@dataclass(frozen=True)
class TokenBatch:
    """N responses padded to T tokens; see ALGORITHMS.md for the notation.

    rewards (N,) float, group_index (N,) int (equal values form a group),
    response_mask (N,T) bool (True on response tokens), old_logprobs (N,T),
    and the optional (N,T) fields below. Values at padding positions are
    ignored (they may be anything, even NaN); a non-finite value at a valid
    position raises ValueError.
    """

    rewards: Tensor
    group_index: Tensor
    response_mask: Tensor
    old_logprobs: Tensor
    ref_logprobs: Tensor | None = optional_field("the reference model's log-probs")
    entropies: Tensor | None = optional_field("the rollout policy's token entropies")
    pivot_values: Tensor | None = optional_field(
        "V̂ before each pivot token, from branches sampled there (rollout.branch)", nan_means="no pivot here")
    free_mask: Tensor | None = optional_field(
        "1.0 on the tokens the task marks as free choices (they cannot change the outcome), else 0.0")
    reachable: Tensor | None = optional_field(
        "1.0 on the tokens written while the task's target can still be reached, else 0.0")

    def __post_init__(self) -> None:
        _check_batch(self)
        if self.response_mask.dtype != torch.bool:
            object.__setattr__(self, "response_mask", self.response_mask.bool())

    @property
    def num_responses(self) -> int:
        """N, the number of responses."""
        return self.rewards.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The promoted floating dtype of the batch's float tensors."""
        dtype = torch.promote_types(self.rewards.dtype, self.old_logprobs.dtype)
        for name in optional_fields(self):
            value = getattr(self, name)
            if value is not None:
                dtype = torch.promote_types(dtype, value.dtype)
        return dtype

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype computations run in: the batch dtype, at least float32."""
        return torch.promote_types(self.dtype, torch.float32)

    @property
    def lengths(self) -> Tensor:
        """(N,) int64: number of valid response tokens per response."""
        return self.response_mask.sum(dim=1)

    def field(self, name: str, needed_by: str) -> Tensor:
        """The optional field `name` in compute dtype, zero on padding; ValueError if absent."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"{needed_by} needs TokenBatch.{name}, which is None")
        return masked(value.to(self.compute_dtype), self.response_mask)

    def select(self, rows: Tensor) -> TokenBatch:
        """The responses `rows` (int64 indices or a bool mask over N): every field, optional ones included."""
        picked = {f.name: getattr(self, f.name) for f in fields(self)}
        return type(self)(**{name: None if value is None else value[rows] for name, value in picked.items()})


def concat_batches(batches: list[TokenBatch]) -> TokenBatch:
    """Batches stacked row-wise: token fields right-padded to the widest, groups kept apart.

    Padding is masked out (mask False, values 0); an optional field absent from some batches
    is NaN there when NaN means "none" for it (pivot_values), and an error otherwise.
    """
    width = max(b.response_mask.shape[1] for b in batches)
    offsets = torch.tensor([0, *[int(torch.unique(b.group_index).numel()) for b in batches[:-1]]]).cumsum(0)
    joined: dict[str, Tensor | None] = {
        "rewards": torch.cat([b.rewards for b in batches]),
        "group_index": torch.cat([torch.unique(b.group_index, return_inverse=True)[1] + int(o)
                                  for b, o in zip(batches, offsets, strict=True)]),
        "response_mask": torch.cat([_pad_columns(b.response_mask, width, False) for b in batches]),
    }
    optional = optional_fields(batches[0])
    for f in fields(batches[0]):
        if f.name in joined:
            continue
        values = [getattr(b, f.name) for b in batches]
        if all(v is None for v in values):
            joined[f.name] = None
            continue
        present = next(v for v in values if v is not None)
        if any(v is None for v in values) and (f.name not in optional or f.metadata.get("nan_means") is None):
            raise ValueError(f"{f.name} is in some of the batches joined and not in the others")
        filled = [v if v is not None else torch.full(b.response_mask.shape, torch.nan, dtype=present.dtype,
                                                     device=present.device) for v, b in zip(values, batches, strict=True)]
        joined[f.name] = torch.cat([_pad_columns(v, width, 0.0) for v in filled])
    return type(batches[0])(**joined)


def _pad_columns(x: Tensor, width: int, value: float | bool) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def fields_by_name(batch: TokenBatch | type[TokenBatch]) -> dict[str, Field]:
    return {f.name: f for f in fields(batch)}


def optional_fields(batch: TokenBatch | type[TokenBatch] = TokenBatch) -> dict[str, str]:
    """{name: meaning} of the optional (N,T) fields of a TokenBatch (class or instance, subclasses included)."""
    return {f.name: f.metadata["meaning"] for f in fields(batch) if "meaning" in f.metadata}


def masked(x: Tensor, mask: Tensor) -> Tensor:
    """x with padding positions set to exactly 0 (safe for NaN/inf padding)."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _check_batch(b: TokenBatch) -> None:
    if not isinstance(b.rewards, Tensor) or b.rewards.ndim != 1:
        raise ValueError(f"rewards must be a 1-D tensor (N,), got {_describe(b.rewards)}")
    n = b.rewards.shape[0]
    if not b.rewards.is_floating_point():
        raise ValueError(f"rewards must be floating point, got {b.rewards.dtype}")
    if torch.isnan(b.rewards).any() or torch.isinf(b.rewards).any():
        raise ValueError("rewards contain NaN or inf")
    gi = b.group_index
    if not isinstance(gi, Tensor) or gi.shape != (n,):
        raise ValueError(f"group_index must have shape ({n},), got {_describe(gi)}")
    if gi.is_floating_point() or gi.is_complex() or gi.dtype == torch.bool:
        raise ValueError(f"group_index must be an integer tensor, got {gi.dtype}")
    mask = b.response_mask
    if not isinstance(mask, Tensor) or mask.ndim != 2 or mask.shape[0] != n:
        raise ValueError(f"response_mask must have shape ({n}, T), got {_describe(mask)}")
    if mask.dtype != torch.bool and not ((mask == 0) | (mask == 1)).all():
        raise ValueError("response_mask must be bool or contain only 0 and 1")
    mask = mask.bool()
    for name in ("old_logprobs", *optional_fields(b)):
        value = getattr(b, name)
        if value is None and name != "old_logprobs":
            continue
        if not isinstance(value, Tensor) or value.shape != mask.shape:
            raise ValueError(
                f"{name} must have the shape of response_mask {tuple(mask.shape)}, got {_describe(value)}"
            )
        if not value.is_floating_point():
            raise ValueError(f"{name} must be floating point, got {value.dtype}")
        if value.device != b.rewards.device:
            raise ValueError(f"{name} is on {value.device}, rewards on {b.rewards.device}")
        nan_ok = name != "old_logprobs" and fields_by_name(b)[name].metadata.get("nan_means") is not None
        valid = value[mask]
        if not (torch.isfinite(valid) | (torch.isnan(valid) & nan_ok)).all():
            raise ValueError(f"{name} has {'inf' if nan_ok else 'NaN or inf'} at valid (mask=1) positions")
    for name, t in (("group_index", gi), ("response_mask", mask)):
        if t.device != b.rewards.device:
            raise ValueError(f"{name} is on {t.device}, rewards on {b.rewards.device}")


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    return type(x).__name__
