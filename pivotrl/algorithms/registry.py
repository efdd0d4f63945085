"""The two registries (estimators, policy losses) and the functions that call them."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pivotrl.algorithms.batch import TokenBatch, masked, optional_fields

Estimator = Callable[..., Tensor]
PolicyLoss = Callable[..., tuple[Tensor, dict[str, float]]]
Requirements = Iterable[str] | Callable[[dict[str, Any]], Iterable[str]]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOSS_INPUTS = {"entropies_new": "the current policy's token entropies (entropies_new=)"}


def unknown(kind: str, name: object, known: Iterable[str]) -> ValueError:
    """The error for a name that is not among `known`, with the nearest one as a hint."""
    known = sorted(known)
    near = difflib.get_close_matches(str(name), known, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return ValueError(f"unknown {kind} {name!r}{hint}; known: {', '.join(known) or 'none'}")


def hyperparameters(fn: Callable[..., Any]) -> dict[str, Any]:
    """The keyword-only parameters of an estimator or policy loss (its hyperparameters) and their defaults."""
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


@dataclass(frozen=True)
class Entry:
    """One registered estimator or policy loss: its function, what it reads, and (losses) its aggregation."""

    kind: str
    name: str
    fn: Callable[..., Any]
    requires: Requirements = ()
    default_agg: str | None = None

    def bind(self, hparams: dict[str, Any]) -> dict[str, Any]:
        """hparams with the function's defaults filled in; ValueError on an unknown name."""
        known = hyperparameters(self.fn)
        for key in hparams:
            if key not in known:
                near = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise ValueError(f"{self.kind} {self.name!r} has no hyperparameter {key!r}{hint}; "
                                 f"valid: {', '.join(known) or 'none'}")
        return {**{k: v for k, v in known.items() if v is not inspect.Parameter.empty}, **hparams}

    def requirements(self, hparams: dict[str, Any]) -> frozenset[str]:
        """The optional inputs it reads with these hyperparameters (ValueError on an unknown one)."""
        bound = self.bind(hparams)
        req = self.requires(bound) if callable(self.requires) else self.requires
        return frozenset(req)

    def check_present(self, needed: frozenset[str], batch: TokenBatch, **inputs: Any) -> None:
        """ValueError naming every needed field of `batch`, or input, that is absent (None)."""
        available = {**{f: getattr(batch, f) for f in optional_fields(batch)}, **inputs}
        missing = sorted(f for f in needed if available.get(f) is None)
        if missing:
            meaning = {**optional_fields(batch), **LOSS_INPUTS}
            what = "; ".join(f"{f} ({meaning.get(f, f)})" for f in missing)
            raise ValueError(f"{self.kind} {self.name!r} needs {what}, which the batch does not have")


class Registry(Mapping[str, Entry]):
    """name -> Entry for one kind; a taken name is refused unless replace=True."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def add(self, entry: Entry, *, replace: bool = False) -> None:
        taken = self._entries.get(entry.name)
        if taken is not None and not replace:
            where = f"{taken.fn.__module__}.{getattr(taken.fn, '__qualname__', type(taken.fn).__name__)}"
            raise ValueError(f"{self.kind} {entry.name!r} is already registered ({where}); "
                             "choose another name, or pass replace=True to replace it")
        self._entries[entry.name] = entry

    def remove(self, name: str) -> Entry:
        """Unregister `name` (KeyError-free: the unknown-name error when it is not registered)."""
        return self._entries.pop(self.lookup(name).name)

    def lookup(self, name: str) -> Entry:
        """The entry `name`, or ValueError naming the nearest registered name."""
        if name not in self._entries:
            raise unknown(self.kind, name, self._entries)
        return self._entries[name]

    def __getitem__(self, name: str) -> Entry:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


ESTIMATORS = Registry("estimator")
POLICY_LOSSES = Registry("policy loss")


def register_estimator(name: str, requires: Requirements = (), *,
                       replace: bool = False) -> Callable[[Estimator], Estimator]:
    """Decorator: register `fn(batch, **hparams) -> (N,T) advantages` under `name`.

    `requires` names the optional TokenBatch fields it reads, or is a function of
    the hyperparameters (with defaults filled in) returning them. A taken name raises
    ValueError unless replace=True.
    """

    def wrap(fn: Estimator) -> Estimator:
        ESTIMATORS.add(Entry("estimator", name, fn, requires), replace=replace)
        return fn

    return wrap


def register_policy_loss(
    name: str, requires: Requirements = (), default_agg: str = "token-mean", *, replace: bool = False
) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: register `fn(batch, advantages, logprobs, entropies_new, **hp) -> (loss (N,T), metrics)`.

    The function returns the per-token loss; compute_policy_loss aggregates it
    with `loss_agg_mode` (default `default_agg`). A taken name raises ValueError
    unless replace=True.
    """
    if default_agg not in LOSS_AGG_MODES:
        raise unknown("loss_agg_mode", default_agg, LOSS_AGG_MODES)

    def wrap(fn: PolicyLoss) -> PolicyLoss:
        POLICY_LOSSES.add(Entry("policy loss", name, fn, requires, default_agg), replace=replace)
        return fn

    return wrap


