"""Property tests (hypothesis) and a loop-by-loop reference for ERPO / EP-GRPO."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algo_helpers import random_batch
from pivotrl.algorithms import ESTIMATORS, TokenBatch, compute_advantages

PROFILE = settings(max_examples=25, deadline=None)
batches = st.builds(
    random_batch,
    n_groups=st.integers(1, 4),
    group_size=st.integers(1, 5),
    width=st.integers(1, 8),
    seed=st.integers(0, 10_000),
    binary=st.booleans(),
)


def permuted(batch: TokenBatch, perm: torch.Tensor) -> TokenBatch:
    return batch.select(perm)


@PROFILE
@given(batch=batches)
def test_padding_is_exactly_zero(batch: TokenBatch) -> None:
    for name in ESTIMATORS:
        adv = compute_advantages(name, batch)
        assert torch.all(adv[~batch.response_mask] == 0), name
        assert torch.isfinite(adv).all(), name


@PROFILE
@given(batch=batches, seed=st.integers(0, 1000))
def test_permuting_responses_permutes_the_output(batch: TokenBatch, seed: int) -> None:
    perm = torch.randperm(batch.num_responses, generator=torch.Generator().manual_seed(seed))
    for name in ESTIMATORS:
        # high_entropy's batch quantile is permutation invariant too
        torch.testing.assert_close(compute_advantages(name, permuted(batch, perm)), compute_advantages(name, batch)[perm],
                                   atol=1e-10, rtol=1e-10, msg=name)


@PROFILE
@given(batch=batches)
def test_erpo_without_gate_and_process_term_is_grpo(batch: TokenBatch) -> None:
    for name in ("erpo", "ep_grpo"):
        assert torch.equal(compute_advantages(name, batch, gate=False, eta=0.0), compute_advantages("grpo", batch))


@PROFILE
@given(batch=batches, gamma=st.floats(0, 10), gate_min=st.floats(0, 1))
def test_gate_preserves_each_response_advantage_sum(batch: TokenBatch, gamma: float, gate_min: float) -> None:
    gated = compute_advantages("erpo", batch, eta=0.0, gamma=gamma, gate_min=gate_min)
    grpo = compute_advantages("grpo", batch)
    torch.testing.assert_close(gated.sum(dim=1), grpo.sum(dim=1), atol=1e-9, rtol=1e-9)


@PROFILE
@given(batch=batches, reward=st.sampled_from([0.0, 1.0]))
def test_all_equal_group_gives_erpo_exactly_zero(batch: TokenBatch, reward: float) -> None:
    # one group of >= 2 responses (a singleton keeps the mean-0 / std-1 convention)
    if batch.num_responses < 2:
        return
    same = replace(batch, rewards=torch.full_like(batch.rewards, reward), group_index=torch.zeros_like(batch.group_index))
    assert torch.equal(compute_advantages("erpo", same), torch.zeros_like(same.old_logprobs))
    # EP-GRPO's fallback anchor: the process term's sign follows sgn(r - 0.5) times s̃ (never the opposite)
    ep = compute_advantages("ep_grpo", same, gate=False)
    s_tilde = compute_advantages("ep_grpo", same, gate=False, anchor=False)
    torch.testing.assert_close(ep, s_tilde * (1.0 if reward > 0.5 else -1.0))


def test_ep_grpo_all_correct_group_is_nonzero() -> None:
    batch = random_batch(n_groups=1, group_size=8, width=40, seed=1)
    ones = replace(batch, rewards=torch.ones(8, dtype=torch.float64))
    assert compute_advantages("ep_grpo", ones).abs().sum() > 1.0
    assert torch.equal(compute_advantages("erpo", ones), torch.zeros_like(ones.old_logprobs))


def erpo_reference(batch: TokenBatch, gamma=5.0, beta_p=0.1, K=10, eta=0.2, s_eps=1e-4, theta_r=0.5,
                   progress="position", fallback=False) -> list[list[float]]:
    """ALGORITHMS.md's ERPO/EP-GRPO written out with Python loops, for comparison only."""
    n, width = batch.response_mask.shape
    mask = batch.response_mask.tolist()
    r = batch.rewards.tolist()
    g = batch.group_index.tolist()
    H, old, ref = batch.entropies.tolist(), batch.old_logprobs.tolist(), batch.ref_logprobs.tolist()
    groups = {k: [i for i in range(n) if g[i] == k] for k in set(g)}
    seq, direction, W = [0.0] * n, [0.0] * n, [[0.0] * width for _ in range(n)]
    bucket = [[0] * width for _ in range(n)]
    for members in groups.values():
        rs = [r[i] for i in members]
        equal = len(members) >= 2 and len(set(rs)) == 1
        mean = statistics.mean(rs) if len(members) > 1 else 0.0
        std = statistics.stdev(rs) if len(members) > 1 else 1.0
        hs = [H[i][t] for i in members for t in range(width) if mask[i][t]]
        for i in members:
            seq[i] = 0.0 if equal else (r[i] - mean) / (std + 1e-6)
            # a singleton's rewards are trivially all equal: EP-GRPO's fallback applies there too
            direction[i] = (math.copysign(1, r[i] - theta_r) if r[i] != theta_r else 0.0) if (
                fallback and (equal or len(members) == 1)) else (
                0.0 if seq[i] == 0 else math.copysign(1, seq[i]))
            valid = [t for t in range(width) if mask[i][t]]
            for t in valid:
                z = (H[i][t] - statistics.mean(hs)) / (statistics.stdev(hs) + 1e-6) if len(hs) >= 2 else 0.0
                W[i][t] = 1 / (1 + math.exp(-gamma * z))
            total = sum(H[i][t] for t in valid)
            running = 0.0
            for k, t in enumerate(valid):
                running += H[i][t]
                if progress == "cumulative_entropy" and total > 0:
                    bucket[i][t] = min(math.floor(K * running / total), K - 1)
                else:
                    bucket[i][t] = (K * k) // len(valid)
    out = [[0.0] * width for _ in range(n)]
    for members in groups.values():
        cells: dict[int, list[float]] = {}
        for i in members:
            for t in range(width):
                if mask[i][t]:
                    cells.setdefault(bucket[i][t], []).append(beta_p * (old[i][t] - ref[i][t]))
        for i in members:
            valid = [t for t in range(width) if mask[i][t]]
            mean_w = sum(W[i][t] for t in valid) / len(valid) if valid else 1.0
            for t in valid:
                cell = cells[bucket[i][t]]
                s = beta_p * (old[i][t] - ref[i][t])
                s_tilde = (s - statistics.mean(cell)) / (statistics.stdev(cell) + s_eps) if len(cell) >= 2 else 0.0
                out[i][t] = seq[i] * W[i][t] / mean_w + eta * W[i][t] * direction[i] * s_tilde
    return out


