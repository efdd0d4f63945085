"""Recipes load and validate; overrides, inheritance and errors name their key."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from pivotrl.errors import ConfigError
from pivotrl.train.checks import check_algorithm
from pivotrl.train.config import RunConfig, dump_config, load_config, parse_override
from pivotrl.train.recipes import CONFIG_DIR, default_config_path

RECIPES = sorted(p for p in CONFIG_DIR.rglob("*.yaml") if "verl" not in p.parts)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_every_recipe_validates(path: Path) -> None:
    cfg = load_config(path)
    check_algorithm(cfg)
    assert load_config(path) == cfg


def test_default_is_erpo_on_countdown_with_the_shipped_policy() -> None:
    cfg = load_config(default_config_path())
    assert (cfg.algorithm.estimator, cfg.task.name, cfg.model.name_or_path) == ("erpo", "countdown", "tiny")


def test_overrides_parse_yaml_values() -> None:
    assert parse_override("train.lr=3e-4") == ("train.lr", 3e-4)
    assert parse_override("algorithm.estimator_kwargs={gamma: 2}") == ("algorithm.estimator_kwargs", {"gamma": 2})
    cfg = load_config(None, ["train.max_steps=4", "algorithm.estimator=grpo", "rollout.dynamic_sampling=true"])
    assert cfg.train.max_steps == 4 and cfg.algorithm.estimator == "grpo" and cfg.rollout.dynamic_sampling
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("train.max_steps")


def test_base_inheritance_and_cycles(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("train: {max_steps: 7, lr: 0.5}\n")
    (tmp_path / "b.yaml").write_text("base: a\ntrain: {lr: 0.25}\n")
    cfg = load_config(tmp_path / "b.yaml")
    assert cfg.train.max_steps == 7 and cfg.train.lr == 0.25
    (tmp_path / "c.yaml").write_text("base: d\n")
    (tmp_path / "d.yaml").write_text("base: c\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_every_field_has_a_default_and_a_doc() -> None:
    def walk(model: type) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
                walk(annotation)
                continue
            assert field.description, f"{model.__name__}.{name} has no doc"
            assert not field.is_required(), f"{model.__name__}.{name} has no default"
            for section in get_args(annotation):  # an optional section (model.lora, eval.task): its fields too
                if isinstance(section, type) and hasattr(section, "model_fields"):
                    walk(section)

    walk(RunConfig)


def test_dump_round_trips(tmp_path: Path) -> None:
    cfg = load_config(default_config_path(), ["train.seed=3"])
    (tmp_path / "dump.yaml").write_text(dump_config(cfg))
    assert load_config(tmp_path / "dump.yaml") == cfg
