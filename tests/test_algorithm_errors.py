"""Every bad input raises ValueError naming the problem."""

from __future__ import annotations

import pytest
import torch

from algo_helpers import random_batch
from pivotrl.algorithms import (
    TokenBatch,
    compute_advantages,
    compute_policy_loss,
    estimator_requirements,
    loss_requirements,
    register_estimator,
    register_policy_loss,
)
from pivotrl.algorithms.registry import ESTIMATORS, POLICY_LOSSES

B = random_batch()
N, T = B.old_logprobs.shape


def fields(**over: object) -> dict[str, object]:
    base = dict(rewards=B.rewards, group_index=B.group_index, response_mask=B.response_mask,
                old_logprobs=B.old_logprobs, ref_logprobs=B.ref_logprobs, entropies=B.entropies)
    return {**base, **over}


@pytest.mark.parametrize("over,match", [
    ({"rewards": B.rewards[:-1]}, "group_index must have shape"),
    ({"rewards": B.rewards.unsqueeze(1)}, "rewards must be a 1-D"),
    ({"rewards": torch.ones(N, dtype=torch.long)}, "rewards must be floating"),
    ({"rewards": torch.full((N,), float("nan"), dtype=torch.float64)}, "rewards contain NaN"),
    ({"group_index": B.group_index.double()}, "group_index must be an integer"),
    ({"response_mask": B.response_mask[:, :-1]}, "old_logprobs must have the shape"),
    ({"response_mask": B.response_mask.long() * 2}, "response_mask must be bool or contain only 0 and 1"),
    ({"old_logprobs": B.old_logprobs[:, :-1]}, "old_logprobs must have the shape"),
    ({"old_logprobs": B.old_logprobs.long()}, "old_logprobs must be floating"),
    ({"entropies": torch.full((N, T), float("nan"), dtype=torch.float64)}, "entropies has NaN"),
    ({"ref_logprobs": torch.zeros(N, T + 1, dtype=torch.float64)}, "ref_logprobs must have the shape"),
])
def test_token_batch_rejects(over: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TokenBatch(**fields(**over))


def test_nan_at_padding_is_ignored() -> None:
    old = torch.where(B.response_mask, B.old_logprobs, float("nan"))
    batch = TokenBatch(**fields(old_logprobs=old))
    assert torch.isfinite(compute_advantages("erpo", batch)).all()


def test_int_mask_is_accepted() -> None:
    batch = TokenBatch(**fields(response_mask=B.response_mask.int()))
    assert batch.response_mask.dtype == torch.bool


def test_unknown_estimator_and_hyperparameter() -> None:
    with pytest.raises(ValueError, match="unknown estimator 'erp'.*did you mean 'erpo'"):
        compute_advantages("erp", B)
    with pytest.raises(ValueError, match="no hyperparameter 'gama'.*did you mean 'gamma'"):
        compute_advantages("erpo", B, gama=1.0)
    with pytest.raises(ValueError, match="unknown policy loss 'ppo2'"):
        compute_policy_loss("ppo2", B, advantages=B.old_logprobs, logprobs=B.old_logprobs)
    with pytest.raises(ValueError, match="no hyperparameter 'block'"):
        compute_policy_loss("mpo", B, advantages=B.old_logprobs, logprobs=B.old_logprobs, block=3)


@pytest.mark.parametrize("name,hp,missing", [
    ("erpo", {}, "ref_logprobs"), ("erpo", {"eta": 0.0}, "entropies"), ("ep_grpo", {}, "entropies"),
    ("high_entropy", {}, "entropies"), ("entropy_shaping", {}, "entropies"), ("gtpo", {}, "entropies"),
])
def test_missing_inputs_are_named(name: str, hp: dict[str, object], missing: str) -> None:
    bare = TokenBatch(B.rewards, B.group_index, B.response_mask, B.old_logprobs)
    assert missing in estimator_requirements(name, **hp)
    with pytest.raises(ValueError, match=missing):
        compute_advantages(name, bare, **hp)


def test_requirements_follow_hyperparameters() -> None:
    assert estimator_requirements("grpo") == frozenset()
    assert estimator_requirements("erpo", gate=False, eta=0.0) == frozenset()
    assert estimator_requirements("erpo", gate=False) == {"ref_logprobs"}
    assert estimator_requirements("ep_grpo", gate=False) == {"ref_logprobs", "entropies"}
    assert loss_requirements("ppo") == frozenset()
    assert loss_requirements("ppo", beta_kl=0.1) == {"ref_logprobs"}
    assert loss_requirements("tepo") == {"ref_logprobs", "entropies", "entropies_new"}


@pytest.mark.parametrize("name,hp,match", [
    ("erpo", {"num_buckets": 0}, "num_buckets"), ("erpo", {"progress": "time"}, "progress"),
    ("erpo", {"gate_min": 2.0}, "gate_min"), ("erpo", {"s_eps": 0.0}, "s_eps"), ("erpo", {"gamma": -1.0}, "gamma"),
    ("high_entropy", {"rho": 0.0}, "rho"), ("entropy_shaping", {"kappa": 0.0}, "kappa"),
    ("entropy_shaping", {"alpha": -1.0}, "alpha"),
])
def test_bad_estimator_hyperparameters(name: str, hp: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compute_advantages(name, B, **hp)


@pytest.mark.parametrize("kw,match", [
    ({"advantages": B.old_logprobs[:, :-1]}, "advantages must have the shape"),
    ({"logprobs": torch.full((N, T), float("nan"), dtype=torch.float64)}, "logprobs has NaN"),
    ({"logprobs": B.old_logprobs.long()}, "logprobs must be floating"),
    ({"entropies_new": torch.zeros(N, 1, dtype=torch.float64)}, "entropies_new must have the shape"),
    ({"loss_agg_mode": "mean"}, "unknown loss_agg_mode"), ({"max_len": 0}, "max_len"),
    ({"global_num_tokens": -3}, "global_num_tokens"), ({"eps_low": -0.1}, "eps_low"),
    ({"kl_estimator": "k9", "beta_kl": 0.1}, "kl_estimator"), ({"beta_kl": -1.0}, "beta_kl"),
])
def test_bad_loss_inputs(kw: dict[str, object], match: str) -> None:
    args = {"advantages": torch.ones_like(B.old_logprobs), "logprobs": B.old_logprobs.clone(), **kw}
    with pytest.raises(ValueError, match=match):
        compute_policy_loss("ppo", B, **args)


@pytest.mark.parametrize("hp,match", [({"block_size": 0}, "block_size"), ({"mode": "tiles"}, "mode"),
                                      ({"future_share": 1.5}, "future_share"), ({"future_share": 1.0}, "future_share")])
def test_bad_mpo_hyperparameters(hp: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compute_policy_loss("mpo", B, advantages=torch.ones_like(B.old_logprobs), logprobs=B.old_logprobs, **hp)


def test_batch_must_be_a_token_batch() -> None:
    with pytest.raises(ValueError, match="TokenBatch"):
        compute_advantages("grpo", {"rewards": B.rewards})


def test_user_registered_estimator_and_loss_work_without_editing_the_package() -> None:
    @register_estimator("test_sign", requires=("entropies",))
    def sign_estimator(batch: TokenBatch, *, scale: float = 2.0) -> torch.Tensor:
        return scale * torch.sign(batch.rewards - 0.5).unsqueeze(1).expand_as(batch.old_logprobs)

    @register_policy_loss("test_linear")
    def linear_loss(batch, advantages, logprobs, entropies_new=None, *, weight: float = 1.0):
        return -weight * advantages * logprobs, {}

    try:
        adv = compute_advantages("test_sign", B, scale=3.0)
        assert torch.all(adv[~B.response_mask] == 0) and set(adv[B.response_mask].abs().tolist()) <= {3.0}
        with pytest.raises(ValueError, match="no hyperparameter"):
            compute_advantages("test_sign", B, scal=3.0)
        loss, metrics = compute_policy_loss("test_linear", B, advantages=adv, logprobs=B.old_logprobs)
        assert metrics["loss"] == pytest.approx(float(loss))
    finally:
        ESTIMATORS.remove("test_sign")
        POLICY_LOSSES.remove("test_linear")
