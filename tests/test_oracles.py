"""The oracles (grpo_oracle, process_oracle), the token marks they read, and where credit falls (free_share)."""

from __future__ import annotations

import math

import pytest
import torch

from pivotrl.algorithms import TokenBatch, compute_advantages, estimator_diagnostics
from pivotrl.integrations import check_adaptable


def batch_with_marks(seed: int = 0, groups: int = 3, size: int = 4, width: int = 6) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    n = groups * size
    lengths = torch.randint(2, width + 1, (n,), generator=g)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    reachable = torch.ones(n, width)
    for i in range(n):  # reachable until a random step, then dead for good
        dead_from = int(torch.randint(1, width + 2, (1,), generator=g))
        reachable[i, dead_from:] = 0.0
    return TokenBatch(rewards=torch.randint(0, 2, (n,), generator=g).float(),
                      group_index=torch.arange(groups).repeat_interleave(size), response_mask=mask,
                      old_logprobs=-torch.rand(n, width, generator=g),
                      entropies=torch.rand(n, width, generator=g) * 2,
                      free_mask=(torch.rand(n, width, generator=g) < 0.5).float(), reachable=reachable)


def loop_group_stats(rewards: list[float], groups: list[int]) -> dict[int, tuple[float, float]]:
    """(mean, unbiased std) of each group's rewards, one group at a time."""
    out = {}
    for gid in set(groups):
        members = [r for r, g in zip(rewards, groups, strict=True) if g == gid]
        mean = sum(members) / len(members)
        std = math.sqrt(sum((r - mean) ** 2 for r in members) / (len(members) - 1)) if len(members) > 1 else 1.0
        out[gid] = (mean, std)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_grpo_oracle_is_grpo_with_every_free_token_zeroed(seed: int) -> None:
    batch = batch_with_marks(seed)
    grpo, oracle = compute_advantages("grpo", batch), compute_advantages("grpo_oracle", batch)
    free = batch.free_mask.bool() & batch.response_mask
    assert (oracle[free] == 0).all()
    assert torch.equal(oracle[~free], grpo[~free])


@pytest.mark.parametrize("seed", range(5))
def test_process_oracle_against_its_definition_token_by_token(seed: int) -> None:
    batch = batch_with_marks(seed)
    got = compute_advantages("process_oracle", batch)
    rewards, groups = batch.rewards.tolist(), batch.group_index.tolist()
    stats = loop_group_stats(rewards, groups)
    for i, (r, gid) in enumerate(zip(rewards, groups, strict=True)):
        mean, std = stats[gid]
        for t in range(batch.response_mask.shape[1]):
            if not batch.response_mask[i, t]:
                assert got[i, t] == 0
                continue
            baseline = mean if batch.reachable[i, t] > 0 else 0.0
            expected = (r - baseline) / (std + 1e-6) if std > 0 else r - baseline
            assert got[i, t].item() == pytest.approx(expected, rel=1e-5, abs=1e-6), (i, t)


def test_process_oracle_is_grpo_while_the_target_stays_reachable() -> None:
    batch = batch_with_marks(1)
    everywhere = TokenBatch(**{**{f: getattr(batch, f) for f in ("rewards", "group_index", "response_mask",
                                                                   "old_logprobs")},
                               "reachable": torch.ones_like(batch.old_logprobs)})
    assert torch.allclose(compute_advantages("process_oracle", everywhere), compute_advantages("grpo", everywhere))


def test_a_failed_response_gets_no_blame_after_its_target_became_unreachable() -> None:
    batch = TokenBatch(rewards=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 0]),
                       response_mask=torch.ones(2, 4, dtype=torch.bool), old_logprobs=torch.zeros(2, 4),
                       reachable=torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]]))
    adv = compute_advantages("process_oracle", batch)
    assert (adv[1, :2] < 0).all() and (adv[1, 2:] == 0).all() and (adv[0] > 0).all()


def test_free_share_is_the_share_of_credit_on_free_tokens() -> None:
    batch = batch_with_marks(2)
    for estimator in ("grpo", "grpo_oracle", "process_oracle", "high_entropy"):
        adv = compute_advantages(estimator, batch)
        got = estimator_diagnostics(batch, adv)["credit/free_share"]
        on_free = sum(abs(adv[i, t].item()) for i in range(adv.shape[0]) for t in range(adv.shape[1])
                      if batch.response_mask[i, t] and batch.free_mask[i, t] > 0)
        total = sum(abs(adv[i, t].item()) for i in range(adv.shape[0]) for t in range(adv.shape[1])
                    if batch.response_mask[i, t])
        assert got == pytest.approx(on_free / total, rel=1e-5), estimator
    assert estimator_diagnostics(batch, compute_advantages("grpo_oracle", batch))["credit/free_share"] == 0.0
    shares = estimator_diagnostics(batch, compute_advantages("grpo", batch))
    entropy = batch.entropies[batch.response_mask]
    free = batch.free_mask[batch.response_mask] > 0
    assert shares["entropy/free_share"] == pytest.approx(float(entropy[free].sum() / entropy.sum()), rel=1e-5)
    assert shares["tokens/free_frac"] == pytest.approx(float(free.float().mean()))


@pytest.mark.parametrize("engine", ["TRL", "verl"])
@pytest.mark.parametrize("oracle", ["grpo_oracle", "process_oracle"])
def test_the_adapters_refuse_the_oracles_by_name(engine: str, oracle: str) -> None:
    with pytest.raises(ValueError, match=f"'{oracle}' is an oracle, a control .* not a method"):
        check_adaptable(engine, oracle)


def test_rollout_marks_place_each_rows_marks_after_its_prefix() -> None:
    from pivotrl.modeling.tokenizer import build_char_tokenizer
    from pivotrl.rollout import Rollout
    from pivotrl.rollout.marks import TokenPieces, rollout_marks

    tokenizer = build_char_tokenizer()
    texts = ["ab1", "2c"]
    ids = [tokenizer.convert_tokens_to_ids(list(t)) for t in texts]
    response = torch.tensor([ids[0], ids[1] + [tokenizer.pad_token_id]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    rollout = Rollout(torch.ones(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.bool), response, mask,
                      texts, torch.zeros(2, dtype=torch.bool), group_size=2)
    seen = []

    def letters_are_free(pieces: list[str], row: int) -> dict[str, list[bool]]:
        seen.append("".join(pieces))
        return {"free": [p.isalpha() for p in pieces], "reachable": [True] * len(pieces)}

    prefix = tokenizer.convert_tokens_to_ids(list("x9"))
    marks = rollout_marks(rollout, TokenPieces(tokenizer), letters_are_free, prefixes=[[], prefix])
    assert seen == ["ab1", "x92c"]  # the task marks whole responses, a branch's prefix included
    assert marks["free_mask"].tolist() == [[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]]
    assert marks["reachable"].tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
