"""Policy losses and aggregation pinned to hand-computed cases; gradcheck of every loss."""

from __future__ import annotations

import math

import pytest
import torch

from algo_helpers import make_batch, random_batch
from pivotrl.algorithms import POLICY_LOSSES, aggregate_loss, compute_policy_loss
from pivotrl.algorithms.losses import block_log_ratio, kl_penalty


def ppo_case(log_ratios: list[float], advs: list[float], **hp: object) -> tuple[float, dict[str, float]]:
    batch = make_batch([0.0] * len(advs), [0] * len(advs), [1] * len(advs), old=[[0.0]] * len(advs))
    logprobs = torch.tensor([[x] for x in log_ratios], dtype=torch.float64)
    adv = torch.tensor([[a] for a in advs], dtype=torch.float64)
    loss, metrics = compute_policy_loss("ppo", batch, advantages=adv, logprobs=logprobs, **hp)
    return float(loss), metrics


def test_ppo_clip_hand_cases() -> None:
    up, down = math.log(1.5), math.log(0.5)
    # A=+1, ρ=1.5: -min(1.5, 1.28) = -1.28 | A=+1, ρ=0.5: -min(0.5, 0.8) = -0.5
    # A=-1, ρ=1.5: -min(-1.5, -1.28) = 1.5 | A=-1, ρ=0.5: -min(-0.5, -0.8) = 0.8
    # token-mean: (-1.28 - 0.5 + 1.5 + 0.8) / 4 = 0.13
    loss, metrics = ppo_case([up, down, up, down], [1, 1, -1, -1])
    assert loss == pytest.approx(0.13)
    # clipped branch chosen at tokens 1 and 4
    assert metrics["clip/frac"] == pytest.approx(0.5)


def test_dual_clip_hand_case() -> None:
    # A=-1, ρ=5: L = max(5, 1.28) = 5, dual clip c=3 -> min(5, 3) = 3; A=+1 untouched: -1.28
    loss, metrics = ppo_case([math.log(5.0), math.log(5.0)], [-1, 1], dual_clip=3.0)
    assert loss == pytest.approx((3 - 1.28) / 2)
    assert metrics["clip/dual_frac"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_case([0.0], [1.0], dual_clip=0.5)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_log_ratio_is_clamped_so_an_overflow_with_zero_advantage_is_not_nan(name: str) -> None:
    # ℓ^θ − ℓ^old = 100 on a whole response (token, sequence and block ratios alike): exp overflows
    # float32, and inf · 0 = NaN, unless the log-ratio is clamped to ±20
    batch = make_batch([0.0, 1.0], [0, 0], [3, 3], old=[[0.0] * 3] * 2, dtype=torch.float32)
    logprobs = torch.tensor([[100.0, 100.0, 100.0], [0.0, -0.1, 0.1]], requires_grad=True)
    adv = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    loss, metrics = compute_policy_loss(name, batch, advantages=adv, logprobs=logprobs, beta_kl=0.0,
                                        eps_low=0.2, eps_high=0.28)
    assert torch.isfinite(loss) and math.isfinite(metrics["ratio/max"])
    assert metrics["ratio/max"] <= math.exp(20.0) * (1 + 1e-6)


def test_kl_estimators_hand_values() -> None:
    lp, ref = torch.tensor([0.0]), torch.tensor([math.log(0.5)])
    # x = ℓ - ℓref = ln 2: k1 = 0.693147, k2 = 0.240227, k3 = e^{-x} + x - 1 = 0.5 + 0.693147 - 1
    assert float(kl_penalty(lp, ref, "k1")) == pytest.approx(math.log(2))
    assert float(kl_penalty(lp, ref, "k2")) == pytest.approx(0.5 * math.log(2) ** 2)
    assert float(kl_penalty(lp, ref, "k3")) == pytest.approx(0.5 + math.log(2) - 1)
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_penalty(lp, ref, "k4")


def test_ppo_kl_penalty_is_added_to_every_token() -> None:
    batch = make_batch([0, 0], [0, 0], [1, 1], old=[[0.0], [0.0]], ref=[[math.log(0.5)], [0.0]])
    lp = torch.zeros(2, 1, dtype=torch.float64)
    adv = torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    loss, m = compute_policy_loss("ppo", batch, advantages=adv, logprobs=lp, beta_kl=0.1)
    # ρ = 1: surrogate -1 per token; k3 = [0.193147, 0] -> mean(-1 + 0.0193147, -1)
    assert float(loss) == pytest.approx((-1 + 0.1 * (math.log(2) - 0.5) - 1) / 2)
    assert m["kl/ref"] == pytest.approx((math.log(2) - 0.5) / 2)


def test_gspo_sequence_ratio_and_gradient() -> None:
    # one response, δ = [0.1, 0.3]: s = exp(0.2) for both tokens; A = 1, eps large (no clip):
    # seq-mean-token-mean loss = -exp(0.2); d loss/d ℓ_t = -(1/2)·exp(0.2) (token form gradient s_i per token)
    batch = make_batch([1.0], [0], [2], old=[[0.0, 0.0]])
    lp = torch.tensor([[0.1, 0.3]], dtype=torch.float64, requires_grad=True)
    adv = torch.ones(1, 2, dtype=torch.float64)
    loss, m = compute_policy_loss("gspo", batch, advantages=adv, logprobs=lp, eps_low=1.0, eps_high=1.0)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-math.exp(0.2))
    torch.testing.assert_close(lp.grad, torch.full((1, 2), -0.5 * math.exp(0.2), dtype=torch.float64))
    assert m["ratio/mean"] == pytest.approx(math.exp(0.2))
    # default gspo clip (3e-4 / 4e-4): exp(0.2) is clipped to 1.0004, gradient 0
    lp.grad = None
    loss, m = compute_policy_loss("gspo", batch, advantages=adv, logprobs=lp)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-1.0004) and torch.all(lp.grad == 0) and m["clip/frac"] == 1.0