@PROFILE
@given(batch=batches, K=st.integers(1, 4))
def test_erpo_and_ep_grpo_match_the_loop_reference(batch: TokenBatch, K: int) -> None:
    expected = torch.tensor(erpo_reference(batch, K=K), dtype=torch.float64)
    torch.testing.assert_close(compute_advantages("erpo", batch, num_buckets=K), expected, atol=1e-9, rtol=1e-9)
    expected = torch.tensor(erpo_reference(batch, K=K, progress="cumulative_entropy", fallback=True), dtype=torch.float64)
    torch.testing.assert_close(compute_advantages("ep_grpo", batch, num_buckets=K), expected, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_group_labels_need_not_be_contiguous(name: str) -> None:
    batch = random_batch(seed=4)
    relabelled = replace(batch, group_index=batch.group_index * 1000 - 7)
    assert torch.equal(compute_advantages(name, relabelled), compute_advantages(name, batch))


def test_masked_quantile_large_equals_torch_quantile() -> None:
    from pivotrl.algorithms.stats import masked_quantile

    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 700, generator=g, dtype=torch.float64)
    mask = torch.rand(300, 700, generator=g) < 0.7
    for q in (0.0, 0.1, 0.8, 0.95, 1.0):
        torch.testing.assert_close(masked_quantile(x, mask, q), torch.quantile(x[mask], q), rtol=0, atol=1e-12)


def test_group_zscore_equals_a_per_group_loop_and_leaves_its_input() -> None:
    from pivotrl.algorithms.stats import group_zscore

    g = torch.Generator().manual_seed(2)
    mask = torch.rand(16, 12, generator=g) < 0.8
    mask[12:] = False
    mask[12, 3] = True  # a group with a single valid token: z = 0
    x = torch.where(mask, torch.randn(16, 12, generator=g, dtype=torch.float64), 0.0)
    gid = torch.arange(16) // 4
    original = x.clone()
    z = group_zscore(x, mask, gid, 4)
    assert torch.equal(x, original)
    for group in range(4):
        rows = gid == group
        values = x[rows][mask[rows]]
        expected = (x[rows] - values.mean()) / (values.std() + 1e-6) if values.numel() >= 2 else torch.zeros_like(x[rows])
        torch.testing.assert_close(z[rows], torch.where(mask[rows], expected, 0.0), rtol=1e-12, atol=1e-12)


