"""LoRA for the RL update (model.lora): the reference is the base with the adapter off, only the adapter
trains, checkpoints hold the adapter, and `pivotrl export` writes W + alpha/r·B A as a plain model.

Every expected value is computed here on its own: the base's log-probs from a fresh load of the
shipped policy, the merged weights from the base's and the adapter's safetensors files by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_helpers import SMOKE, assert_user_error, pivotrl

pytest.importorskip("peft", reason="model.lora needs peft (bash scripts/setup.sh dev,trl)")

from safetensors.torch import load_file  # noqa: E402

from pivotrl.errors import ConfigError  # noqa: E402
from pivotrl.modeling.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, add_lora, merged_parameters  # noqa: E402
from pivotrl.modeling.policy import load_policy  # noqa: E402
from pivotrl.modeling.tiny import tiny_policy_path  # noqa: E402
from pivotrl.rollout.forward import response_logprobs_no_grad  # noqa: E402
from pivotrl.train.config import load_config  # noqa: E402
from pivotrl.train.trainer import Trainer  # noqa: E402

#: smoke.yaml on the shipped tiny policy (a LoRA base a checkpoint can name, whose countdown responses need
#: 34 tokens to be scored), with a rank-4 adapter
LORA = ("model.name_or_path=tiny", "model.arch={}", "rollout.max_new_tokens=34", "model.lora.r=4")
ALPHA, RANK = 32.0, 4


def lora_config(out: Path, *overrides: str):
    return load_config(SMOKE, [f"output_dir={out}", *LORA, "eval.before_after=false", *overrides])


def base_logprobs(rollout) -> torch.Tensor:
    """ℓ of the rollout's responses under the shipped tiny policy, loaded afresh."""
    base, _ = load_policy("tiny", device="cpu")
    return response_logprobs_no_grad(base, rollout, temperature=1.0, entropies=False)[0]


def test_the_estimator_sees_the_base_models_logprobs_as_the_reference(tmp_path: Path) -> None:
    trainer = Trainer(lora_config(tmp_path, "algorithm.estimator=erpo", "train.lr=1e-2", "train.max_steps=2"))
    assert trainer.ref is None  # no second copy of the model: the base is the policy with its adapter off
    trainer.run()
    collected = trainer.collect()
    batch, _ = trainer.token_batch(collected.rollout, collected.rewards, {})
    mask = collected.rollout.response_mask
    expected = base_logprobs(collected.rollout)
    torch.testing.assert_close(batch.ref_logprobs[mask], expected[mask], rtol=0, atol=1e-5)
    # the adapter is on again for the policy, and two steps moved it away from the base
    assert (batch.old_logprobs - expected)[mask].abs().mean() > 1e-3


def test_only_the_adapters_parameters_train(tmp_path: Path) -> None:
    trainer = Trainer(lora_config(tmp_path, "train.lr=1e-2", "train.max_steps=2"))
    before = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    adapter = {name for name in before if ".lora_" in name}
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert adapter and optimised == {id(p) for name, p in trainer.model.named_parameters() if ".lora_" in name}
    trainer.run()
    after = trainer.model.state_dict()
    assert after.keys() == before.keys()
    assert {name for name in before if not torch.equal(before[name], after[name])} == adapter


