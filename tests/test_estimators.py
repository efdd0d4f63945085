"""Estimators pinned to small cases computed by hand (arithmetic in the comments)."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest
import torch

from algo_helpers import make_batch, random_batch
from pivotrl.algorithms import ESTIMATORS, TokenBatch, compute_advantages, estimator_diagnostics

EPS = 1e-6


def close(actual: torch.Tensor, expected: list[list[float]], tol: float = 1e-9) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=tol, rtol=0)


# One group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3) = 0.577350...
SQRT13 = math.sqrt(1 / 3)
GRPO_POS = 0.5 / (SQRT13 + EPS)  # 0.866024...


def four() -> TokenBatch:
    return make_batch([1, 0, 0, 1], [7, 7, 7, 7], [2, 1, 2, 0], entropies=[[1, 2], [0.5], [3, 0], []])


def test_grpo_hand_case() -> None:
    adv = compute_advantages("grpo", four())
    # response 3 has no tokens: nothing to carry its advantage
    close(adv, [[GRPO_POS, GRPO_POS], [-GRPO_POS, 0], [-GRPO_POS, -GRPO_POS], [0, 0]])


def test_grpo_singleton_group_has_mean_0_std_1() -> None:
    batch = make_batch([0.7, 1.0, 0.0], [0, 1, 1], [1, 1, 1])
    # singleton: (0.7 - 0)/(1 + eps); pair [1, 0]: mean 0.5, std sqrt(0.5) = 0.7071
    pair = 0.5 / (math.sqrt(0.5) + EPS)
    close(compute_advantages("grpo", batch), [[0.7 / (1 + EPS)], [pair], [-pair]])


def test_grpo_all_equal_group_is_exactly_zero() -> None:
    # 0.1 * 3 / 3 != 0.1 in floating point: the estimator must still give exact zeros
    batch = make_batch([0.1, 0.1, 0.1], [0, 0, 0], [2, 2, 2], dtype=torch.float32)
    assert torch.equal(compute_advantages("grpo", batch), torch.zeros(3, 2))


def test_dr_grpo_hand_case() -> None:
    close(compute_advantages("dr_grpo", four()), [[0.5, 0.5], [-0.5, 0], [-0.5, -0.5], [0, 0]])


def test_rloo_hand_case() -> None:
    # r=1: 1 - (0+0+1)/3 = 2/3; r=0: 0 - (1+0+1)/3 = -2/3; a singleton keeps r
    batch = make_batch([1, 0, 0, 1, 0.4], [0, 0, 0, 0, 1], [1, 1, 1, 1, 1])
    close(compute_advantages("rloo", batch), [[2 / 3], [-2 / 3], [-2 / 3], [2 / 3], [0.4]])


def test_high_entropy_hand_case() -> None:
    # valid entropies 1, 2, 0.5, 3, 0 -> sorted 0, 0.5, 1, 2, 3; q_0.8 at position 0.8*4 = 3.2:
    # 2 + 0.2*(3-2) = 2.2 -> only the token with H=3 keeps its advantage
    adv = compute_advantages("high_entropy", four(), rho=0.2)
    close(adv, [[0, 0], [0, 0], [-GRPO_POS, 0], [0, 0]])
    # rho=1: threshold is the minimum, every valid token kept = grpo
    assert torch.equal(compute_advantages("high_entropy", four(), rho=1.0), compute_advantages("grpo", four()))


def test_high_entropy_threshold_matches_torch_quantile() -> None:
    batch = random_batch(seed=3)
    for rho in (0.2, 0.5, 0.37):
        valid = batch.entropies[batch.response_mask]
        threshold = torch.quantile(valid, 1 - rho)
        keep = batch.response_mask & (batch.entropies >= threshold)
        expected = torch.where(keep, compute_advantages("grpo", batch), 0.0)
        assert torch.equal(compute_advantages("high_entropy", batch, rho=rho), expected)


def test_entropy_shaping_hand_case() -> None:
    # A = Â + min(0.4·H, |Â|/2); |Â|/2 = 0.433012
    adv = compute_advantages("entropy_shaping", four())
    half = GRPO_POS / 2
    close(adv, [
        [GRPO_POS + 0.4, GRPO_POS + half],          # H=1: 0.4 < 0.433; H=2: 0.8 > 0.433
        [-GRPO_POS + 0.2, 0],                      # H=0.5: 0.2
        [-GRPO_POS + half, -GRPO_POS + 0],         # H=3: capped; H=0: 0
        [0, 0],
    ])


def test_gtpo_hand_case() -> None:
    # group r=[1,1,0], all 2 tokens, H = [[1,2],[3,2],[1,4]]
    # t0: O+ entropies 1,3 (sum 4), d=2: shares 1/4, 3/4 -> r+ = 1 + 0.1·(1/4)·2 = 1.05, 1 + 0.1·(3/4)·2 = 1.15
    # t1: O+ entropies 2,2, d=2: shares 1/2 -> r+ = 1 + 0.1 = 1.1 for both
    # O- has one response, h=1, share 1: r- = -1 - 0.1 = -1.1 at both positions
    batch = make_batch([1, 1, 0], [0, 0, 0], [2, 2, 2], entropies=[[1, 2], [3, 2], [1, 4]])
    token_rewards = [1.05, 1.1, 1.15, 1.1, -1.1, -1.1]
    mu, sd = statistics.mean(token_rewards), statistics.stdev(token_rewards)
    z = [(x - mu) / (sd + EPS) for x in token_rewards]
    close(compute_advantages("gtpo", batch), [z[0:2], z[2:4], z[4:6]], tol=1e-9)


def test_gtpo_negative_side_weights_inverse_entropy() -> None:
    # two O- responses at t0 with H = 1 and 4: 1/H = 1, 0.25 (sum 1.25), h=2:
    # r- = -1 - 0.1·(1/1.25)·2 = -1.16 and -1 - 0.1·(0.25/1.25)·2 = -1.04; O+ single: 1 + 0.1 = 1.1
    batch = make_batch([0, 0, 1], [0, 0, 0], [1, 1, 1], entropies=[[1], [4], [2]])
    token_rewards = [-1.16, -1.04, 1.1]
    mu, sd = statistics.mean(token_rewards), statistics.stdev(token_rewards)
    close(compute_advantages("gtpo", batch), [[(x - mu) / (sd + EPS)] for x in token_rewards], tol=1e-9)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_erpo_gate_hand_case() -> None:
    # one group r=[1,0], H = [[1,3],[2]]: group entropy mean 2, std 1 -> z = [-1, 1], [0]
    # W = σ(5z): response 0: [σ(-5), σ(5)] (mean 0.5); response 1: [0.5] (mean 0.5)
    # Â = ±0.5/(sqrt(0.5)+eps) = ±0.70711 -> A = Â·W/mean W
    batch = make_batch([1, 0], [0, 0], [2, 1], entropies=[[1, 3], [2]])
    a = 0.5 / (math.sqrt(0.5) + EPS)
    w0, w1 = sigmoid(-5 / (1 + EPS)), sigmoid(5 / (1 + EPS))
    adv = compute_advantages("erpo", batch, eta=0.0)
    close(adv, [[a * w0 / 0.5, a * w1 / 0.5], [-a, 0]])


def test_erpo_process_term_hand_case() -> None:
    # gate off, one bucket per group (buckets=False): s = 0.1·(old - ref) over the group's 4 tokens
    # old - ref = [1, 2, 3, 6] -> s = [0.1, 0.2, 0.3, 0.6]: mean 0.3, std sqrt((0.04+0.01+0+0.09)/3)
    batch = make_batch([1, 0], [0, 0], [2, 2], old=[[1, 2], [3, 6]], ref=[[0, 0], [0, 0]])
    s = [0.1, 0.2, 0.3, 0.6]
    mu, sd = statistics.mean(s), statistics.stdev(s)
    st = [(x - mu) / (sd + 1e-4) for x in s]
    a = 0.5 / (math.sqrt(0.5) + EPS)
    adv = compute_advantages("erpo", batch, gate=False, buckets=False)
    # A = Â + 0.2·sgn(Â)·s̃
    close(adv, [[a + 0.2 * st[0], a + 0.2 * st[1]], [-a - 0.2 * st[2], -a - 0.2 * st[3]]], tol=1e-9)
    # anchor=False: the sign is 1 for both responses
    adv = compute_advantages("erpo", batch, gate=False, buckets=False, anchor=False)
    close(adv, [[a + 0.2 * st[0], a + 0.2 * st[1]], [-a + 0.2 * st[2], -a + 0.2 * st[3]]], tol=1e-9)


def test_erpo_position_buckets_hand_case() -> None:
    # K=2, lengths 4 and 2: bucket ⌊2t/T⌋ = [0,0,1,1] and [0,1]
    # cell (g,0): s = 0.1·[1, 2, 5]; cell (g,1): s = 0.1·[3, 4, 7]
    batch = make_batch([1, 0], [0, 0], [4, 2], old=[[1, 2, 3, 4], [5, 7]], ref=[[0] * 4, [0, 0]])
    cell0, cell1 = [0.1, 0.2, 0.5], [0.3, 0.4, 0.7]

    def z(cell: list[float], x: float) -> float:
        return (x - statistics.mean(cell)) / (statistics.stdev(cell) + 1e-4)

    a = 0.5 / (math.sqrt(0.5) + EPS)
    adv = compute_advantages("erpo", batch, gate=False, num_buckets=2)
    expected = [
        [a + 0.2 * z(cell0, 0.1), a + 0.2 * z(cell0, 0.2), a + 0.2 * z(cell1, 0.3), a + 0.2 * z(cell1, 0.4)],
        [-a - 0.2 * z(cell0, 0.5), -a - 0.2 * z(cell1, 0.7), 0, 0],
    ]
    close(adv, expected, tol=1e-9)


def test_ep_grpo_cumulative_entropy_buckets_and_fallback() -> None:
    # all-correct group (zero variance): Â = 0, anchor falls back to sgn(1 - 0.5) = +1
    # response 0: H = [3, 1] -> S = [3, 4], τ = [0.75, 1] -> K=2 buckets ⌊2τ⌋ capped: [1, 1]
    # response 1: H = [1, 1, 2] -> S = [1, 2, 4], τ = [0.25, 0.5, 1] -> buckets [0, 1, 1]
    # cell 0: s = [0.1·2]; one token -> s̃ = 0. cell 1: s = 0.1·[1, 1, 4, 3]
    batch = make_batch(
        [1, 1], [0, 0], [2, 3], entropies=[[3, 1], [1, 1, 2]], old=[[1, 1], [2, 4, 3]], ref=[[0, 0], [0, 0, 0]]
    )
    cell1 = [0.1, 0.1, 0.4, 0.3]
    mu, sd = statistics.mean(cell1), statistics.stdev(cell1)
    st = [(x - mu) / (sd + 1e-4) for x in cell1]
    adv = compute_advantages("ep_grpo", batch, gate=False, num_buckets=2)
    close(adv, [[0.2 * st[0], 0.2 * st[1], 0], [0.0, 0.2 * st[2], 0.2 * st[3]]], tol=1e-9)
    # ERPO on the same group: exactly zero (no outcome contrast)
    assert torch.equal(compute_advantages("erpo", batch), torch.zeros(2, 3, dtype=torch.float64))


def test_ep_grpo_zero_total_entropy_falls_back_to_position() -> None:
    batch = make_batch([1, 0], [0, 0], [4, 4], entropies=[[0] * 4, [0] * 4], old=[[1, 2, 3, 4], [4, 3, 2, 1]], ref=[[0] * 4] * 2)
    by_position = compute_advantages("erpo", batch, gate=False, num_buckets=2)
    assert torch.equal(compute_advantages("ep_grpo", batch, gate=False, num_buckets=2), by_position)


def test_cell_with_one_token_and_group_with_one_token_give_zero_signal() -> None:
    batch = make_batch([1, 0], [0, 1], [1, 1], entropies=[[2], [1]], old=[[3], [1]], ref=[[0], [0]])
    # singleton groups, one token each: z = 0 -> W = 0.5 = mean W; s̃ = 0; Â = r/(1+eps)
    close(compute_advantages("erpo", batch), [[1 / (1 + EPS)], [0.0]])


def test_gate_min_floors_the_gate() -> None:
    batch = make_batch([1, 0], [0, 0], [2, 1], entropies=[[1, 3], [2]])
    adv = compute_advantages("erpo", batch, eta=0.0, gate_min=0.3)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    w0, w1 = 0.3, sigmoid(5 / (1 + EPS))  # σ(-5) = 0.0067 clamped to 0.3
    close(adv, [[a * w0 / ((w0 + w1) / 2), a * w1 / ((w0 + w1) / 2)], [-a, 0]])


def test_diagnostics_hand_case() -> None:
    # one group, H = [[1, 3], [2]]: z = [-1, 1, 0]; none is > 1 strictly (z = 1/(1+eps) < 1)
    batch = make_batch([1, 0], [0, 0], [2, 1], entropies=[[1, 3], [2]])
    d = estimator_diagnostics(batch, compute_advantages("grpo", batch))
    assert d["entropy/mean"] == pytest.approx(2.0)
    assert d["entropy/p50"] == pytest.approx(2.0)
    assert d["pivots/frac"] == 0.0
    assert d["response_length/mean"] == 1.5 and d["response_length/max"] == 2
    assert d["groups/zero_var_frac"] == 0.0
    batch = make_batch([1, 1, 0, 1], [0, 0, 1, 1], [3, 1, 1, 1], entropies=[[0, 0, 9], [0], [1], [1]])
    d = estimator_diagnostics(batch, compute_advantages("grpo", batch))
    assert d["groups/zero_var_frac"] == 0.5
    # group 0: entropies [0,0,9,0]: mean 2.25, std 4.5 -> z(9) = 1.5 > 1: one pivot out of 6 tokens
    assert d["pivots/frac"] == pytest.approx(1 / 6)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_float64_in_float64_out_and_float32_in_float32_out(name: str) -> None:
    for dtype in (torch.float64, torch.float32):
        adv = compute_advantages(name, random_batch(dtype=dtype))
        assert adv.dtype == dtype and adv.shape == (12, 9)


def test_bfloat16_logprobs_are_promoted_with_float32_rewards() -> None:
    b = random_batch(dtype=torch.float32)
    half = replace(b, old_logprobs=b.old_logprobs.bfloat16(), ref_logprobs=b.ref_logprobs.bfloat16(),
                   entropies=b.entropies.bfloat16())
    assert compute_advantages("erpo", half).dtype == torch.float32


def test_ep_grpo_singleton_group_takes_the_zero_variance_anchor() -> None:
    """A group of one response has trivially equal rewards: d = sgn(r − θ_r), while Â keeps GRPO's
    singleton convention (mean 0, std 1)."""
    entropies = [[0.5, 1.0, 2.0]]
    old, ref = [[-1.0, -0.2, -0.5]], [[-0.4, -0.9, -0.5]]
    for reward, sign in ((0.0, -1.0), (1.0, 1.0)):
        batch = make_batch([reward], [0], [3], entropies=entropies, old=old, ref=ref)
        ep = compute_advantages("ep_grpo", batch, gate=False, buckets=False)
        s_tilde = compute_advantages("ep_grpo", batch, gate=False, buckets=False, anchor=False) - reward / (1 + 1e-6)
        assert s_tilde.abs().sum() > 0.1
        torch.testing.assert_close(ep, reward / (1 + 1e-6) + sign * s_tilde)
    # ERPO has no fallback: a singleton with r = 0 has Â = 0, so d = sgn(Â) = 0 and A = 0
    batch = make_batch([0.0], [0], [3], entropies=entropies, old=old, ref=ref)
    assert torch.equal(compute_advantages("erpo", batch, gate=False), torch.zeros(1, 3, dtype=torch.float64))
