"""ERPO (2603.28204) and EP-GRPO (2605.04960): one estimator, two presets.

A = Â·W/mean_i(W)  +  η·W·d·s̃

W: entropy gate at critical decision pivots, σ(γ·z) of the group-z-scored entropy.
s̃: implicit process signal β_p·(ℓ^old − ℓ^ref), normalised inside (group, progress
   bucket) cells. Progress is position t/T_i (ERPO) or cumulative entropy (EP-GRPO).
d: the outcome anchor sgn(Â); EP-GRPO falls back to sgn(r − θ_r) in groups whose
   rewards are all equal, so they still get gradient from the process term.

How it is computed: progress never decreases along a response, so each bucket is a
run of positions, given by its bounds (N, K+1). Cell statistics are segment sums
over those runs, everything else lives in small (response, bucket) tables, and the
result is one affine map per run: A = W·(offset_b + slope_b·y). With right padding
(the usual layout) no pass masks the padding: reductions stop at each response's end
and the padding is a last run whose slope and offset are 0.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pivotrl.algorithms.baselines import grpo_sequence_advantage
from pivotrl.algorithms.batch import TokenBatch
from pivotrl.algorithms.registry import register_estimator
from pivotrl.algorithms.stats import (
    EPS_STD,
    group_ids,
    group_reward_stats,
    is_prefix_mask,
    prefix_sums,
    segment_affine_,
    segment_sums,
    valid_lengths,
)
from pivotrl.algorithms.validate import check

PROGRESS_MODES = ("position", "cumulative_entropy")


class Layout:
    """Where the valid tokens of each response are.

    Right-padded (prefix) masks are the common case: row i's valid tokens are the
    positions [0, T_i), so a reduction can stop at T_i and values on the padding
    may be left as any finite number. Other masks clear the padding explicitly.
    """

    def __init__(self, mask: Tensor) -> None:
        self.mask = mask
        self.lengths = valid_lengths(mask)
        self.prefix = is_prefix_mask(mask)
        width = torch.full_like(self.lengths, mask.shape[1])
        self.end = (self.lengths if self.prefix else width).unsqueeze(1)  # (N,1) where each row's tokens stop
        self._ranks: Tensor | None = None

    def clear_padding_(self, x: Tensor) -> Tensor:
        """x with padding set to 0 in place; a no-op for right padding, where reductions stop at T_i."""
        return x if self.prefix else self.zero_padding_(x)

    def zero_padding_(self, x: Tensor) -> Tensor:
        return torch.where(self.mask, x, torch.zeros((), dtype=x.dtype, device=x.device), out=x)

    def rank_before(self, positions: Tensor) -> Tensor:
        """Number of valid tokens before each position (N,P) in [0, T]."""
        if self.prefix:
            return torch.minimum(positions, self.lengths.unsqueeze(1))
        return torch.nn.functional.pad(self._valid_count(), (1, 0)).gather(1, positions).long()

    def position_of_rank(self, ranks: Tensor) -> Tensor:
        """Position of the valid token of each rank (N,P), 0-based; T where there is none."""
        if self.prefix:
            return ranks.clone()
        return torch.searchsorted(self._valid_count(), (ranks + 1).to(torch.int32))

    def _valid_count(self) -> Tensor:
        """(N,T) int32 running count of valid tokens (only for masks that are not right-padded)."""
        if self._ranks is None:
            self._ranks = self.mask.cumsum(dim=1, dtype=torch.int32)
        return self._ranks


def entropy_gate(
    entropy: Tensor, layout: Layout, gid: Tensor, num_groups: int, gamma: float, gate_min: float
) -> tuple[Tensor, Tensor]:
    """W (N,T) = max(σ(γ·z), gate_min), z the entropy z-score over the group's valid tokens,
    and Σ_t W (N,) over each response's valid tokens.

    entropy (N,T), 0 on padding, is overwritten by W; W on padding is 0 unless the
    mask is right-padded, where it is left as it falls (finite).
    """
    def per_group(per_response: Tensor) -> Tensor:
        return per_response.new_zeros(num_groups).index_add_(0, gid, per_response)[gid].unsqueeze(1)

    count = per_group(layout.lengths.to(entropy.dtype))
    centred = layout.clear_padding_(entropy.sub_(per_group(entropy.sum(dim=1)) / count.clamp(min=1)))
    _, squares = prefix_sums(centred, layout.end, sums=False, squares=True)
    var = per_group(squares.squeeze(1)) / (count - 1).clamp(min=1)
    z_scale = torch.where(count >= 2, gamma / (var.sqrt() + EPS_STD), 0.0).to(entropy.dtype)
    gate = centred.mul_(z_scale).sigmoid_()
    if gate_min > 0:
        gate.clamp_(min=gate_min)
    layout.clear_padding_(gate)
    return gate, prefix_sums(gate, layout.end)[0].squeeze(1)


def bucket_bounds(
    layout: Layout, num_buckets: int, progress: str, entropy: Tensor | None, spare: Tensor
) -> tuple[Tensor, Tensor]:
    """Bounds (N, K+1) and valid-token counts (N, K) of every response's K progress buckets.

    Bucket b of response i is the run of positions [bounds[i,b], bounds[i,b+1]);
    bounds[:,0] = 0 and bounds[:,K] = the end of the response's tokens.
    position: b = ⌊K·t/T_i⌋, t = 0..T_i-1 counted over valid tokens.
    cumulative_entropy: b = min(⌊K·S_t/S_T⌋, K-1), S the running entropy sum (entropy
    is 0 on padding); a response with zero total entropy uses the position buckets.
    spare (N,T) is scratch space.
    """
    k = num_buckets
    steps = torch.arange(k + 1, device=layout.lengths.device)
    first_rank = (steps * layout.lengths.unsqueeze(1) + k - 1).div_(k, rounding_mode="floor")  # ⌈b·T_i/K⌉
    bounds = layout.position_of_rank(first_rank)
    bounds[:, :1] = 0
    bounds[:, k:] = layout.end
    if progress == "position" or k == 1:
        return bounds, first_rank.diff(dim=1)
    if bool(entropy.min() >= 0):  # entropies are >= 0 in practice: clamping would change nothing
        spent = torch.cumsum(entropy, dim=1, out=spare)
    else:
        spent = torch.clamp(entropy, min=0, out=spare).cumsum_(dim=1)
    total = spent[:, -1:].clone()
    spent_any = total > 0
    # K·S_t/S_T exactly as the bucket formula rounds it; bucket b starts at its first value >= b
    scaled = spent.mul_(k).div_(torch.where(spent_any, total, 1.0))
    levels = torch.arange(1, k, dtype=scaled.dtype, device=scaled.device).expand(scaled.shape[0], k - 1)
    by_entropy = torch.cat([bounds[:, :1], torch.searchsorted(scaled, levels.contiguous()), bounds[:, k:]], dim=1)
    if not bool(spent_any.all()):
        by_entropy = torch.where(spent_any, by_entropy, bounds)
    return by_entropy, layout.rank_before(by_entropy).diff(dim=1)


def process_signal(
    batch: TokenBatch, layout: Layout, gid: Tensor, num_groups: int, bounds: Tensor, counts: Tensor,
    out: Tensor, *, beta_p: float, s_eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """The bucket-normalised process signal s̃ as y·slope + offset on each (response, bucket) cell.

    Returns y (N,T), written into out: ℓ^old − ℓ^ref minus the response's mean over its
    valid tokens (the shift keeps one-pass cell variances accurate), and slope, offset
    (N,K) tables in a wide dtype. s = β_p·(ℓ^old − ℓ^ref) is z-scored in its (group,
    bucket) cell: slope = β_p/(|β_p|·σ + s_eps), and 0 in a cell of fewer than two tokens.
    """
    if batch.ref_logprobs is None:
        raise ValueError("ERPO's process term (eta != 0) needs TokenBatch.ref_logprobs, which is None")
    dtype = batch.compute_dtype
    y = layout.zero_padding_(torch.sub(batch.old_logprobs.to(dtype), batch.ref_logprobs.to(dtype), out=out))
    shift = y.sum(dim=1, keepdim=True) / layout.lengths.unsqueeze(1).clamp(min=1)
    layout.clear_padding_(y.sub_(shift))
    total, squares = segment_sums(y, bounds, squares=True)
    n = counts.to(total.dtype)
    # per (response, bucket): the mean in units of ℓ and the sum of squared deviations from it
    mean = total / n.clamp(min=1)
    spread = (squares - total * mean).clamp_(min=0)
    shift = shift.to(total.dtype)
    mean += shift

    def per_group(table: Tensor) -> Tensor:
        return table.new_zeros(num_groups, table.shape[1]).index_add_(0, gid, table)[gid]

    # pooled over the group's responses (Chan et al.'s parallel variance)
    cell_n = per_group(n)
    cell_mean = per_group(n * mean) / cell_n.clamp(min=1)
    cell_var = per_group(spread + n * (mean - cell_mean) ** 2) / (cell_n - 1).clamp(min=1)
    slope = torch.where(cell_n >= 2, beta_p / (abs(beta_p) * cell_var.sqrt() + s_eps), 0.0)
    return y, slope, (shift - cell_mean) * slope


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
    seq_adv = grpo_sequence_advantage(batch, norm_by_std)
    if not gate and eta == 0:
        return torch.where(mask, seq_adv.unsqueeze(1), 0.0)
    if mask.numel() == 0:
        return torch.zeros(mask.shape, dtype=seq_adv.dtype, device=mask.device)
    layout = Layout(mask)
    k = num_buckets if buckets else 1
    entropy = None
    if gate or (eta != 0 and k > 1 and progress == "cumulative_entropy"):
        entropy = batch.field("entropies", "the ERPO gate (gate=True)" if gate else "progress='cumulative_entropy'")
    if eta != 0:
        out = torch.empty(mask.shape, dtype=batch.compute_dtype, device=mask.device)
        bounds, counts = bucket_bounds(layout, k, progress, entropy, spare=out)
    # A = W·(Â/mean(W) + η·d·s̃), with W = 1 without the gate
    base = seq_adv
    if gate:
        weight, weight_sum = entropy_gate(entropy, layout, gid, num_groups, gamma, gate_min)
        mean_weight = weight_sum.to(seq_adv.dtype) / layout.lengths.clamp(min=1)
        base = seq_adv / torch.where(mean_weight > 0, mean_weight, 1.0)
        if eta == 0:
            return layout.zero_padding_(weight).mul_(base.unsqueeze(1))
    y, slope, offset = process_signal(
        batch, layout, gid, num_groups, bounds, counts, out, beta_p=beta_p, s_eps=s_eps
    )
    if not anchor:
        direction = torch.ones_like(seq_adv)
    else:
        direction = torch.sign(seq_adv)
        if zero_var_fallback:
            rewards = batch.rewards.to(seq_adv.dtype)
            stats = group_reward_stats(rewards, gid, num_groups)
            direction = torch.where(stats.zero_variance, torch.sign(rewards - theta_r), direction)
    # A/W = base + η·d·s̃ = offset_b + slope_b·y on bucket b; the padding run (cell K) maps to 0
    anchored = (eta * direction).to(slope.dtype).unsqueeze(1)
    cell_slope = torch.nn.functional.pad(anchored * slope, (0, 1)).to(y.dtype)
    cell_offset = torch.nn.functional.pad(base.to(slope.dtype).unsqueeze(1) + anchored * offset, (0, 1)).to(y.dtype)
    out = segment_affine_(y, cell_slope, cell_offset, bounds[:, 1:])
    if gate:
        return out.mul_(weight)
    return layout.clear_padding_(out)


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
