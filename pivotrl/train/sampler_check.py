"""Is the rollout engine sampling from the policy being trained?

Every engine reports ℓ^sampler, the log-prob of each token it drew under the
distribution it drew it from; the trainer's forward of the policy on the same
rollout gives ℓ^old. rollout/logprob_diff = mean |ℓ^sampler − ℓ^old| over the
response tokens is ~0 when the engine runs the policy's current weights (float
rounding only), and grows when it runs stale or wrong weights. SamplerCheck stops
the run when it stays above a bound.
"""

from __future__ import annotations

from torch import Tensor

from pivotrl.errors import SamplerMismatch

#: rollout.max_logprob_diff "auto", by model.dtype: a few times the rounding gap between two
#: implementations of one model (measured: float32 about 3e-7; bfloat16 0.003-0.02 on the tiny policy,
#: about 0.04 on SmolLM2-135M; docs/ALGORITHMS.md "Sampler check").
AUTO_BOUNDS = {"float32": 0.02, "bfloat16": 0.1, "float16": 0.1}


def sampler_bound(setting: float | str | None, dtype: str) -> float | None:
    """rollout.max_logprob_diff as a number: "auto" is AUTO_BOUNDS[dtype]; a number or None (off) as given."""
    return AUTO_BOUNDS[dtype] if setting == "auto" else setting


def logprob_diff(sampler_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> float:
    """Mean |ℓ^sampler − ℓ^old| over the tokens where `mask` (B,R) is true; 0.0 when there are none."""
    mask = mask.bool()
    count = int(mask.sum())
    if count == 0:
        return 0.0
    gap = (sampler_logprobs.float() - old_logprobs.detach().float()).abs()
    return float(gap[mask].sum()) / count


class SamplerCheck:
    """Counts consecutive steps whose logprob_diff exceeds `bound` (None: never) and aborts at `patience`."""

    def __init__(self, bound: float | None, patience: int) -> None:
        if patience < 1:
            raise ValueError(f"rollout.logprob_diff_patience must be >= 1, got {patience}")
        self.bound = bound
        self.patience = patience
        self.streak = 0

    def observe(self, diff: float, step: int) -> None:
        """Record one step's logprob_diff; raise SamplerMismatch on the `patience`-th consecutive one above the bound."""
        if self.bound is None:
            return
        self.streak = 0 if diff <= self.bound else self.streak + 1  # NaN counts as above
        if self.streak >= self.patience:
            raise SamplerMismatch(
                f"rollout/logprob_diff = {diff:.3g} at step {step}, above rollout.max_logprob_diff = {self.bound:g} "
                f"for {self.streak} consecutive steps (rollout.logprob_diff_patience = {self.patience}): the rollout "
                "engine is not sampling from the policy being trained (stale or wrong weights, a precision "
                "mismatch, or rollout.top_p < 1, whose truncated distribution counts here). Check that the engine "
                "syncs its weights; raise rollout.max_logprob_diff, or set it to null to switch the check off.")
