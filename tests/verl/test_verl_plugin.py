"""pivotrl inside verl 0.9.1: plugin discovery, estimators and losses through verl's registries.

Run in the verl venv: bash scripts/verl_env.sh && .venv-verl/bin/python -m pytest tests/verl
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (runs verl's plugin discovery)
from omegaconf import OmegaConf
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.ray_trainer import compute_advantage as verl_compute_advantage
from verl.workers.config import ActorConfig

from pivotrl.algorithms import TokenBatch, compute_advantages, compute_policy_loss
from pivotrl.integrations import verl as pv

ESTIMATOR_NAMES = ("grpo", "dr_grpo", "rloo", "high_entropy", "entropy_shaping", "gtpo", "erpo", "ep_grpo")
LOSS_NAMES = ("ppo", "gspo", "tepo", "mpo")


# ----------------------------------------------------------------------------- builders


def random_rollout(seed: int, sizes=(4, 4, 1, 3, 2, 5), width: int = 12, binary: bool = False):
    """uids, response_mask, token-level rewards (score on the last valid token) and token tensors."""
    g = torch.Generator().manual_seed(seed)
    uids, rows = [], []
    for k, size in enumerate(sizes):
        uids += [f"prompt-{seed}-{k}"] * size
    n = len(uids)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    if binary:
        scores = torch.randint(0, 2, (n,), generator=g).float()
    else:
        scores = torch.rand(n, generator=g) * 2 - 0.5
    # one all-equal group (zero variance), with rewards exactly representable
    scores[:4] = 1.0
    rewards = torch.zeros(n, width)
    rewards[torch.arange(n), lengths - 1] = scores
    old = -torch.rand(n, width, generator=g) * 3
    ref = old + 0.3 * torch.randn(n, width, generator=g)
    ent = torch.rand(n, width, generator=g) * 2
    del rows
    return np.array(uids, dtype=object), mask, rewards, old, ref, ent


def as_dataproto(uids, mask, rewards, **tensors) -> DataProto:
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask.long(), **tensors},
        non_tensors={"uid": uids},
    )


def algo_config(**extra):
    return OmegaConf.create({"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True, "gamma": 1.0, "lam": 1.0, **extra})


def actor_config(**kwargs) -> ActorConfig:
    base = {"strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": 1}
    return ActorConfig(**{**base, **kwargs})


# ----------------------------------------------------------------------------- discovery


def test_entry_point_is_declared():
    eps = importlib.metadata.entry_points(group="verl.plugins")
    ours = [ep for ep in eps if ep.name == "pivotrl"]
    assert ours, "pivotrl's verl.plugins entry point is missing: reinstall pivotrl (bash scripts/verl_env.sh)"
    assert ours[0].value == "pivotrl.integrations.verl"


def test_import_verl_registers_everything_by_entry_point():
    """A fresh interpreter that imports only verl ends up with pivotrl's names registered."""
    code = (
        "import json, sys, verl\n"
        "from verl.trainer.ppo import core_algos\n"
        "from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY\n"
        "print(json.dumps({'loaded': 'pivotrl.integrations.verl' in sys.modules,"
        " 'adv': sorted(k for k in core_algos.ADV_ESTIMATOR_REGISTRY if k.startswith('pivotrl_')),"
        " 'loss': sorted(k for k in core_algos.POLICY_LOSS_REGISTRY if k.startswith('pivotrl_')),"
        " 'trainers': sorted(k for k in TRAINER_REGISTRY if k.startswith('pivotrl_'))}))\n"
    )
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["loaded"]
    assert found["adv"] == sorted(f"pivotrl_{n}" for n in ESTIMATOR_NAMES)
    assert found["loss"] == sorted(f"pivotrl_{n}" for n in LOSS_NAMES)
    assert found["trainers"] == sorted(f"pivotrl_{m}" for m in pv.TRAINER_MODES)


def test_pivot_mc_is_not_offered_to_verl_and_says_why():
    """pivot_mc reads branch values, which verl's rollouts do not make: not registered, refused by name."""
    assert "pivotrl_pivot_mc" not in core_algos.ADV_ESTIMATOR_REGISTRY
    assert pv.estimator_name("pivotrl_pivot_mc") is None
    with pytest.raises(ValueError, match="reads pivot_values, which verl's rollouts do not make"):
        pv.make_adv_estimator("pivot_mc")