def test_merged_weights_are_w_plus_scaled_ba_and_leave_the_base_as_it_was() -> None:
    model, _ = load_policy("tiny", device="cpu")
    plain = dict(model.named_parameters())
    original = {name: p.detach().clone() for name, p in plain.items()}
    lora = add_lora(model, r=RANK, alpha=ALPHA, target_modules=["q_proj", "down_proj"], dropout=0.0, seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(generator=torch.Generator().manual_seed(len(name)))
    merged = dict(merged_parameters(model))
    assert list(merged) == list(plain)  # every weight, under its plain name, in the plain order
    adapted = {n: p for n, p in model.named_parameters() if ".lora_" in n}
    for name, weight in merged.items():
        module = name.removesuffix(".weight")
        if name.endswith(("q_proj.weight", "down_proj.weight")):
            b, a = adapted[f"{module}.lora_B.default.weight"], adapted[f"{module}.lora_A.default.weight"]
            torch.testing.assert_close(weight, original[name] + ALPHA / RANK * b @ a)
        else:
            assert torch.equal(weight, original[name]), name
    for name, p in model.named_parameters():  # the base weights themselves never changed
        if ".base_layer." in name:
            assert torch.equal(p, original[name.replace(".base_layer", "")]), name
    # a forward of the merged weights is the adapted model's
    ids = torch.randint(4, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        adapted_logits = model(input_ids=ids).logits
        with lora.disable_adapter():
            base_logits = model(input_ids=ids).logits
    fresh, _ = load_policy("tiny", device="cpu")
    fresh.load_state_dict(merged, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(fresh(input_ids=ids).logits, adapted_logits, rtol=1e-4, atol=1e-4)
    assert (adapted_logits - base_logits).abs().max() > 1e-2


def test_a_lora_checkpoint_holds_the_adapter_and_loads_merged(tmp_path: Path) -> None:
    run = tmp_path / "run"
    trainer = Trainer(lora_config(run, "train.lr=1e-2", "train.max_steps=2", "checkpoint.every=1"))
    trainer.run()
    newest = run / "checkpoints" / "step-000002"
    assert {ADAPTER_CONFIG, ADAPTER_WEIGHTS, "prompt_form.json"} <= {p.name for p in newest.iterdir()}
    assert not (newest / "model.safetensors").exists() and not (newest / "config.json").exists()
    config = json.loads((newest / ADAPTER_CONFIG).read_text())
    assert config["base_model_name_or_path"] == str(tiny_policy_path("tiny").resolve())
    assert (config["r"], config["lora_alpha"]) == (RANK, ALPHA)
    loaded, _ = load_policy(str(run), device="cpu")  # a run folder: its newest checkpoint, merged
    assert not any(".lora_" in n or ".base_layer." in n for n, _ in loaded.named_parameters())
    ours = dict(merged_parameters(trainer.model))
    for name, p in loaded.named_parameters():
        torch.testing.assert_close(p, ours[name], rtol=0, atol=0)


@pytest.mark.slow
def test_train_then_export_then_eval_scores_as_the_run_folder(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "merged"
    done = pivotrl("train", "--config", "quick", "-o", str(run), "model.lora.r=8", "train.max_steps=3",
                   "train.lr=2e-3", "rollout.prompts_per_step=8", "eval.num_problems=16")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "LoRA r=8" in done.stdout
    done = pivotrl("export", str(run), "-o", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    newest = run / "checkpoints" / "step-000003"
    assert not any((out / name).exists() for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS))
    assert (out / "prompt_form.json").read_text() == (newest / "prompt_form.json").read_text()
    # the exported weights are W + alpha/r·B A, from the base's and the adapter's files
    base = load_file(str(tiny_policy_path("tiny") / "model.safetensors"))
    adapter = load_file(str(newest / ADAPTER_WEIGHTS))
    exported = load_file(str(out / "model.safetensors"))
    assert exported.keys() == base.keys()
    adapted = 0
    for name, weight in base.items():
        a = adapter.get(f"base_model.model.{name.removesuffix('.weight')}.lora_A.weight")
        if a is not None:
            b = adapter[f"base_model.model.{name.removesuffix('.weight')}.lora_B.weight"]
            weight, adapted = weight + 32.0 / 8 * b @ a, adapted + 1
        torch.testing.assert_close(exported[name], weight, rtol=0, atol=1e-6)
    assert adapted == 7 * 4  # every linear layer of the 4 decoder layers, never the head
    scores = []
    for model in (run, out):
        done = pivotrl("eval", "--model", str(model), "--task", "countdown", "-n", "32")
        assert done.returncode == 0, done.stderr[-2000:]
        scores.append(json.loads(done.stdout))
    assert scores[0] == scores[1]


def test_export_checks_its_input_and_output_before_any_work(tmp_path: Path) -> None:
    assert_user_error(pivotrl("export", str(tmp_path / "nowhere"), "-o", str(tmp_path / "out")), "nowhere",
                      "does not exist")
    (tmp_path / "empty").mkdir()
    assert_user_error(pivotrl("export", str(tmp_path / "empty"), "-o", str(tmp_path / "out")), "empty", "no model")
    assert not (tmp_path / "out").exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    shipped = str(tiny_policy_path("tiny"))
    assert_user_error(pivotrl("export", shipped, "-o", str(taken)), str(taken), "--overwrite")
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")  # peft's, for the LM head refused here
@pytest.mark.parametrize("overrides, names", [
    (("model.name_or_path=tiny-random", "model.lora.r=4"), ("model.lora", "tiny-random")),
    ((*LORA, "model.lora.target_modules=[lm_head]"), ("model.lora.target_modules", "LM head")),
    ((*LORA, "model.lora.target_modules=[qq_proj]"), ("model.lora.target_modules", "qq_proj")),
])
def test_lora_settings_that_cannot_work_are_refused_naming_their_key(tmp_path: Path, overrides, names) -> None:
    with pytest.raises(ConfigError) as err:
        Trainer(load_config(SMOKE, [f"output_dir={tmp_path}", *overrides]))
    for name in names:
        assert name in str(err.value)


@pytest.mark.slow
def test_resume_skips_a_damaged_adapter_and_continues_from_the_older_one(tmp_path: Path) -> None:
    run = tmp_path / "run"
    Trainer(lora_config(run, "train.max_steps=3", "checkpoint.every=1", "checkpoint.keep=3")).run()
    damaged = run / "checkpoints" / "step-000003" / ADAPTER_WEIGHTS
    damaged.write_bytes(damaged.read_bytes()[:100])
    done = pivotrl("train", "--config", str(SMOKE), "-o", str(run), "--resume", *LORA, "eval.before_after=false",
                   "train.max_steps=4", "checkpoint.every=1", "checkpoint.keep=3")
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0, output
    assert "checkpoint step-000003 is not usable" in output and "adapter_model.safetensors: damaged" in output
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