def estimator_requirements(name: str, **hparams: Any) -> frozenset[str]:
    """The optional TokenBatch fields estimator `name` needs with these hyperparameters."""
    return ESTIMATORS.lookup(name).requirements(hparams)


def loss_requirements(name: str, **hparams: Any) -> frozenset[str]:
    """The optional inputs (TokenBatch fields, entropies_new) policy loss `name` needs."""
    return POLICY_LOSSES.lookup(name).requirements(hparams)


def default_loss_agg_mode(name: str) -> str:
    """The aggregation policy loss `name` uses when loss_agg_mode is not given."""
    return POLICY_LOSSES.lookup(name).default_agg


def compute_advantages(name: str, batch: TokenBatch, **hparams: Any) -> Tensor:
    """Token advantages (N,T) of estimator `name` on `batch`, 0 on padding, in batch.dtype."""
    if not isinstance(batch, TokenBatch):
        raise ValueError(f"batch must be a TokenBatch, got {type(batch).__name__}")
    entry = ESTIMATORS.lookup(name)
    needed = entry.requirements(hparams)
    entry.check_present(needed, batch)
    adv = entry.fn(batch, **hparams)
    return masked(adv, batch.response_mask).to(batch.dtype)


def _check_token_tensor(name: str, x: Any, batch: TokenBatch) -> None:
    mask = batch.response_mask
    if not isinstance(x, Tensor) or x.shape != mask.shape:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must have the shape of response_mask {tuple(mask.shape)}, got {shape}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {x.dtype}")
    if not torch.isfinite(x.detach()[mask]).all():
        raise ValueError(f"{name} has NaN or inf at valid (mask=1) positions")


def compute_policy_loss(
    name: str,
    batch: TokenBatch,
    *,
    advantages: Tensor,
    logprobs: Tensor,
    entropies_new: Tensor | None = None,
    loss_agg_mode: str | None = None,
    max_len: int | None = None,
    global_num_tokens: int | None = None,
    global_num_seqs: int | None = None,
    **hparams: Any,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar policy loss of `name` and its metrics.

    advantages (N,T), logprobs ℓ^θ (N,T) with grad, entropies_new H^θ (N,T) or None.
    `global_num_tokens` / `global_num_seqs` replace this batch's own token and
    response counts in the aggregation's denominator, so that the losses of the
    micro-batches of one global batch sum to the global batch's loss.
    """
    if not isinstance(batch, TokenBatch):
        raise ValueError(f"batch must be a TokenBatch, got {type(batch).__name__}")
    entry = POLICY_LOSSES.lookup(name)
    mode = loss_agg_mode if loss_agg_mode is not None else entry.default_agg
    _check_token_tensor("advantages", advantages, batch)
    _check_token_tensor("logprobs", logprobs, batch)
    if entropies_new is not None:
        _check_token_tensor("entropies_new", entropies_new, batch)
    needed = entry.requirements(hparams)
    entry.check_present(needed, batch, entropies_new=entropies_new)
    loss_mat, metrics = entry.fn(batch, advantages, logprobs, entropies_new, **hparams)
    loss = aggregate_loss(
        loss_mat,
        batch.response_mask,
        mode,
        max_len=max_len,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
    )
    metrics["loss"] = float(loss.detach())
    return loss, metrics


def loss_denominators(mask: Tensor, loss_agg_mode: str) -> dict[str, int]:
    """The counts aggregate_loss divides by on `mask` (N,T): {global_num_tokens, global_num_seqs}.

    Passed to compute_policy_loss for each micro-batch of a minibatch, they make the
    micro-batches' losses sum to the loss of the whole minibatch.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise unknown("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    responses = mask.shape[0] if loss_agg_mode == "seq-mean-token-sum-norm" else int((mask.sum(dim=1) > 0).sum())
    return {"global_num_tokens": max(int(mask.sum()), 1), "global_num_seqs": max(responses, 1)}


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    loss_agg_mode: str,
    *,
    max_len: int | None = None,
    global_num_tokens: int | None = None,
    global_num_seqs: int | None = None,
) -> Tensor:
    """Scalar from per-token losses (N,T) under mask (N,T), in one of LOSS_AGG_MODES.

    token-mean: Σ / #valid tokens; seq-mean-token-mean / seq-mean-token-sum: mean over
    responses with >= 1 valid token of their token mean / sum; seq-mean-token-sum-norm:
    Σ / (N · max_len), max_len defaulting to T. The counts are loss_denominators(mask),
    or the global_num_* given.
    """
    for key, value in (("max_len", max_len), ("global_num_tokens", global_num_tokens), ("global_num_seqs", global_num_seqs)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{key} must be a positive int, got {value!r}")
    counts = loss_denominators(mask, loss_agg_mode)
    num_tokens = global_num_tokens if global_num_tokens is not None else counts["global_num_tokens"]
    num_seqs = global_num_seqs if global_num_seqs is not None else counts["global_num_seqs"]
    loss_mat = masked(loss_mat, mask)
    if loss_agg_mode == "token-mean":
        return loss_mat.sum() / num_tokens
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return loss_mat.sum() / (num_seqs * (max_len if max_len is not None else mask.shape[1]))
    per_seq = loss_mat.sum(dim=1)
    if loss_agg_mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(dim=1).clamp(min=1)
    return per_seq.sum() / num_seqs
