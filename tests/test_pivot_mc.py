"""pivot_mc and branching rollouts: the estimator against a loop over segments, the pivots, a task whose
outcome is decided at one known token, the trainer's budget accounting, and the named errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from algo_helpers import make_batch, random_batch
from pivotrl.algorithms import TokenBatch, compute_advantages
from pivotrl.errors import ConfigError
from pivotrl.rollout.base import Rollout, left_pad
from pivotrl.rollout.branching import branch_and_value, pick_pivots
from pivotrl.train.checks import check_algorithm
from pivotrl.train.config import load_config
from pivotrl.train.recipes import recipe_path
from pivotrl.train.trainer import Trainer


def pivot_mc_loop(batch: TokenBatch, norm_by_std: bool = True) -> torch.Tensor:
    """The definition, one response and one segment at a time."""
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float64)
    rewards = batch.rewards.double()
    for i in range(batch.num_responses):
        group = [j for j in range(batch.num_responses) if batch.group_index[j] == batch.group_index[i]]
        values = [float(rewards[j]) for j in group]
        mean = sum(values) / len(values) if len(values) > 1 else 0.0
        std = (math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 1.0)
        valid = [t for t in range(batch.response_mask.shape[1]) if batch.response_mask[i, t]]
        cuts = [(t, float(batch.pivot_values[i, t])) for t in valid if not math.isnan(float(batch.pivot_values[i, t]))]
        bounds = [(-1, mean), *cuts, (batch.response_mask.shape[1], float(rewards[i]))]
        for (start, v_start), (end, v_end) in zip(bounds, bounds[1:], strict=False):
            for t in valid:
                if max(start, 0) <= t < end:
                    a = v_end - v_start
                    out[i, t] = a / (std + 1e-6) if norm_by_std and std > 0 else a
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_pivot_mc_equals_the_segment_loop(seed: int, norm_by_std: bool) -> None:
    batch = random_batch(n_groups=3, group_size=4, width=11, seed=seed, binary=seed % 2 == 0)
    expected = pivot_mc_loop(batch, norm_by_std)
    torch.testing.assert_close(compute_advantages("pivot_mc", batch, norm_by_std=norm_by_std), expected,
                               atol=1e-9, rtol=1e-9)


def test_pivot_mc_by_hand() -> None:
    # group of two: rewards 1 and 0 (mean 0.5, std 0.7071); response 0 cut at t=2 with V̂ 0.75
    batch = make_batch([1.0, 0.0], [0, 0], [4, 3])
    batch = replace(batch, pivot_values=torch.tensor([[math.nan, math.nan, 0.75, math.nan], [math.nan] * 4]))
    adv = compute_advantages("pivot_mc", batch, norm_by_std=False)
    assert adv.tolist() == [[0.25, 0.25, 0.25, 0.25], [-0.5, -0.5, -0.5, 0.0]]
    # the segment after the cut carries r − V̂ = 0.25, the one before V̂ − mean = 0.25; no cut: r − mean
    # all-equal group: no division by its zero std
    same = replace(batch, rewards=torch.tensor([0.0, 0.0], dtype=torch.float64))
    assert compute_advantages("pivot_mc", same).tolist()[0] == [0.75, 0.75, -0.75, -0.75]


def test_without_cuts_pivot_mc_is_grpo() -> None:
    batch = random_batch(n_groups=2, group_size=4, width=7, seed=3)
    no_cuts = replace(batch, pivot_values=torch.full_like(batch.old_logprobs, math.nan))
    torch.testing.assert_close(compute_advantages("pivot_mc", no_cuts), compute_advantages("grpo", no_cuts))


def test_pivot_mc_without_branch_values_gets_the_named_error() -> None:
    batch = make_batch([1.0, 0.0], [0, 0], [2, 2])
    with pytest.raises(ValueError, match=r"estimator 'pivot_mc' needs pivot_values \(V̂ before each pivot token"):
        compute_advantages("pivot_mc", batch)
    with pytest.raises(ValueError, match="pivot_values has inf"):
        replace(batch, pivot_values=torch.tensor([[math.inf, math.nan], [math.nan, math.nan]]))


def test_pivots_are_the_highest_entropy_tokens_spaced_apart() -> None:
    entropies = torch.tensor([[9.0, 1.0, 5.0, 4.9, 0.1, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[True] * 7, [True, True, True, False, False, False, False]])
    picked = pick_pivots(entropies, mask, count=3, spacing=2)
    # position 0 is never a pivot; 5.0 at 2; 4.9 at 3 and 1.0 at 1 are too close to it; 3.0 at 5; then none
    assert picked[0].tolist() == [2, 5, -1]
    assert picked[1].tolist() == [1, -1, -1]  # ties go to the earliest; the rest is within the spacing or padding
    assert pick_pivots(entropies, mask, count=0, spacing=1).shape == (2, 0)


class ForkEngine:
    """A constructed policy: responses of LENGTH tokens, 'a' everywhere except at position FORK, where it
    draws 'A' or 'B' with equal odds; 'A' there is the right answer. Implements the engine contract."""

    FORK, LENGTH = 3, 8

    def __init__(self, prompt: str) -> None:
        from pivotrl.modeling.tokenizer import build_char_tokenizer

        self.tokenizer = build_char_tokenizer()
        self.prompt_length = len(self.tokenizer.encode(prompt))
        self.a, self.A, self.B = (self.tokenizer.convert_tokens_to_ids(c) for c in "aAB")

    def generate(self, prompts, num_samples, *, max_new_tokens, temperature=1.0, top_p=1.0, generator=None):
        ids, mask = left_pad([self.tokenizer.encode(p) for p in prompts], self.tokenizer.pad_token_id)
        return self.generate_from_ids(ids, mask, num_samples, max_new_tokens=max_new_tokens, generator=generator)

    def generate_from_ids(self, prompt_ids, prompt_mask, num_samples=1, *, max_new_tokens, temperature=1.0,
                          top_p=1.0, generator=None):
        limits = torch.as_tensor(max_new_tokens).expand(len(prompt_ids)).repeat_interleave(num_samples)
        prompt_ids = prompt_ids.repeat_interleave(num_samples, 0)
        prompt_mask = prompt_mask.repeat_interleave(num_samples, 0)
        # how far into its response each row already is: its prompt's length beyond the bare prompt
        done = prompt_mask.sum(dim=1) - self.prompt_length
        rows, width = len(prompt_ids), int((self.LENGTH - done).max())
        response = torch.full((rows, width), self.a)
        draws = torch.rand(rows, generator=generator) < 0.5
        for r in range(rows):
            at = self.FORK - int(done[r])
            if 0 <= at < width:
                response[r, at] = self.A if draws[r] else self.B
        length = torch.minimum(self.LENGTH - done, limits)
        mask = torch.arange(width) < length.unsqueeze(1)
        response = torch.where(mask, response, self.tokenizer.pad_token_id)
        texts = self.tokenizer.batch_decode(response, skip_special_tokens=True)
        return Rollout(prompt_ids, prompt_mask, response, mask, texts, torch.ones(rows, dtype=torch.bool),
                       group_size=num_samples)

    def sync_weights(self) -> None:
        pass

    def entropies(self, rollout: Rollout) -> torch.Tensor:
        """The policy's entropy at every token: log 2 at the fork, 0 elsewhere."""
        h = torch.zeros(rollout.response_mask.shape)
        h[:, self.FORK] = math.log(2)
        return h


