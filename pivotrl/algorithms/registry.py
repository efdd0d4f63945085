"""The two registries (estimators, policy losses) and the functions that call them."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from pivotrl.algorithms.batch import TokenBatch, masked

Estimator = Callable[..., Tensor]
PolicyLoss = Callable[..., tuple[Tensor, dict[str, float]]]
Requirements = Iterable[str] | Callable[[dict[str, Any]], Iterable[str]]

ESTIMATORS: dict[str, Estimator] = {}
POLICY_LOSSES: dict[str, PolicyLoss] = {}
_REQUIRES: dict[tuple[str, str], Requirements] = {}
_DEFAULT_AGG: dict[str, str] = {}

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
FIELD_MEANING = {
    "ref_logprobs": "the reference model's log-probs",
    "entropies": "the rollout policy's token entropies",
    "entropies_new": "the current policy's token entropies (entropies_new=)",
}


def register_estimator(name: str, requires: Requirements = ()) -> Callable[[Estimator], Estimator]:
    """Decorator: register `fn(batch, **hparams) -> (N,T) advantages` under `name`.

    `requires` names the optional TokenBatch fields it reads, or is a function of
    the hyperparameters (with defaults filled in) returning them.
    """

    def wrap(fn: Estimator) -> Estimator:
        ESTIMATORS[name] = fn
        _REQUIRES[("estimator", name)] = requires
        return fn

    return wrap


def register_policy_loss(
    name: str, requires: Requirements = (), default_agg: str = "token-mean"
) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: register `fn(batch, advantages, logprobs, entropies_new, **hp) -> (loss (N,T), metrics)`.

    The function returns the per-token loss; compute_policy_loss aggregates it
    with `loss_agg_mode` (default `default_agg`).
    """
    if default_agg not in LOSS_AGG_MODES:
        raise ValueError(f"default_agg must be one of {LOSS_AGG_MODES}, got {default_agg!r}")

    def wrap(fn: PolicyLoss) -> PolicyLoss:
        POLICY_LOSSES[name] = fn
        _REQUIRES[("policy loss", name)] = requires
        _DEFAULT_AGG[name] = default_agg
        return fn

    return wrap


def _lookup(kind: str, registry: dict[str, Any], name: str) -> Any:
    if name not in registry:
        near = difflib.get_close_matches(str(name), registry, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(f"unknown {kind} {name!r}{hint}; known: {', '.join(sorted(registry))}")
    return registry[name]


def hyperparameters(fn: Callable[..., Any]) -> dict[str, Any]:
    """The keyword-only parameters of an estimator or policy loss (its hyperparameters) and their defaults."""
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _bind(kind: str, name: str, fn: Callable[..., Any], hparams: dict[str, Any]) -> dict[str, Any]:
    """hparams with the function's defaults filled in; ValueError on an unknown name."""
    known = hyperparameters(fn)
    for key in hparams:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            valid = ", ".join(known) or "none"
            raise ValueError(f"{kind} {name!r} has no hyperparameter {key!r}{hint}; valid: {valid}")
    return {**{k: v for k, v in known.items() if v is not inspect.Parameter.empty}, **hparams}


def estimator_requirements(name: str, **hparams: Any) -> frozenset[str]:
    """The optional TokenBatch fields estimator `name` needs with these hyperparameters."""
    return _requirements("estimator", name, hparams)


def loss_requirements(name: str, **hparams: Any) -> frozenset[str]:
    """The optional inputs (TokenBatch fields, entropies_new) policy loss `name` needs."""
    return _requirements("policy loss", name, hparams)


def _requirements(kind: str, name: str, hparams: dict[str, Any]) -> frozenset[str]:
    fn = _lookup(kind, ESTIMATORS if kind == "estimator" else POLICY_LOSSES, name)
    req = _REQUIRES[(kind, name)]
    if callable(req):
        req = req(_bind(kind, name, fn, hparams))
    return frozenset(req)


def default_loss_agg_mode(name: str) -> str:
    """The aggregation policy loss `name` uses when loss_agg_mode is not given."""
    _lookup("policy loss", POLICY_LOSSES, name)
    return _DEFAULT_AGG[name]


def _check_present(kind: str, name: str, needed: frozenset[str], available: dict[str, Any]) -> None:
    missing = sorted(f for f in needed if available.get(f) is None)
    if missing:
        what = "; ".join(f"{f} ({FIELD_MEANING.get(f, f)})" for f in missing)
        raise ValueError(f"{kind} {name!r} needs {what}, which the batch does not have")


def compute_advantages(name: str, batch: TokenBatch, **hparams: Any) -> Tensor:
    """Token advantages (N,T) of estimator `name` on `batch`, 0 on padding, in batch.dtype."""
    if not isinstance(batch, TokenBatch):
        raise ValueError(f"batch must be a TokenBatch, got {type(batch).__name__}")
    fn = _lookup("estimator", ESTIMATORS, name)
    _bind("estimator", name, fn, hparams)
    needed = estimator_requirements(name, **hparams)
    _check_present("estimator", name, needed, {f: getattr(batch, f) for f in needed})
    adv = fn(batch, **hparams)
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
    fn = _lookup("policy loss", POLICY_LOSSES, name)
    _bind("policy loss", name, fn, hparams)
    mode = loss_agg_mode if loss_agg_mode is not None else _DEFAULT_AGG[name]
    _check_token_tensor("advantages", advantages, batch)
    _check_token_tensor("logprobs", logprobs, batch)
    if entropies_new is not None:
        _check_token_tensor("entropies_new", entropies_new, batch)
    needed = loss_requirements(name, **hparams)
    available = {"ref_logprobs": batch.ref_logprobs, "entropies": batch.entropies, "entropies_new": entropies_new}
    _check_present("policy loss", name, needed, available)
    loss_mat, metrics = fn(batch, advantages, logprobs, entropies_new, **hparams)
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
    Σ / (N · max_len), max_len defaulting to T.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        near = difflib.get_close_matches(str(loss_agg_mode), LOSS_AGG_MODES, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}{hint}; known: {', '.join(LOSS_AGG_MODES)}")
    for key, value in (("max_len", max_len), ("global_num_tokens", global_num_tokens), ("global_num_seqs", global_num_seqs)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{key} must be a positive int, got {value!r}")
    loss_mat = masked(loss_mat, mask)
    if loss_agg_mode == "token-mean":
        denom = global_num_tokens if global_num_tokens is not None else mask.sum().clamp(min=1)
        return loss_mat.sum() / denom
    if loss_agg_mode == "seq-mean-token-sum-norm":
        rows = global_num_seqs if global_num_seqs is not None else mask.shape[0]
        return loss_mat.sum() / (max(rows, 1) * (max_len if max_len is not None else mask.shape[1]))
    lengths = mask.sum(dim=1)
    per_seq = loss_mat.sum(dim=1)
    if loss_agg_mode == "seq-mean-token-mean":
        per_seq = per_seq / lengths.clamp(min=1)
    denom = global_num_seqs if global_num_seqs is not None else (lengths > 0).sum().clamp(min=1)
    return per_seq.sum() / denom