def with_mask(batch: TokenBatch, mask: torch.Tensor, padding: float = 0.0) -> TokenBatch:
    """batch with another mask; the token fields hold `padding` (e.g. NaN) off the mask."""
    def fill(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else torch.where(mask, x, padding)
    return replace(batch, response_mask=mask, old_logprobs=fill(batch.old_logprobs), ref_logprobs=fill(batch.ref_logprobs),
                   entropies=fill(batch.entropies), pivot_values=fill(batch.pivot_values))


def holed(batch: TokenBatch, seed: int) -> TokenBatch:
    """The same batch with random holes in its masks (valid tokens no longer a prefix)."""
    g = torch.Generator().manual_seed(seed)
    return with_mask(batch, batch.response_mask & (torch.rand(batch.response_mask.shape, generator=g) < 0.7))


@PROFILE
@given(batch=batches, K=st.integers(1, 4), seed=st.integers(0, 1000))
def test_erpo_and_ep_grpo_match_the_loop_reference_with_holes_in_the_mask(batch: TokenBatch, K: int, seed: int) -> None:
    batch = holed(batch, seed)
    expected = torch.tensor(erpo_reference(batch, K=K), dtype=torch.float64)
    torch.testing.assert_close(compute_advantages("erpo", batch, num_buckets=K), expected, atol=1e-9, rtol=1e-9)
    expected = torch.tensor(erpo_reference(batch, K=K, progress="cumulative_entropy", fallback=True), dtype=torch.float64)
    torch.testing.assert_close(compute_advantages("ep_grpo", batch, num_buckets=K), expected, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("width", [37, 64])
def test_erpo_and_ep_grpo_on_long_responses_match_the_loop_reference(width: int) -> None:
    batch = random_batch(n_groups=3, group_size=4, width=width, seed=5)
    for b in (batch, holed(batch, 6)):
        for kw, ref in ((dict(num_buckets=7), dict(K=7)), (dict(num_buckets=10, beta_p=-0.3), dict(K=10, beta_p=-0.3))):
            expected = torch.tensor(erpo_reference(b, **ref), dtype=torch.float64)
            torch.testing.assert_close(compute_advantages("erpo", b, **kw), expected, atol=1e-9, rtol=1e-9)
            expected = torch.tensor(erpo_reference(b, progress="cumulative_entropy", fallback=True, **ref),
                                    dtype=torch.float64)
            torch.testing.assert_close(compute_advantages("ep_grpo", b, **kw), expected, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_nan_padding_is_ignored(name: str) -> None:
    batch = random_batch(n_groups=3, group_size=4, width=40, seed=7)
    for b in (batch, holed(batch, 8)):
        nan = with_mask(b, b.response_mask, padding=torch.nan)
        torch.testing.assert_close(compute_advantages(name, nan), compute_advantages(name, b), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_quantile_ignores_padding_values(dtype: torch.dtype) -> None:
    from pivotrl.algorithms.stats import masked_quantile

    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, 700, generator=g, dtype=dtype)
    mask = torch.rand(300, 700, generator=g) < 0.6
    garbage = torch.where(mask, x, torch.tensor([torch.nan, torch.inf, -torch.inf, -1e30], dtype=dtype).repeat(175))
    tol = 1e-6 if dtype == torch.float32 else 1e-12  # interpolation rounds differently from torch.quantile's
    for q in (0.0, 0.2, 0.8, 1.0):
        torch.testing.assert_close(masked_quantile(garbage, mask, q), torch.quantile(x[mask], q), rtol=tol, atol=0)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@pytest.mark.parametrize("shape", [(0, 5), (4, 0), (0, 0)])
def test_empty_batches_give_empty_advantages(name: str, shape: tuple[int, int]) -> None:
    n, width = shape
    batch = TokenBatch(torch.rand(n), torch.arange(n) // 2, torch.ones(n, width, dtype=torch.bool),
                       torch.rand(n, width), torch.rand(n, width), torch.rand(n, width),
                       pivot_values=torch.full((n, width), torch.nan), free_mask=torch.zeros(n, width),
                       reachable=torch.ones(n, width))
    assert compute_advantages(name, batch).shape == shape