def test_tepo_kl_mask_hand_case() -> None:
    # 4 tokens in one response: A = [1, 1, -1, 1]; H^θ < H at tokens 0, 2 -> KL only at token 0
    batch = make_batch([1.0], [0], [4], old=[[0.0] * 4], ref=[[math.log(0.5)] * 4], entropies=[[2, 2, 2, 2]])
    lp = torch.zeros(1, 4, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0]], dtype=torch.float64)
    h_new = torch.tensor([[1.0, 3.0, 1.0, 2.0]], dtype=torch.float64)
    loss, m = compute_policy_loss("tepo", batch, advantages=adv, logprobs=lp, entropies_new=h_new)
    k3 = math.log(2) - 0.5
    # ρ = 1: surrogate -A per token, sum = -2; + 0.05·k3 at token 0; token-mean over 4
    assert float(loss) == pytest.approx((-2 + 0.05 * k3) / 4)
    assert m["kl/mask_frac"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="entropies_new"):
        compute_policy_loss("tepo", batch, advantages=adv, logprobs=lp)
    # beta_kl = 0: no KL and no need for the entropies
    loss, _ = compute_policy_loss("tepo", batch, advantages=adv, logprobs=lp, beta_kl=0.0)
    assert float(loss) == pytest.approx(-0.5)


