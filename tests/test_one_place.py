"""One declaration per concept: a TokenBatch or Rollout field, a registry name, the engine contract."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from pivotrl.algorithms import TokenBatch, compute_advantages, register_estimator
from pivotrl.algorithms.batch import optional_field, optional_fields
from pivotrl.algorithms.registry import ESTIMATORS, POLICY_LOSSES, register_policy_loss
from pivotrl.rollout.base import Rollout, RolloutEngine, concat_rollouts, row_fields, select_rows
from pivotrl.rollout.hf import HFEngine
from pivotrl.rollout.vllm import VLLMEngine


@dataclass(frozen=True)
class ScoredBatch(TokenBatch):
    """A TokenBatch with one more optional field, declared once."""

    token_scores: Tensor | None = optional_field("a per-token score")


def small_batch(cls=TokenBatch, **extra) -> TokenBatch:
    n, t = 4, 3
    return cls(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), group_index=torch.tensor([0, 0, 1, 1]),
               response_mask=torch.ones(n, t, dtype=torch.bool), old_logprobs=-torch.rand(n, t), **extra)


def test_a_new_batch_field_is_validated_selected_and_named_from_its_one_declaration() -> None:
    scores = torch.arange(12.0).view(4, 3)
    batch = small_batch(ScoredBatch, token_scores=scores)
    assert optional_fields(batch)["token_scores"] == "a per-token score"
    assert "token_scores" not in optional_fields(TokenBatch)
    picked = batch.select(torch.tensor([3, 1]))
    assert type(picked) is ScoredBatch and torch.equal(picked.token_scores, scores[[3, 1]])
    assert torch.equal(picked.rewards, torch.tensor([0.0, 0.0]))
    with pytest.raises(ValueError, match="token_scores must have the shape"):
        small_batch(ScoredBatch, token_scores=torch.zeros(4, 2))

    @register_estimator("test_reads_scores", requires=("token_scores",))
    def reads_scores(b: TokenBatch) -> Tensor:
        return b.field("token_scores", "test_reads_scores")

    try:
        assert torch.equal(compute_advantages("test_reads_scores", batch), scores)
        with pytest.raises(ValueError, match=r"needs token_scores \(a per-token score\), which the batch does not"):
            compute_advantages("test_reads_scores", small_batch(ScoredBatch))
    finally:
        ESTIMATORS.remove("test_reads_scores")


@dataclass
class TaggedRollout(Rollout):
    tags: list[str] | None = None  # declared without a layout: not per-row, kept as is


def rollout(group_size: int, prompts: int, width: int, seed: int) -> Rollout:
    g = torch.Generator().manual_seed(seed)
    rows = group_size * prompts
    return Rollout(torch.randint(3, 9, (rows, 2), generator=g), torch.ones(rows, 2, dtype=torch.bool),
                   torch.randint(3, 9, (rows, width), generator=g), torch.ones(rows, width, dtype=torch.bool),
                   [f"r{seed}-{i}" for i in range(rows)], torch.zeros(rows, dtype=torch.bool),
                   group_size=group_size, sampler_logprobs=-torch.rand(rows, width, generator=g))


def test_rollout_rows_are_selected_and_joined_from_the_field_declarations() -> None:
    assert set(row_fields(Rollout)) == {"prompt_ids", "prompt_mask", "response_ids", "response_mask", "texts",
                                        "truncated", "sampler_logprobs", "group_index"}
    a, b = rollout(2, 2, 3, seed=0), rollout(3, 1, 5, seed=1)
    joined = concat_rollouts([a, b], pad_id=0)
    assert joined.group_index.tolist() == [0, 0, 1, 1, 2, 2, 2] and joined.group_size == 0
    assert joined.response_ids.shape == (7, 5) and not joined.response_mask[:4, 3:].any()
    assert torch.equal(joined.sampler_logprobs[4:], b.sampler_logprobs) and (joined.sampler_logprobs[:4, 3:] == 0).all()
    picked = select_rows(joined, torch.tensor([5, 1]))
    assert picked.texts == ["r1-1", "r0-1"] and picked.group_index.tolist() == [2, 0]
    assert torch.equal(picked.response_ids[0], b.response_ids[1])
    tagged = TaggedRollout(*[getattr(a, n) for n in ("prompt_ids", "prompt_mask", "response_ids", "response_mask",
                                                      "texts", "truncated")], group_size=2, tags=["x"])
    assert type(select_rows(tagged, torch.tensor([0]))) is TaggedRollout


def test_a_taken_name_is_refused_naming_it_unless_replaced() -> None:
    with pytest.raises(ValueError, match=r"estimator 'grpo' is already registered \(pivotrl\.algorithms\.baselines"):
        register_estimator("grpo")(lambda batch: batch.old_logprobs)
    with pytest.raises(ValueError, match="policy loss 'ppo' is already registered"):
        register_policy_loss("ppo")(lambda *a: None)
    original = ESTIMATORS["grpo"]

    @register_estimator("test_twice")
    def first(batch: TokenBatch) -> Tensor:
        return torch.zeros_like(batch.old_logprobs)

    try:
        @register_estimator("test_twice", replace=True)
        def second(batch: TokenBatch) -> Tensor:
            return torch.ones_like(batch.old_logprobs)

        assert (compute_advantages("test_twice", small_batch()) == 1).all()
    finally:
        ESTIMATORS.remove("test_twice")
    assert ESTIMATORS["grpo"] is original and "test_twice" not in ESTIMATORS
    with pytest.raises(ValueError, match="unknown policy loss 'pp' \\(did you mean 'ppo'"):
        POLICY_LOSSES.lookup("pp")


def protocol_methods() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(RolloutEngine).items()
            if callable(fn) and not name.startswith("_")}


@pytest.mark.parametrize("engine", [HFEngine, VLLMEngine])
def test_both_engines_implement_every_method_of_the_contract(engine: type) -> None:
    methods = protocol_methods()
    assert {"generate", "generate_from_ids", "sync_weights"} <= set(methods)
    for name, signature in methods.items():
        ours = inspect.signature(getattr(engine, name))
        assert list(ours.parameters) == list(signature.parameters), (engine.__name__, name)
    assert "tokenizer" in RolloutEngine.__annotations__
    assert "self.tokenizer = " in inspect.getsource(engine.__init__).replace("self.model, self.tokenizer", "self.tokenizer")


def test_the_callers_of_an_engine_use_only_the_contract() -> None:
    """credit, its ground truth (values) and analyze call nothing on an engine the protocol does not declare."""
    import re

    from pivotrl.analysis import credit, pivots, values

    declared = set(protocol_methods()) | set(RolloutEngine.__annotations__)
    for module in (credit, values, pivots):
        used = set(re.findall(r"\bengine\.(\w+)", inspect.getsource(module)))
        assert used and used <= declared, (module.__name__, used - declared)


def test_hf_engine_stops_each_prompt_at_its_own_limit() -> None:
    from pivotrl.modeling.policy import load_policy

    model, tokenizer = load_policy("tiny-random")
    engine = HFEngine(model, tokenizer)
    ids, mask = engine.encode_prompts(["Use 3 5 7 to make 8", "Use 1 2 to make 3"])
    out = engine.generate_from_ids(ids, mask, 3, max_new_tokens=torch.tensor([2, 7]),
                                   generator=torch.Generator().manual_seed(0))
    lengths = out.response_mask.sum(dim=1)
    assert (lengths[:3] <= 2).all() and (lengths[3:] <= 7).all() and int(lengths.max()) <= 7
    eos = tokenizer.eos_token_id
    ended = (out.response_ids == eos).any(dim=1)
    assert torch.equal(out.truncated, ~ended)
    assert (lengths[:3][~ended[:3]] == 2).all() and (lengths[3:][~ended[3:]] == 7).all()


def test_batches_are_joined_from_the_field_declarations() -> None:
    from pivotrl.algorithms.batch import concat_batches

    a = small_batch(ScoredBatch, token_scores=torch.ones(4, 3))
    wide = ScoredBatch(rewards=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 0]),
                       response_mask=torch.ones(2, 5, dtype=torch.bool), old_logprobs=-torch.ones(2, 5),
                       token_scores=torch.full((2, 5), 2.0))
    joined = concat_batches([a, wide])
    assert type(joined) is ScoredBatch and joined.response_mask.shape == (6, 5)
    assert joined.group_index.tolist() == [0, 0, 1, 1, 2, 2]  # the second batch's group 0 stays its own
    assert not joined.response_mask[:4, 3:].any() and (joined.token_scores[4:] == 2).all()
    with pytest.raises(ValueError, match="token_scores is in some of the batches"):
        concat_batches([a, small_batch(ScoredBatch)])
    # NaN means "no pivot" for pivot_values: a batch without them joins with NaN there
    values = torch.full((4, 3), torch.nan)
    values[0, 1] = 0.5
    mixed = concat_batches([small_batch(pivot_values=values), small_batch()])
    assert mixed.pivot_values[:4].nan_to_num(-1).tolist() == values.nan_to_num(-1).tolist()
    assert mixed.pivot_values[4:].isnan().all()
