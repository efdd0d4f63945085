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
    assert cfg.actor_rollout_ref.actor.use_kl_loss and cfg.actor_rollout_ref.actor.kl_loss_coef == 0.0
    # verl's actor dataclass accepts every actor key (closed dataclass: a typo raises)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    hp_loss = pv.policy_loss_hparams("ppo", actor)
    assert (hp_loss["eps_low"], hp_loss["eps_high"]) == (0.2, 0.28)
    assert cfg.data.max_prompt_length + cfg.data.max_response_length <= 4096  # Qwen2.5-Math context