def test_discovery_can_be_switched_off():
    code = "import sys, verl\nprint('pivotrl.integrations.verl' in sys.modules)\n"
    env = {"VERL_USE_EXTERNAL_PLUGINS": "none", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300, check=True, env=env)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_register_is_idempotent():
    before = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    pv.register()
    assert core_algos.ADV_ESTIMATOR_REGISTRY == before


# ----------------------------------------------------------------------------- estimators vs verl's


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("norm", [True, False])
def test_pivotrl_grpo_equals_verl_grpo(seed, norm):
    uids, mask, rewards, *_ = random_rollout(seed, binary=seed % 2 == 0)
    cfg = algo_config(norm_adv_by_std_in_grpo=norm)
    ours = verl_compute_advantage(as_dataproto(uids, mask, rewards), "pivotrl_grpo", config=cfg)
    theirs = verl_compute_advantage(
        as_dataproto(uids, mask, rewards), AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=norm, config=cfg
    )
    diff = (ours.batch["advantages"] - theirs.batch["advantages"]).abs().max().item()
    assert diff <= 1e-6, diff
    assert torch.equal(ours.batch["advantages"], ours.batch["returns"])


@pytest.mark.parametrize("seed", range(6))
def test_pivotrl_rloo_equals_verl_rloo(seed):
    uids, mask, rewards, *_ = random_rollout(seed, binary=seed % 2 == 1)
    cfg = algo_config()
    ours = verl_compute_advantage(as_dataproto(uids, mask, rewards), "pivotrl_rloo", config=cfg)
    theirs = verl_compute_advantage(as_dataproto(uids, mask, rewards), AdvantageEstimator.RLOO, config=cfg)
    diff = (ours.batch["advantages"] - theirs.batch["advantages"]).abs().max().item()
    assert diff <= 1e-6, diff


def test_pivotrl_dr_grpo_equals_verl_grpo_without_std():
    uids, mask, rewards, *_ = random_rollout(3)
    cfg = algo_config()
    ours = verl_compute_advantage(as_dataproto(uids, mask, rewards), "pivotrl_dr_grpo", config=cfg)
    theirs = verl_compute_advantage(
        as_dataproto(uids, mask, rewards), AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=False, config=cfg
    )
    assert (ours.batch["advantages"] - theirs.batch["advantages"]).abs().max().item() <= 1e-6


def test_verl_grpo_amplifies_float_noise_in_equal_groups_pivotrl_does_not():
    """Convention difference: verl divides r - mean by (0 + 1e-6) in an all-equal float32 group."""
    uids = np.array(["a"] * 3, dtype=object)
    mask = torch.ones(3, 2, dtype=torch.bool)
    rewards = torch.zeros(3, 2)
    rewards[:, -1] = 0.9  # float32: mean(0.9, 0.9, 0.9) != 0.9
    cfg = algo_config()
    ours = verl_compute_advantage(as_dataproto(uids, mask, rewards), "pivotrl_grpo", config=cfg)
    theirs = verl_compute_advantage(as_dataproto(uids, mask, rewards), AdvantageEstimator.GRPO, config=cfg)
    assert ours.batch["advantages"].abs().max().item() == 0.0
    assert theirs.batch["advantages"].abs().max().item() > 1e-2  # a float32 rounding error, divided by 1e-6


# ----------------------------------------------------------------------------- token inputs reach the estimator


def direct_advantages(name, uids, mask, rewards, old, ref, ent, **hp):
    ids = {u: i for i, u in enumerate(dict.fromkeys(uids))}
    batch = TokenBatch(
        rewards=rewards.sum(-1),
        group_index=torch.tensor([ids[u] for u in uids]),
        response_mask=mask,
        old_logprobs=old,
        ref_logprobs=ref,
        entropies=ent,
    )
    return compute_advantages(name, batch, **hp)


@pytest.mark.parametrize("name", ["erpo", "ep_grpo", "high_entropy", "entropy_shaping", "gtpo"])
def test_wrapper_hands_entropies_and_logprobs_to_the_estimator(name):
    uids, mask, rewards, old, ref, ent = random_rollout(7, binary=True)
    data = as_dataproto(uids, mask, rewards, old_log_probs=old, ref_log_prob=ref, entropys=ent)
    out = pv.compute_advantage(data, f"pivotrl_{name}", config=algo_config())
    expected = direct_advantages(name, uids, mask, rewards, old, ref, ent)
    assert (out.batch["advantages"] - expected).abs().max().item() <= 1e-6
    # the entropies are really used: other entropies, other advantages
    data2 = as_dataproto(uids, mask, rewards, old_log_probs=old, ref_log_prob=ref, entropys=ent.flip(1))
    out2 = pv.compute_advantage(data2, f"pivotrl_{name}", config=algo_config())
    assert not torch.allclose(out.batch["advantages"], out2.batch["advantages"])