def test_mpo_block_ratios_hand_cases() -> None:
    delta = torch.tensor([[0.1, 0.2, 0.3, 0.4, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, False]])
    # K=2 sliding, uniform: [(0.1+0.2)/2, (0.2+0.3)/2, (0.3+0.4)/2, 0.4 (shorter block at the end), pad]
    torch.testing.assert_close(block_log_ratio(delta, mask, 2), torch.tensor([[0.15, 0.25, 0.35, 0.4, 0.0]], dtype=torch.float64))
    # exact: sums, no renormalisation
    torch.testing.assert_close(block_log_ratio(delta, mask, 2, exact=True), torch.tensor([[0.3, 0.5, 0.7, 0.4, 0.0]], dtype=torch.float64))
    # future_share 0.25, K=2: β = [0.75, 0.25]: 0.075+0.05 = 0.125, 0.15+0.075 = 0.225, 0.225+0.1 = 0.325, 0.4
    torch.testing.assert_close(
        block_log_ratio(delta, mask, 2, future_share=0.25), torch.tensor([[0.125, 0.225, 0.325, 0.4, 0.0]], dtype=torch.float64)
    )
    # disjoint K=2: blocks {0,1}, {2,3}: [0.15, 0.15, 0.35, 0.35]; K=3: {0,1,2}, {3}
    torch.testing.assert_close(block_log_ratio(delta, mask, 2, mode="disjoint"), torch.tensor([[0.15, 0.15, 0.35, 0.35, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(block_log_ratio(delta, mask, 3, mode="disjoint"), torch.tensor([[0.2, 0.2, 0.2, 0.4, 0.0]], dtype=torch.float64))
    # K=1 is the token ratio
    torch.testing.assert_close(block_log_ratio(delta, mask, 1), torch.where(mask, delta, 0.0))


def test_mpo_loss_uses_block_ratio() -> None:
    batch = make_batch([1.0], [0], [3], old=[[0.0, 0.0, 0.0]])
    lp = torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float64)
    adv = torch.ones(1, 3, dtype=torch.float64)
    loss, _ = compute_policy_loss("mpo", batch, advantages=adv, logprobs=lp, block_size=2)
    # λ = [0.15, 0.25, 0.3] -> ratios 1.1618, 1.2840, 1.3499; A > 0 so the last two clip at 1.28:
    # loss = -(1.1618 + 1.28 + 1.28)/3
    assert float(loss) == pytest.approx(-(math.exp(0.15) + 1.28 + 1.28) / 3)


def test_aggregation_modes_hand_case() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    # token-mean: (1+2+3+4)/4 = 2.5; seq-mean-token-mean: (2 + 4)/2 = 3 (empty row left out)
    # seq-mean-token-sum: (6 + 4)/2 = 5; seq-mean-token-sum-norm: 10/(3·3), or 10/(3·5) with max_len 5
    assert float(aggregate_loss(loss, mask, "token-mean")) == 2.5
    assert float(aggregate_loss(loss, mask, "seq-mean-token-mean")) == 3.0
    assert float(aggregate_loss(loss, mask, "seq-mean-token-sum")) == 5.0
    assert float(aggregate_loss(loss, mask, "seq-mean-token-sum-norm")) == pytest.approx(10 / 9)
    assert float(aggregate_loss(loss, mask, "seq-mean-token-sum-norm", max_len=5)) == pytest.approx(10 / 15)
    with pytest.raises(ValueError, match="did you mean 'token-mean'"):
        aggregate_loss(loss, mask, "token_mean")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_micro_batches_with_global_counts_sum_to_the_batch_loss(name: str, mode: str) -> None:
    batch = random_batch(seed=5)
    g = torch.Generator().manual_seed(1)
    lp = batch.old_logprobs + 0.1 * torch.randn(batch.old_logprobs.shape, generator=g, dtype=torch.float64)
    h_new = batch.entropies * 0.9
    adv = torch.randn(lp.shape, generator=g, dtype=torch.float64)
    kw = dict(loss_agg_mode=mode, entropies_new=h_new, eps_low=0.2, eps_high=0.28)
    full, _ = compute_policy_loss(name, batch, advantages=adv, logprobs=lp, **kw)
    n_tokens = int(batch.response_mask.sum())
    n_seqs = batch.num_responses if mode == "seq-mean-token-sum-norm" else int((batch.lengths > 0).sum())
    total = 0.0
    for rows in (slice(0, 5), slice(5, 12)):
        part = type(batch)(batch.rewards[rows], batch.group_index[rows], batch.response_mask[rows],
                           batch.old_logprobs[rows], batch.ref_logprobs[rows], batch.entropies[rows])
        loss, _ = compute_policy_loss(name, part, advantages=adv[rows], logprobs=lp[rows], global_num_tokens=n_tokens,
                                      global_num_seqs=n_seqs, max_len=9, entropies_new=h_new[rows],
                                      loss_agg_mode=mode, eps_low=0.2, eps_high=0.28)
        total += float(loss)
    assert total == pytest.approx(float(full), abs=1e-12)


def test_token_mean_is_token_weighted_combination_of_micro_batches() -> None:
    batch = random_batch(seed=9)
    lp = batch.old_logprobs * 1.05
    adv = torch.randn(lp.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    full, _ = compute_policy_loss("ppo", batch, advantages=adv, logprobs=lp)
    parts = []
    for rows in (slice(0, 3), slice(3, 8), slice(8, 12)):
        part = type(batch)(batch.rewards[rows], batch.group_index[rows], batch.response_mask[rows], batch.old_logprobs[rows])
        loss, _ = compute_policy_loss("ppo", part, advantages=adv[rows], logprobs=lp[rows])
        parts.append((float(loss), int(part.response_mask.sum())))
    n = sum(c for _, c in parts)
    assert sum(v * c / n for v, c in parts) == pytest.approx(float(full), abs=1e-12)


@pytest.mark.parametrize("name,hp", [
    ("ppo", {}), ("ppo", {"beta_kl": 0.1, "kl_estimator": "k2", "dual_clip": 3.0}), ("gspo", {"eps_low": 0.2, "eps_high": 0.2}),
    ("tepo", {}), ("mpo", {}), ("mpo", {"mode": "disjoint", "future_share": 0.3}), ("mpo", {"exact": True, "beta_kl": 0.1}),
])
def test_gradcheck_float64(name: str, hp: dict[str, object]) -> None:
    batch = random_batch(n_groups=2, group_size=2, width=5, seed=2)
    adv = torch.randn(batch.old_logprobs.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    if name in ("gspo", "tepo"):
        # the sequence ratio's token form sg[s_i]·exp(ℓ_t - sg[ℓ_t]) is the true gradient of its
        # value only when the advantage is constant over the response (the GSPO setting)
        adv = adv[:, :1].expand_as(adv).contiguous()
    h_new = batch.entropies * 0.8
    lp = (batch.old_logprobs + 0.05).detach().requires_grad_()

    def f(x: torch.Tensor) -> torch.Tensor:
        return compute_policy_loss(name, batch, advantages=adv, logprobs=x, entropies_new=h_new, **hp)[0]

    assert torch.autograd.gradcheck(f, (lp,))


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_loss_dtype_follows_input(name: str) -> None:
    for dtype in (torch.float32, torch.float64):
        batch = random_batch(dtype=dtype)
        loss, metrics = compute_policy_loss(name, batch, advantages=torch.ones_like(batch.old_logprobs),
                                            logprobs=batch.old_logprobs.clone(), entropies_new=batch.entropies)
        assert loss.dtype == dtype and loss.ndim == 0 and "clip/frac" in metrics and "loss" in metrics


def test_on_the_first_update_of_a_rollout_tepo_without_its_kl_is_ppo_and_mpo_reweights_tokens() -> None:
    """π_θ = π_old on a rollout's first update: every ratio is 1 and no clip acts, so TEPO's sequence ratio
    (β_kl = 0) has PPO's gradient exactly, while MPO's block ratio spreads a token's advantage over the
    block's K tokens. Their own mechanisms act only from a second update on (the SmolLM2 methods' design)."""
    batch = random_batch(seed=3)
    per_token = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)

    def gradient(name: str, advantages: torch.Tensor, **kwargs: object) -> torch.Tensor:
        logprobs = batch.old_logprobs.clone().requires_grad_(True)
        loss, _ = compute_policy_loss(name, batch, advantages=advantages, logprobs=logprobs, **kwargs)
        aggregate_loss(loss, batch.response_mask, "token-mean").backward()
        return logprobs.grad

    ppo = gradient("ppo", per_token)
    assert ppo.abs().sum() > 0
    torch.testing.assert_close(gradient("tepo", per_token, beta_kl=0.0), ppo)

    # MPO with a response's advantage a constant (GRPO's): token u gets a · Σ over the blocks t that hold it
    # of 1 / (that block's length), K = 5, blocks cut short at the response's end
    per_response = torch.randn(len(batch.rewards), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    advantages = per_response.unsqueeze(1).expand_as(per_token).contiguous()
    lengths = batch.response_mask.sum(1).tolist()
    weights = torch.zeros_like(advantages)
    for i, length in enumerate(lengths):
        for u in range(length):
            weights[i, u] = sum(1 / min(5, length - t) for t in range(max(0, u - 4), u + 1))
    expected = -advantages * weights / batch.response_mask.sum()
    torch.testing.assert_close(gradient("mpo", advantages, block_size=5), expected)
    assert not torch.allclose(gradient("ppo", advantages), expected)
