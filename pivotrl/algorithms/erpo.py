"""ERPO (2603.28204) and EP-GRPO (2605.04960): one estimator, two presets.

A = Â·W/mean_i(W)  +  η·W·d·s̃

W: entropy gate at critical decision pivots, σ(γ·z) of the group-z-scored entropy.
s̃: implicit process signal β_p·(ℓ^old − ℓ^ref), normalised inside (group, progress
   bucket) cells. Progress is position t/T_i (ERPO) or cumulative entropy (EP-GRPO).
d: the outcome anchor sgn(Â); EP-GRPO falls back to sgn(r − θ_r) in groups whose
   rewards are all equal, so they still get gradient from the process term.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pivotrl.algorithms.baselines import grpo_sequence_advantage
from pivotrl.algorithms.batch import TokenBatch
from pivotrl.algorithms.registry import register_estimator
from pivotrl.algorithms.stats import cell_zscore, group_ids, group_reward_stats
from pivotrl.algorithms.validate import check

PROGRESS_MODES = ("position", "cumulative_entropy")


def entropy_gate(batch: TokenBatch, gid: Tensor, num_groups: int, gamma: float, gate_min: float) -> Tensor:
    """W (N,T) = max(σ(γ·z), gate_min), z the entropy z-score over the group's valid tokens; 0 on padding."""
    entropy = batch.field("entropies", "the ERPO gate (gate=True)")
    z = cell_zscore(entropy, batch.response_mask, gid, num_groups, overwrite=True)
    return z.mul_(gamma).sigmoid_().clamp_(min=gate_min).masked_fill_(~batch.response_mask, 0.0)


def progress_buckets(batch: TokenBatch, num_buckets: int, progress: str) -> Tensor:
    """Bucket index (N,T) int64 in [0, K) of every token's progress through its response.

    position: ⌊K·t/T_i⌋, t = 0..T_i-1 counted over valid tokens.
    cumulative_entropy: min(⌊K·S_t/S_T⌋, K-1), S the running entropy sum;
    a response with zero total entropy uses the position buckets.
    """
    if progress == "cumulative_entropy":
        spent = batch.field("entropies", "progress='cumulative_entropy'").clamp_(min=0).cumsum(dim=1)
        total = spent[:, -1:].clone()
        spent_any = total > 0
        by_entropy = spent.mul_(num_buckets).div_(torch.where(spent_any, total, 1.0)).floor_().clamp_(max=num_buckets - 1)
        if bool(spent_any.all()):
            return by_entropy.long()
        return torch.where(spent_any, by_entropy.long(), position_buckets(batch.response_mask, num_buckets))
    return position_buckets(batch.response_mask, num_buckets)


def position_buckets(mask: Tensor, num_buckets: int) -> Tensor:
    """⌊K·t/T_i⌋ (N,T) int64, t counted over valid tokens; padding keeps an in-range bucket."""
    lengths = mask.sum(dim=1, keepdim=True, dtype=torch.int32).clamp_(min=1)
    # int32 and in place: int64 cumsum and division are several times slower on CPU
    index = mask.cumsum(dim=1, dtype=torch.int32).sub_(1).clamp_(min=0)
    return index.mul_(num_buckets).div_(lengths, rounding_mode="floor").long()


def normalised_process_signal(
    batch: TokenBatch, gid: Tensor, num_groups: int, *, beta_p: float, num_buckets: int,
    buckets: bool, progress: str, s_eps: float,
) -> Tensor:
    """s̃ (N,T): β_p·(ℓ^old − ℓ^ref) z-scored within (group, bucket) cells (whole group if not buckets)."""
    if batch.ref_logprobs is None:
        raise ValueError("ERPO's process term (eta != 0) needs TokenBatch.ref_logprobs, which is None")
    dtype = batch.compute_dtype
    signal = torch.sub(batch.old_logprobs.to(dtype), batch.ref_logprobs.to(dtype))
    signal.masked_fill_(~batch.response_mask, 0.0).mul_(beta_p)
    cells = progress_buckets(batch, num_buckets, progress) if buckets else None
    return cell_zscore(signal, batch.response_mask, gid, num_groups, cells, num_buckets, eps=s_eps, overwrite=True)


