"""configs/verl/*.yaml compose with verl's own ppo_trainer defaults and name registered pieces."""

from __future__ import annotations

from pathlib import Path

import pytest
import verl  # noqa: F401  (plugin discovery)
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.utils.config import omega_conf_to_dataclass

from pivotrl.algorithms import estimator_requirements
from pivotrl.integrations import verl as pv

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "verl"
RECIPES = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def test_there_are_recipes_for_both_methods_and_sizes():
    assert RECIPES == sorted(
        f"{m}_qwen2.5_math_{s}" for m in ("erpo", "ep_grpo") for s in ("1.5b", "7b")
    )


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_composes_and_resolves(name):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name=name)
    OmegaConf.resolve(cfg)
    method = name.split("_qwen")[0]
    assert cfg.algorithm.adv_estimator == f"pivotrl_{method}"
    assert pv.estimator_name(cfg.algorithm.adv_estimator) == method
    core_algos.get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    core_algos.get_policy_loss_fn(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
    assert get_trainer_cls(cfg.trainer.v1.trainer_mode).__name__.startswith("Pivot")
    hp = pv.estimator_hparams(method, cfg.algorithm)
    assert {"entropies", "ref_logprobs"} <= estimator_requirements(method, **hp)
    # the reference policy is on (verl's own switch), and its KL term is off
    assert (
        cfg.actor_rollout_ref.actor.use_kl_loss and cfg.actor_rollout_ref.actor.kl_loss_coef == 0.0
    )
    # verl's actor dataclass accepts every actor key (closed dataclass: a typo raises)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    hp_loss = pv.policy_loss_hparams("ppo", actor)
    assert (hp_loss["eps_low"], hp_loss["eps_high"]) == (0.2, 0.28)
    assert cfg.data.max_prompt_length + cfg.data.max_response_length <= 4096  # Qwen2.5-Math context


# ------------------------------------------------------------ main_ppo's checks, before Ray starts


def compose_recipe(name: str, overrides: tuple[str, ...] = ()):
    """verl's ppo_trainer + the recipe + overrides, composed as main_ppo does (auto_set_device)."""
    from verl.utils.device import auto_set_device

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = compose(config_name=name, overrides=list(overrides))
    auto_set_device(config)
    return config


def validate(config) -> None:
    """main_ppo's check, with verl's own answer to 'is there a reference policy?'."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )


def make_trainer(config):
    """As TaskRunnerV1.run: TQ on, config resolved, ``trainer_cls(config=config)`` (no workers)."""
    config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    return get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_passes_verls_validation_with_a_reference_policy(name):
    from verl.trainer.ppo.utils import need_reference_policy

    config = compose_recipe(name)
    validate(config)
    assert need_reference_policy(config)
    pv.check_reference_policy(config)
    pv.check_entropy_source(config)


def test_estimator_reading_reference_without_reference_policy_is_refused_naming_the_keys():
    """verl's validation passes (it does not know the estimator); the pivotrl trainer refuses."""
    config = compose_recipe(
        "erpo_qwen2.5_math_1.5b", ("actor_rollout_ref.actor.use_kl_loss=false",)
    )
    validate(config)
    with pytest.raises(
        ValueError, match=r"actor_rollout_ref\.actor\.use_kl_loss=True.*kl_loss_coef=0\.0"
    ):
        make_trainer(config)


def test_entropy_estimator_in_bypass_mode_is_refused_naming_the_key():
    """In rollout-correction bypass mode verl computes no entropies."""
    config = compose_recipe(
        "ep_grpo_qwen2.5_math_1.5b", ("algorithm.rollout_correction.bypass_mode=true",)
    )
    with pytest.raises(ValueError, match=r"algorithm\.rollout_correction\.bypass_mode"):
        make_trainer(config)


def test_estimator_without_reference_needs_no_reference_policy():
    from verl.trainer.ppo.utils import need_reference_policy

    config = compose_recipe(
        "erpo_qwen2.5_math_1.5b",
        ("actor_rollout_ref.actor.use_kl_loss=false", "algorithm.pivotrl_kwargs.eta=0.0"),
    )
    validate(config)
    assert not need_reference_policy(config)
    assert not make_trainer(config).use_reference_policy


def test_kl_in_reward_also_gives_the_reference_policy():
    config = compose_recipe(
        "ep_grpo_qwen2.5_math_1.5b",
        ("actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=true"),
    )
    validate(config)
    assert make_trainer(config).use_reference_policy


def test_pivotrl_trainers_keep_verls_mode_settings():
    """verl reads ``trainer.v1.<mode>`` and compares the mode with "sync": pivotrl's names keep it.

    (The sync mode runs end to end in tests/verl/test_verl_e2e.py; the asynchronous ones need a
    rollout device of their own, so only their start-up is checked here.)
    """
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    sync = make_trainer(compose_recipe("erpo_qwen2.5_math_1.5b"))
    assert sync.trainer_mode == "sync" and type(sync.replay_buffer) is ReplayBuffer
    colocate = make_trainer(
        compose_recipe(
            "erpo_qwen2.5_math_1.5b", ("trainer.v1.trainer_mode=pivotrl_colocate_async",)
        )
    )
    assert (
        colocate.trainer_mode == "colocate_async"
        and type(colocate.replay_buffer) is ReplayBufferAsync
    )
    separate = make_trainer(
        compose_recipe(
            "erpo_qwen2.5_math_1.5b",
            (
                "trainer.v1.trainer_mode=pivotrl_separate_async",
                "data.train_batch_size=16",  # verl: parameter_sync_step (4) x ppo_mini_batch_size
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.rollout.nnodes=1",
                "actor_rollout_ref.rollout.n_gpus_per_node=1",
                "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
            ),
        )
    )
    assert separate.trainer_mode == "separate_async"
    assert (
        separate.parameter_sync_step
        == separate.config.trainer.v1.separate_async.parameter_sync_step
        == 4
    )
