"""ERPO (arXiv 2603.28204) and EP-GRPO (arXiv 2605.04960): one estimator, two presets.

The steps of docs/ALGORITHMS.md, in its order and its symbols:

    z       entropy z-score over the group's valid tokens
    W       = max(σ(γ·z), gate_min)                      (W ≡ 1 with gate=False)
    A^gate  = Â·W / mean_i W                             (mass-preserving gate)
    b       progress bucket of a token: ⌊K·t/T_i⌋ (position) or min(⌊K·S_t/S_T⌋, K−1)
            (cumulative entropy, position buckets where S_T = 0); K = 1 with buckets=False
    s       = β_p·(ℓ^old − ℓ^ref)                          (implicit process signal)
    s̃       = (s − μ_{g,b}) / (σ_{g,b} + s_eps)             (0 in a one-token cell)
    d       = sgn(Â); EP-GRPO: sgn(r − θ_r) in zero-variance groups; 1 with anchor=False
    A       = A^gate + η·W·d·s̃                             (0 on padding)
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from pivotrl.algorithms.baselines import grpo_sequence_advantage
from pivotrl.algorithms.batch import TokenBatch, masked
from pivotrl.algorithms.registry import register_estimator
from pivotrl.algorithms.stats import group_ids, group_reward_stats, group_zscore
from pivotrl.algorithms.validate import check

PROGRESS_MODES = ("position", "cumulative_entropy")


def needs_entropy(*, gate: bool, eta: float, buckets: bool, num_buckets: int, progress: str) -> bool:
    """Whether ERPO reads the entropies: for the gate, or for cumulative-entropy buckets (K > 1)."""
    return gate or (eta != 0 and buckets and num_buckets > 1 and progress == "cumulative_entropy")


def _erpo_requires(hp: dict[str, Any]) -> list[str]:
    needed = ["ref_logprobs"] if hp["eta"] != 0 else []
    if needs_entropy(gate=hp["gate"], eta=hp["eta"], buckets=hp["buckets"], num_buckets=hp["num_buckets"],
                     progress=hp["progress"]):
        needed.append("entropies")
    return needed


def progress_buckets(mask: Tensor, num_buckets: int, entropy: Tensor | None = None) -> Tensor:
    """The progress bucket b in [0, K) of every token (N,T) int64 (meaningless on padding).

    Position: b = ⌊K·t/T_i⌋, t = 0..T_i−1 counted over the response's valid tokens.
    Cumulative entropy (when `entropy` is given): b = min(⌊K·S_t/S_T⌋, K−1), S_t the
    entropy spent up to and including t (negative float noise clamped to 0); a response
    whose total entropy S_T is 0 falls back to its position buckets.
    """
    k = num_buckets
    rank = mask.cumsum(dim=1) - 1
    length = mask.sum(dim=1, keepdim=True)
    by_position = torch.div(k * rank, length.clamp(min=1), rounding_mode="floor").clamp(min=0)
    if entropy is None:
        return by_position
    spent = masked(entropy.clamp(min=0), mask).cumsum(dim=1)
    total = spent[:, -1:]
    by_entropy = (k * spent / torch.where(total > 0, total, 1.0)).floor().long().clamp(max=k - 1)
    return torch.where(total > 0, by_entropy, by_position)


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
    seq_adv = grpo_sequence_advantage(batch, norm_by_std)  # Â (N,)
    entropy = None
    if needs_entropy(gate=gate, eta=eta, buckets=buckets, num_buckets=num_buckets, progress=progress):
        entropy = batch.field("entropies", "the ERPO gate (gate=True)" if gate else "progress='cumulative_entropy'")

    # 1. entropy-aware gating at critical decision pivots
    if gate:
        z = group_zscore(entropy, mask, gid, num_groups)
        weight = masked(torch.sigmoid(gamma * z).clamp(min=gate_min), mask)
    else:
        weight = mask.to(seq_adv.dtype)
    mean_weight = weight.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    gated = seq_adv.unsqueeze(1) * weight / torch.where(mean_weight > 0, mean_weight, 1.0).unsqueeze(1)
    if eta == 0:
        return gated

    # 2. bucket-based implicit normalisation of the process signal
    k = num_buckets if buckets else 1
    bucket = progress_buckets(mask, k, entropy if progress == "cumulative_entropy" else None)
    s = beta_p * (batch.field("old_logprobs", "ERPO") - batch.field("ref_logprobs", "ERPO's process term (eta != 0)"))
    s_tilde = group_zscore(s, mask, gid, num_groups, bucket=bucket, num_buckets=k, eps=s_eps)

    # 3. result-anchored advantage synthesis
    direction = torch.sign(seq_adv) if anchor else torch.ones_like(seq_adv)
    if anchor and zero_var_fallback:  # EP-GRPO: a group whose rewards are all equal (or a single response)
        rewards = batch.rewards.to(seq_adv.dtype)
        stats = group_reward_stats(rewards, gid, num_groups)
        rewards_all_equal = stats.zero_variance | (stats.size == 1)
        direction = torch.where(rewards_all_equal, torch.sign(rewards - theta_r), direction)
    return masked(gated + eta * weight * direction.unsqueeze(1) * s_tilde, mask)


ep_grpo = register_estimator("ep_grpo", requires=_erpo_requires)(
    functools.partial(erpo, progress="cumulative_entropy", zero_var_fallback=True)
)
ep_grpo.__doc__ = "EP-GRPO: ERPO with cumulative-entropy progress buckets and the zero-variance anchor. (N,T)."