def _erpo_requires(hp: dict[str, Any]) -> list[str]:
    needed = []
    if hp["gate"] or (hp["eta"] != 0 and hp["buckets"] and hp["progress"] == "cumulative_entropy"):
        needed.append("entropies")
    if hp["eta"] != 0:
        needed.append("ref_logprobs")
    return needed


@register_estimator("erpo", requires=_erpo_requires)
def erpo(
    batch: TokenBatch,
    *,
    gamma: float = 5.0,
    beta_p: float = 0.1,
    num_buckets: int = 10,
    eta: float = 0.2,
    s_eps: float = 1e-4,
    gate: bool = True,
    buckets: bool = True,
    anchor: bool = True,
    gate_min: float = 0.0,
    theta_r: float = 0.5,
    norm_by_std: bool = True,
    progress: str = "position",
    zero_var_fallback: bool = False,
) -> Tensor:
    """ERPO: entropy-gated GRPO credit plus an outcome-anchored, bucket-normalised process term. (N,T)."""
    check(progress in PROGRESS_MODES, f"progress must be one of {PROGRESS_MODES}, got {progress!r}")
    check(isinstance(num_buckets, int) and num_buckets >= 1, f"num_buckets must be an int >= 1, got {num_buckets!r}")
    check(gamma >= 0, f"gamma must be >= 0, got {gamma}")
    check(0.0 <= gate_min <= 1.0, f"gate_min must be in [0, 1], got {gate_min}")
    check(s_eps > 0, f"s_eps must be > 0, got {s_eps}")
    mask = batch.response_mask
    gid, num_groups = group_ids(batch.group_index)
    seq_adv = grpo_sequence_advantage(batch, norm_by_std).unsqueeze(1)
    # A = W·(Â/mean(W) + η·d·s̃), with W = 1 without the gate
    if gate:
        weight = entropy_gate(batch, gid, num_groups, gamma, gate_min)
        mean_weight = weight.sum(dim=1, keepdim=True) / batch.lengths.unsqueeze(1).clamp(min=1)
        seq_adv_scaled = seq_adv / torch.where(mean_weight > 0, mean_weight, 1.0)
    if eta == 0:
        return weight.mul_(seq_adv_scaled) if gate else torch.where(mask, seq_adv, 0.0)
    s_tilde = normalised_process_signal(
        batch, gid, num_groups, beta_p=beta_p, num_buckets=num_buckets,
        buckets=buckets, progress=progress, s_eps=s_eps,
    )
    if not anchor:
        direction: Tensor | float = 1.0
    else:
        direction = torch.sign(seq_adv)
        if zero_var_fallback:
            stats = group_reward_stats(batch.rewards.to(seq_adv.dtype), gid, num_groups)
            fallback = torch.sign(batch.rewards.to(seq_adv.dtype) - theta_r)
            direction = torch.where(stats.zero_variance, fallback, direction.squeeze(1)).unsqueeze(1)
    if not gate:
        return s_tilde.mul_(eta * direction).add_(seq_adv).masked_fill_(~mask, 0.0)
    return s_tilde.mul_(eta * direction).add_(seq_adv_scaled).mul_(weight)  # W is 0 on padding


@register_estimator("ep_grpo", requires=_erpo_requires)
def ep_grpo(
    batch: TokenBatch,
    *,
    gamma: float = 5.0,
    beta_p: float = 0.1,
    num_buckets: int = 10,
    eta: float = 0.2,
    s_eps: float = 1e-4,
    gate: bool = True,
    buckets: bool = True,
    anchor: bool = True,
    gate_min: float = 0.0,
    theta_r: float = 0.5,
    norm_by_std: bool = True,
    progress: str = "cumulative_entropy",
    zero_var_fallback: bool = True,
) -> Tensor:
    """EP-GRPO: ERPO with cumulative-entropy progress buckets and the zero-variance anchor. (N,T)."""
    return erpo(
        batch, gamma=gamma, beta_p=beta_p, num_buckets=num_buckets, eta=eta, s_eps=s_eps,
        gate=gate, buckets=buckets, anchor=anchor, gate_min=gate_min, theta_r=theta_r,
        norm_by_std=norm_by_std, progress=progress, zero_var_fallback=zero_var_fallback,
    )
