"""Policy losses: PPO clip on a token, sequence (GSPO, TEPO) or block (MPO) ratio.

Each registered loss returns the per-token loss (N,T) and its metrics;
registry.compute_policy_loss aggregates it (token-mean, seq-mean-..., see there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from pivotrl.algorithms.batch import TokenBatch, masked
from pivotrl.algorithms.registry import register_policy_loss
from pivotrl.algorithms.validate import check

KL_ESTIMATORS = ("k1", "k2", "k3")
LOG_RATIO_BOUND = 20.0  # |log ρ| is clamped to this before exp, as verl does
MPO_MODES = ("sliding", "disjoint")


def _mean(x: Tensor, mask: Tensor) -> float:
    """Mean of x over valid tokens as a float (0.0 when there are none)."""
    count = int(mask.sum())
    return float(masked(x.detach(), mask).sum() / count) if count else 0.0


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token KL(π_θ‖π_ref) estimate (N,T): k1 = ℓ^θ−ℓ^ref, k2 = ½(ℓ^θ−ℓ^ref)², k3 = e^{−x}+x−1."""
    check(estimator in KL_ESTIMATORS, f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    diff = logprobs - ref_logprobs
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff * diff
    return torch.exp(-diff) + diff - 1.0


def clipped_surrogate(
    log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clip per token (N,T): −min(ρA, clip(ρ, 1−eps_low, 1+eps_high)·A), ρ = exp(log_ratio).

    log_ratio is clamped to ±LOG_RATIO_BOUND first, so an overflow never turns a zero
    advantage into NaN. With dual_clip = c (> 1), tokens with A < 0 take min(L, −c·A).
    """
    check(eps_low >= 0 and eps_high >= 0, f"eps_low and eps_high must be >= 0, got {eps_low}, {eps_high}")
    check(dual_clip is None or dual_clip > 1.0, f"dual_clip must be > 1 (or None), got {dual_clip}")
    ratio = torch.exp(masked(log_ratio, mask).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = {
        "clip/frac": _mean((clipped > unclipped).to(ratio.dtype), mask),
        "ratio/mean": _mean(ratio, mask),
        "ratio/max": float(masked(ratio.detach(), mask).max()) if mask.any() else 0.0,
    }
    if dual_clip is not None:
        bound = -dual_clip * advantages
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
        metrics["clip/dual_frac"] = _mean(dual.to(ratio.dtype), mask)
    return masked(loss, mask), metrics


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log s_{i,t} = sg[mean_t(ℓ^θ − ℓ^old)] + ℓ^θ_{i,t} − sg[ℓ^θ_{i,t}]: value log s_i, gradient 1 per token."""
    delta = masked(logprobs - old_logprobs, mask)
    seq = delta.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
    return seq.detach() + logprobs - logprobs.detach()


def _inputs(batch: TokenBatch, logprobs: Tensor, advantages: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """ℓ^θ, ℓ^old, A in one compute dtype (at least float32), padding zeroed."""
    dtype = torch.promote_types(batch.compute_dtype, logprobs.dtype)
    mask = batch.response_mask
    return (
        masked(logprobs.to(dtype), mask),
        masked(batch.old_logprobs.to(dtype), mask),
        masked(advantages.detach().to(dtype), mask),
    )


#: log_ratio(ℓ^θ, ℓ^old, mask) -> (N,T): the log of the ratio a loss clips (a token's, a sequence's, a block's).
LogRatio = Callable[[Tensor, Tensor, Tensor], Tensor]


def token_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log ρ_{i,t} = ℓ^θ_{i,t} − ℓ^old_{i,t}: PPO's token ratio."""
    return logprobs - old_logprobs


def clipped_ratio_loss(
    batch: TokenBatch, advantages: Tensor, logprobs: Tensor, log_ratio: LogRatio,
    eps_low: float, eps_high: float, dual_clip: float | None,
) -> tuple[Tensor, dict[str, float], Tensor, Tensor]:
    """The body every loss here shares: PPO clip (clipped_surrogate) of the ratio `log_ratio` gives,
    with each token's advantage. Returns (loss (N,T), metrics, ℓ^θ, A), the last two in compute dtype."""
    new, old, adv = _inputs(batch, logprobs, advantages)
    loss, metrics = clipped_surrogate(log_ratio(new, old, batch.response_mask), adv, batch.response_mask,
                                      eps_low, eps_high, dual_clip)
    metrics["kl/old_approx"] = _mean(old - new, batch.response_mask)
    return loss, metrics, new, adv


def _add_kl(
    loss: Tensor, metrics: dict[str, float], batch: TokenBatch, logprobs: Tensor,
    beta_kl: float, kl_estimator: str, where: Tensor | None = None,
) -> Tensor:
    """loss + beta_kl·KL(π_θ‖π_ref) on valid tokens (only where `where` holds, if given)."""
    check(beta_kl >= 0, f"beta_kl must be >= 0, got {beta_kl}")
    check(kl_estimator in KL_ESTIMATORS, f"kl_estimator must be one of {KL_ESTIMATORS}, got {kl_estimator!r}")
    if beta_kl == 0:
        return loss
    mask = batch.response_mask if where is None else batch.response_mask & where
    kl = kl_penalty(logprobs, batch.field("ref_logprobs", "the KL penalty (beta_kl > 0)").to(logprobs.dtype), kl_estimator)
    metrics["kl/ref"] = _mean(kl, batch.response_mask)
    if where is not None:
        metrics["kl/mask_frac"] = _mean(mask.to(kl.dtype), batch.response_mask)
    return loss + beta_kl * masked(kl, mask)


def _needs_ref(hp: dict[str, Any]) -> list[str]:
    return ["ref_logprobs"] if hp["beta_kl"] > 0 else []


@register_policy_loss("ppo", requires=_needs_ref)
def ppo_loss(batch: TokenBatch, advantages: Tensor, logprobs: Tensor, entropies_new: Tensor | None = None, *,
             eps_low: float = 0.2, eps_high: float = 0.28, dual_clip: float | None = None,
             beta_kl: float = 0.0, kl_estimator: str = "k3") -> tuple[Tensor, dict[str, float]]:
    """PPO clip on the token ratio exp(ℓ^θ − ℓ^old). Per-token loss (N,T)."""
    loss, metrics, new, _ = clipped_ratio_loss(batch, advantages, logprobs, token_log_ratio, eps_low, eps_high,
                                               dual_clip)
    return _add_kl(loss, metrics, batch, new, beta_kl, kl_estimator), metrics


@register_policy_loss("gspo", requires=_needs_ref, default_agg="seq-mean-token-mean")
def gspo_loss(batch: TokenBatch, advantages: Tensor, logprobs: Tensor, entropies_new: Tensor | None = None, *,
              eps_low: float = 3e-4, eps_high: float = 4e-4, dual_clip: float | None = None,
              beta_kl: float = 0.0, kl_estimator: str = "k3") -> tuple[Tensor, dict[str, float]]:
    """GSPO (2507.18071): PPO clip on the sequence ratio in token form. Per-token loss (N,T)."""
    loss, metrics, new, _ = clipped_ratio_loss(batch, advantages, logprobs, sequence_log_ratio, eps_low, eps_high,
                                               dual_clip)
    return _add_kl(loss, metrics, batch, new, beta_kl, kl_estimator), metrics


def _tepo_requires(hp: dict[str, Any]) -> list[str]:
    return ["ref_logprobs", "entropies", "entropies_new"] if hp["beta_kl"] > 0 else []


@register_policy_loss("tepo", requires=_tepo_requires)
def tepo_loss(batch: TokenBatch, advantages: Tensor, logprobs: Tensor, entropies_new: Tensor | None = None, *,
              eps_low: float = 0.2, eps_high: float = 0.28, dual_clip: float | None = None,
              beta_kl: float = 0.05, kl_estimator: str = "k3") -> tuple[Tensor, dict[str, float]]:
    """TEPO: sequence-likelihood ratio per token, KL only where A > 0 and H^θ < H. (N,T)."""
    loss, metrics, new, adv = clipped_ratio_loss(batch, advantages, logprobs, sequence_log_ratio, eps_low,
                                                 eps_high, dual_clip)
    if beta_kl == 0:
        return loss, metrics
    entropy_old = batch.field("entropies", "tepo's KL mask")
    kl_mask = (adv > 0) & (entropies_new.detach().to(entropy_old.dtype) < entropy_old)
    return _add_kl(loss, metrics, batch, new, beta_kl, kl_estimator, where=kl_mask), metrics


def block_log_ratio(
    delta: Tensor, mask: Tensor, block_size: int, mode: str = "sliding",
    future_share: float | None = None, exact: bool = False,
) -> Tensor:
    """MPO block log-ratio λ (N,T) from token log-ratios δ = ℓ^θ − ℓ^old (N,T).

    sliding: λ_t = Σ_n β_n·δ_{t+n} over the valid positions t..t+K−1, β renormalised
    to sum to 1 over those present; disjoint: blocks of K consecutive valid tokens,
    every token taking its block's λ. β uniform, or β_0 = 1−p and the rest p/(K−1)
    with future_share = p; exact: β ≡ 1 (the joint block ratio, no renormalisation).
    """
    check(isinstance(block_size, int) and block_size >= 1, f"block_size must be an int >= 1, got {block_size!r}")
    check(mode in MPO_MODES, f"mode must be one of {MPO_MODES}, got {mode!r}")
    # p = 1 would give the block's own token weight 0: the last token's ratio would be frozen at 1
    check(future_share is None or 0.0 <= future_share < 1.0, f"future_share must be in [0, 1), got {future_share}")
    k = block_size
    if exact:
        beta = [1.0] * k
    elif future_share is None or k == 1:
        beta = [1.0 / k] * k
    else:
        beta = [1.0 - future_share] + [future_share / (k - 1)] * (k - 1)
    m = mask.to(delta.dtype)
    delta = masked(delta, mask)
    if mode == "sliding":
        n_tokens = delta.shape[1]
        padded_delta = torch.nn.functional.pad(delta, (0, k - 1))
        padded_m = torch.nn.functional.pad(m, (0, k - 1))
        # K shifted views, not a loop over tokens
        total = sum(beta[n] * padded_delta[:, n : n + n_tokens] for n in range(k))
        weight = sum(beta[n] * padded_m[:, n : n + n_tokens] for n in range(k))
    else:
        index = mask.long().cumsum(dim=1) - 1
        offset = torch.remainder(index.clamp(min=0), k)
        beta_t = torch.tensor(beta, dtype=delta.dtype, device=delta.device)[offset] * m
        block = (index.clamp(min=0) // k) + torch.arange(delta.shape[0], device=delta.device).unsqueeze(1) * delta.shape[1]
        block = torch.where(mask, block, 0).reshape(-1)
        size = delta.numel()
        total = delta.new_zeros(size).index_add(0, block, (beta_t * delta).reshape(-1))[block].view_as(delta)
        weight = m.new_zeros(size).index_add_(0, block, beta_t.reshape(-1))[block].view_as(delta)
    if exact:
        return masked(total, mask)
    return masked(total / weight.clamp(min=torch.finfo(weight.dtype).tiny), mask)


@register_policy_loss("mpo", requires=_needs_ref)
def mpo_loss(batch: TokenBatch, advantages: Tensor, logprobs: Tensor, entropies_new: Tensor | None = None, *,
             block_size: int = 5, mode: str = "sliding", future_share: float | None = None,
             exact: bool = False, eps_low: float = 0.2, eps_high: float = 0.28, dual_clip: float | None = None,
             beta_kl: float = 0.0, kl_estimator: str = "k3") -> tuple[Tensor, dict[str, float]]:
    """MPO (2602.14386): PPO clip on the K-token block ratio with the token's advantage. (N,T)."""

    def blocks(new: Tensor, old: Tensor, mask: Tensor) -> Tensor:
        return block_log_ratio(new - old, mask, block_size, mode, future_share, exact)

    loss, metrics, new, _ = clipped_ratio_loss(batch, advantages, logprobs, blocks, eps_low, eps_high, dual_clip)
    return _add_kl(loss, metrics, batch, new, beta_kl, kl_estimator), metrics