def test_v1_entropy_field_name_and_estimator_kwargs():
    uids, mask, rewards, old, ref, ent = random_rollout(8, binary=True)
    data = as_dataproto(uids, mask, rewards, old_log_probs=old, ref_log_prob=ref, entropy=ent)
    cfg = algo_config(pivotrl_kwargs={"gamma": 2.0, "num_buckets": 4, "eta": 0.5})
    out = pv.compute_advantage(data, "pivotrl_ep_grpo", config=cfg)
    expected = direct_advantages("ep_grpo", uids, mask, rewards, old, ref, ent, gamma=2.0, num_buckets=4, eta=0.5)
    assert (out.batch["advantages"] - expected).abs().max().item() <= 1e-6


def test_norm_adv_by_std_reaches_token_level_estimators():
    uids, mask, rewards, old, ref, ent = random_rollout(9)
    data = as_dataproto(uids, mask, rewards, old_log_probs=old, ref_log_prob=ref, entropys=ent)
    out = pv.compute_advantage(data, "pivotrl_erpo", config=algo_config(norm_adv_by_std_in_grpo=False))
    expected = direct_advantages("erpo", uids, mask, rewards, old, ref, ent, norm_by_std=False)
    assert (out.batch["advantages"] - expected).abs().max().item() <= 1e-6


def test_verl_compute_advantage_without_token_inputs_names_the_fix():
    uids, mask, rewards, old, ref, ent = random_rollout(1)
    data = as_dataproto(uids, mask, rewards, old_log_probs=old, ref_log_prob=ref, entropys=ent)
    with pytest.raises(ValueError, match="trainer_mode=pivotrl_sync"):
        verl_compute_advantage(data, "pivotrl_erpo", config=algo_config())


def test_missing_reference_names_the_flag():
    uids, mask, rewards, old, _, ent = random_rollout(1)
    data = as_dataproto(uids, mask, rewards, old_log_probs=old, entropys=ent)
    with pytest.raises(ValueError, match="ref_log_prob.*use_kl_loss"):
        pv.compute_advantage(data, "pivotrl_erpo", config=algo_config())


def test_token_inputs_from_another_batch_are_refused():
    uids, mask, rewards, old, ref, ent = random_rollout(2)
    fn = core_algos.get_adv_estimator_fn("pivotrl_ep_grpo")
    with pv.token_inputs(response_mask=mask[:, :-1], old_log_probs=old, ref_log_prob=ref, entropys=ent):
        with pytest.raises(ValueError, match="different batch"):
            fn(token_level_rewards=rewards, response_mask=mask, index=uids, config=algo_config())


def test_unknown_estimator_kwarg_is_refused():
    uids, mask, rewards, *_ = random_rollout(2)
    with pytest.raises(ValueError, match="no hyperparameter 'gama'"):
        verl_compute_advantage(as_dataproto(uids, mask, rewards), "pivotrl_grpo", config=algo_config(pivotrl_kwargs={"gama": 1}))


# ----------------------------------------------------------------------------- losses vs verl's


def loss_inputs(seed: int, n: int = 6, width: int = 10):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    lengths[-1] = 0 if seed % 2 else lengths[-1]  # sometimes an empty response
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    old = -torch.rand(n, width, generator=g) * 3
    new = (old + 0.6 * torch.randn(n, width, generator=g)).requires_grad_(True)
    adv = torch.randn(n, width, generator=g)
    weights = torch.rand(n, width, generator=g) + 0.5
    return mask, old, new, adv, weights


def run_loss(mode, mask, old, new, adv, agg, config, weights=None):
    new = new.detach().clone().requires_grad_(True)
    fn = core_algos.get_policy_loss_fn(mode)
    loss, metrics = fn(
        old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
        loss_agg_mode=agg, config=config, rollout_is_weights=weights,
    )
    loss.backward()
    return loss.detach(), new.grad, metrics


AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize(("ours", "theirs"), [("pivotrl_ppo", "vanilla"), ("pivotrl_gspo", "gspo")])
def test_losses_equal_verl_value_and_gradient(seed, agg, ours, theirs):
    mask, old, new, adv, weights = loss_inputs(seed)
    if theirs == "gspo":
        config = actor_config(clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    else:
        config = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    if seed >= 2:  # global-batch normalisation as verl's ppo_loss sets it
        config.global_batch_info.update(
            {"dp_size": 2, "batch_num_tokens": int(mask.sum()) * 2 + 3, "global_batch_size": 13, "loss_scale_factor": 16}
        )
    w = weights if seed % 2 else None
    la, ga, ma = run_loss(ours, mask, old, new, adv, agg, config, w)
    lb, gb, mb = run_loss(theirs, mask, old, new, adv, agg, config, w)
    torch.testing.assert_close(la, lb, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ga, gb, rtol=1e-6, atol=1e-7)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert abs(ma[key] - mb[key]) <= 1e-6, key
    assert ma["actor/pg_clipfrac"] > 0  # the clip is exercised


def test_dual_clip_is_exercised_in_the_vanilla_comparison():
    mask, old, new, adv, _ = loss_inputs(0)
    _, _, metrics = run_loss("pivotrl_ppo", mask, old, new, adv, "token-mean", actor_config(clip_ratio_c=1.5))
    assert metrics["actor/pg_clipfrac_lower"] > 0


@pytest.mark.parametrize("name", ["tepo", "mpo", "ppo"])
def test_registered_losses_match_pivotrl_on_one_batch(name):
    """No global batch info: verl's agg_loss and pivotrl's aggregation agree (token-mean)."""
    mask, old, new, adv, _ = loss_inputs(5)
    config = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    la, ga, _ = run_loss(f"pivotrl_{name}", mask, old, new, adv, "token-mean", config)
    batch = TokenBatch(rewards=torch.zeros(len(mask)), group_index=torch.arange(len(mask)), response_mask=mask, old_logprobs=old)
    new2 = new.detach().clone().requires_grad_(True)
    hp = {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0, "beta_kl": 0.0}
    lb, _ = compute_policy_loss(name, batch, advantages=adv, logprobs=new2, loss_agg_mode="token-mean", **hp)
    lb.backward()
    torch.testing.assert_close(la, lb.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ga, new2.grad, rtol=1e-6, atol=1e-7)


def test_loss_kwargs_from_the_environment(monkeypatch):
    mask, old, new, adv, _ = loss_inputs(3)
    config = actor_config()
    base, _, _ = run_loss("pivotrl_mpo", mask, old, new, adv, "token-mean", config)
    monkeypatch.setenv(pv.LOSS_KWARGS_ENV, json.dumps({"block_size": 2, "mode": "disjoint"}))
    assert pv.policy_loss_hparams("mpo", config)["block_size"] == 2
    other, _, _ = run_loss("pivotrl_mpo", mask, old, new, adv, "token-mean", config)
    assert not torch.allclose(base, other)
    monkeypatch.setenv(pv.LOSS_KWARGS_ENV, json.dumps({"block_sise": 2}))
    with pytest.raises(ValueError, match="block_sise"):
        run_loss("pivotrl_mpo", mask, old, new, adv, "token-mean", config)
    monkeypatch.setenv(pv.LOSS_KWARGS_ENV, json.dumps({"beta_kl": 0.05}))
    with pytest.raises(ValueError, match="use_kl_loss"):
        run_loss("pivotrl_tepo", mask, old, new, adv, "token-mean", config)


def test_pivotrl_clamps_the_log_ratio_as_verl_does():
    """Both clamp ℓ^θ − ℓ^old to [−20, 20] before exp (ALGORITHMS.md, policy loss)."""
    mask = torch.ones(1, 2, dtype=torch.bool)
    old = torch.tensor([[-30.0, -1.0]])
    new = torch.tensor([[-1.0, -1.0]])
    adv = torch.tensor([[-1.0, -1.0]])
    config = actor_config(clip_ratio_c=1e9)  # effectively no dual clip
    ours, _, _ = run_loss("pivotrl_ppo", mask, old, new, adv, "token-mean", config)
    theirs, _, _ = run_loss("vanilla", mask, old, new, adv, "token-mean", config)
    torch.testing.assert_close(ours, theirs)  # exp(20), not exp(29), on the first token