def test_pivot_mc_puts_the_largest_credit_on_the_segment_of_the_deciding_token() -> None:
    prompt = "Use 1 2 to make 3"
    engine = ForkEngine(prompt)
    generator = torch.Generator().manual_seed(0)
    rollout = engine.generate([prompt] * 4, 8, max_new_tokens=ForkEngine.LENGTH, generator=generator)
    rewards = torch.tensor([1.0 if "A" in text else 0.0 for text in rollout.texts])
    assert 0 < rewards.mean() < 1

    def reward_of(parents, texts, lengths):
        return torch.tensor([1.0 if "A" in text else 0.0 for text in texts])

    values, branches, _ = branch_and_value(engine, rollout, engine.entropies(rollout), rewards, reward_of, pivots=2,
                                           spacing=2, branches=16, max_new_tokens=ForkEngine.LENGTH,
                                           temperature=1.0, top_p=1.0, generator=generator)
    assert branches is not None and branches.tokens > 0
    fork = ForkEngine.FORK
    assert (~values[:, fork].isnan()).all()  # the fork is every response's first pivot
    batch = TokenBatch(rewards, rollout.group_index, rollout.response_mask, torch.zeros(rollout.response_mask.shape),
                       pivot_values=values)
    adv = compute_advantages("pivot_mc", batch).abs()
    on_fork_segment = adv[:, fork:].mean()
    before = adv[:, :fork].mean()
    assert on_fork_segment > 3 * before, (float(on_fork_segment), float(before))
    assert int(adv.mean(dim=0).argmax()) >= fork
    # V̂ at the fork is about 1/2: the K branches redraw the deciding token
    assert abs(float(values[:, fork].mean()) - 0.5) < 0.1


def smoke(tmp_path: Path, *overrides: str):
    return load_config(recipe_path("smoke"), [f"output_dir={tmp_path}", "eval.before_after=false", *overrides])


@pytest.mark.parametrize("train_on_branches", [False, True])
def test_the_trainer_branches_and_counts_every_sampled_token(tmp_path: Path, train_on_branches: bool) -> None:
    cfg = smoke(tmp_path, "algorithm.estimator=pivot_mc", "rollout.branch.pivots=2", "rollout.branch.branches=2",
                f"rollout.branch.train_on_branches={str(train_on_branches).lower()}", "train.max_steps=2")
    Trainer(cfg).run()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    for r in records:
        assert r["rollout/branch_tokens"] > 0 and r["time/branch_s"] > 0
        assert r["rollout/tokens_generated"] > r["rollout/branch_tokens"]
        assert (r["rollout/rows"] > rows) == train_on_branches
        if train_on_branches:
            assert r["rollout/rows"] == rows + r["rollout/branch_rows_trained"]


def test_grpo_logs_its_generated_tokens_and_no_branches(tmp_path: Path) -> None:
    Trainer(smoke(tmp_path, "algorithm.estimator=grpo", "train.max_steps=1")).run()
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert record["rollout/tokens_generated"] > 0 and "rollout/branch_tokens" not in record


def test_pivot_mc_without_branching_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.branch\.pivots is 0: set rollout\.branch\.pivots >= 1"):
        check_algorithm(load_config(None, ["algorithm.estimator=pivot_mc"]))


def test_the_shipped_recipe_branches() -> None:
    cfg = load_config(recipe_path("pivot_mc"), [])
    assert cfg.algorithm.estimator == "pivot_mc" and cfg.rollout.branch.pivots >= 1
    check_algorithm(cfg)
