"""The tiny policy: tokenizer, the shipped checkpoint, reproducible pretraining, the measurement."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import random

import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from pivotrl.evaluation import evaluate_heldout
from pivotrl.modeling.policy import load_policy
from pivotrl.modeling.tiny import (
    TINY_ARCH,
    build_tiny_model,
    count_parameters,
    load_tiny_policy,
    tiny_policy_path,
)
from pivotrl.modeling.tokenizer import TAGS, build_char_tokenizer
from pivotrl.pretrain import (
    RECIPE_FILE,
    PretrainConfig,
    encode_sft,
    pretrain,
)
from pivotrl.tasks import get_task

LAYOUT = "Use 3 5 7 to make 22.\n<think>5*3=15;15+7=22</think><answer>5*3+7</answer>"
MICRO = {
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "intermediate_size": 32,
}


@pytest.fixture(scope="module")
def shipped():
    path = tiny_policy_path()
    if not (path / "model.safetensors").is_file():
        pytest.fail(
            f"the shipped checkpoint is missing: run `pivotrl pretrain --output-dir {path}`"
        )
    return path


# -- tokenizer -----------------------------------------------------------------------


def test_tokenizer_round_trips_the_layout():
    tok = build_char_tokenizer()
    ids = tok(LAYOUT)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == LAYOUT
    pieces = tok.convert_ids_to_tokens(ids)
    for tag in TAGS:
        assert pieces.count(tag) == 1  # a single token each
    assert "".join(pieces[1:]) == LAYOUT  # otherwise one character per token
    assert (
        tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == LAYOUT
    )


def test_tokenizer_covers_every_synthetic_prompt_and_solution():
    tok = build_char_tokenizer()
    for name in ("countdown", "arithmetic", "linear"):
        task = get_task(name, train_size=200, test_size=100)
        for ex in task.sft_examples(200):
            text = ex.prompt + ex.response
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.unk_token_id not in ids
            assert tok.decode(ids) == text


def test_left_padding_is_the_default():
    tok = build_char_tokenizer()
    batch = tok(["ab", "abcd"], padding=True)
    assert batch["input_ids"][0][:2] == [tok.pad_token_id] * 2
    assert batch["attention_mask"][0] == [0, 0, 1, 1, 1]


# -- the shipped checkpoint --------------------------------------------------------------


def test_shipped_checkpoint_loads_with_plain_transformers(shipped):
    model = LlamaForCausalLM.from_pretrained(str(shipped))
    tok = PreTrainedTokenizerFast.from_pretrained(str(shipped))
    assert model.config.vocab_size == len(tok)
    ids = tok(LAYOUT)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == LAYOUT
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok)) and torch.isfinite(logits).all()


def test_shipped_checkpoint_is_small(shipped):
    total = sum(f.stat().st_size for f in shipped.rglob("*") if f.is_file())
    assert total <= 8 * 1024 * 1024
    model, _ = load_tiny_policy()
    assert 500_000 <= count_parameters(model) <= 2_000_000
    assert model.config.hidden_size == TINY_ARCH["hidden_size"]
    assert next(model.parameters()).dtype == torch.float32


def test_shipped_checkpoint_records_the_default_recipe(shipped):
    recipe = json.loads((shipped / RECIPE_FILE).read_text())
    assert recipe["recipe"] == PretrainConfig().to_json()
    assert recipe["steps_done"] == PretrainConfig().steps


def test_shipped_policy_answers_in_the_layout(shipped):
    model, tok = load_tiny_policy()
    task = get_task("countdown", test_size=40)
    res = evaluate_heldout(model, tok, task, n=40, temperature=0.0)
    assert res["num_problems"] == 40
    assert res["format"] >= 0.9
    assert 0.0 < res["accuracy"] < 1.0
    assert res["mean_length"] <= 40


# -- the shipped search and free checkpoints -----------------------------------------------------


def shipped_folder(name: str, task: str):
    """The folder of the shipped checkpoint `name` (a test failure saying how to make it when missing)."""
    path = tiny_policy_path(name)
    if not (path / "model.safetensors").is_file():
        pytest.fail(f"the shipped {name} checkpoint is missing: run "
                    f"`pivotrl pretrain --task {task} --output-dir {path}`")
    return path


@pytest.fixture(scope="module")
def shipped_search():
    return shipped_folder("tiny-search", "countdown_search")


@pytest.fixture(scope="module")
def shipped_free():
    return shipped_folder("tiny-free", "countdown_free")


@pytest.mark.parametrize(("name", "task", "megabytes"),
                         [("tiny-search", "countdown_search", 20), ("tiny-free", "countdown_free", 8)])
def test_shipped_checkpoint_is_small_and_records_its_recipe(name, task, megabytes):
    from pivotrl.pretrain import recipe

    folder = shipped_folder(name, task)
    assert (folder / "model.safetensors").stat().st_size <= megabytes * 1024 * 1024
    recorded = json.loads((folder / RECIPE_FILE).read_text())
    assert recorded["recipe"] == recipe(task).to_json()
    assert recorded["steps_done"] == recipe(task).steps
    model, tok = load_policy(name, device="cpu")
    assert count_parameters(model) == recorded["parameters"]
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    assert model.config.max_position_embeddings >= 28 + max(recipe(task).max_new_tokens, get_task(task).max_new_tokens)


@pytest.mark.slow
def test_shipped_search_policy_searches(shipped_search):
    from pivotrl.pretrain import recipe

    model, tok = load_tiny_policy(shipped_search)
    cfg = recipe("countdown_search")
    task = cfg.make_task(test_size=24)
    res = evaluate_heldout(model, tok, task, n=24, temperature=1.0, max_new_tokens=cfg.max_new_tokens)
    assert res["format"] >= 0.75
    assert res["mean_attempts"] >= 1.5  # it searches: more than one attempt on average
    assert 40 <= res["mean_length"] <= cfg.max_new_tokens


@pytest.mark.slow
def test_shipped_free_policy_spends_its_entropy_on_fillers(shipped_free):
    from pivotrl.analysis.free_share import FreeEntropy

    model, tok = load_tiny_policy(shipped_free)
    task = get_task("countdown_free", test_size=32)
    free = FreeEntropy(model, tok, task)
    res = evaluate_heldout(model, tok, task, n=32, on_batch=free.add)
    assert res["format"] >= 0.9
    shares = free.result()
    assert shares["free_entropy_share"] >= 0.75
    assert shares["free_token_share"] > 0.5
    assert 40 <= shares["mean_length"] <= task.max_new_tokens


# -- pretraining ---------------------------------------------------------------------------


def test_encode_sft_masks_the_prompt():
    tok = build_char_tokenizer()
    batch = encode_sft(tok, ["ab", "a"], ["<think>1</think>", "x"])
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert ids.shape == labels.shape == mask.shape == (2, 7)
    # row 0: <bos> a b <think> 1 </think> <eos>
    assert labels[0].tolist()[:3] == [-100] * 3
    assert labels[0, 3:].tolist() == ids[0, 3:].tolist()
    assert labels[0, -1].item() == tok.eos_token_id
    # row 1 is right-padded: <bos> a x <eos> <pad>...
    assert mask[1].tolist() == [1, 1, 1, 1, 0, 0, 0]
    assert labels[1].tolist() == [-100, -100, ids[1, 2].item(), tok.eos_token_id, -100, -100, -100]


def _digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_short_pretrain_is_bit_reproducible(tmp_path):
    cfg = PretrainConfig(steps=4, batch_size=8, train_size=100, warmup_steps=2, arch=MICRO)
    m1, _, r1 = pretrain(tmp_path / "a", cfg)
    m2, _, _ = pretrain(tmp_path / "b", cfg)
    assert r1.steps == 4
    for (name, a), b in zip(m1.state_dict().items(), m2.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    m3, _, _ = pretrain(None, dataclasses.replace(cfg, seed=1))
    assert not torch.equal(m1.model.embed_tokens.weight, m3.model.embed_tokens.weight)
    # what was saved loads back, the same weights
    loaded, tok = load_tiny_policy(tmp_path / "a")
    assert torch.equal(loaded.lm_head.weight, m1.lm_head.weight)
    assert tok.padding_side == "left"
    assert json.loads((tmp_path / "a" / RECIPE_FILE).read_text())["steps_done"] == 4


def test_pretrain_learns(tmp_path):
    cfg = PretrainConfig(
        steps=24, batch_size=8, train_size=200, warmup_steps=4, lr=1e-2, arch=MICRO
    )
    _, _, result = pretrain(None, cfg, log_every=8)
    losses = [h["loss"] for h in result.history]
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_mixed_data_recipe():
    from pivotrl.pretrain import sft_texts

    cfg = PretrainConfig(train_size=100, arithmetic_fraction=0.25, four_number_fraction=0.25)
    texts = sft_texts(cfg, 200)
    kinds = {p.split()[0] for p, _ in texts}
    assert kinds == {"Use", "Compute"}
    assert any(len(p.split(" to make")[0].split()) == 5 for p, _ in texts if p.startswith("Use"))
    assert texts == sft_texts(cfg, 200)


def test_heldout_accuracy_is_seeded():
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=0, **MICRO)
    task = get_task("countdown", test_size=20)
    a = evaluate_heldout(model, tok, task, n=20, seed=3, max_new_tokens=12)
    b = evaluate_heldout(model, tok, task, n=20, seed=3, max_new_tokens=12)
    assert a == b
    assert a["num_problems"] == 20 and 0.0 <= a["accuracy"] <= 1.0 and 0.0 <= a["format"] <= 1.0
    assert tok.padding_side == "left"


def test_left_padded_generation_matches_unpadded():
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=0, **MICRO).eval()
    task = get_task("countdown", test_size=4)
    prompts = [task.format_prompt(p) for p in task.problems("test")]
    batch = tok(prompts, return_tensors="pt", padding=True)
    out = model.generate(**batch, do_sample=False, max_new_tokens=8)
    for i, prompt in enumerate(prompts):
        one = tok(prompt, return_tensors="pt")
        single = model.generate(**one, do_sample=False, max_new_tokens=8)
        assert (
            single[0, one["input_ids"].shape[1] :].tolist()
            == out[i, batch["input_ids"].shape[1] :].tolist()
        )


def test_cli_defaults_are_the_recipe():
    from pivotrl.cli import pretrain as command
    from pivotrl.pretrain import RECIPES, recipe

    defaults = {
        name: p.default.default for name, p in inspect.signature(command).parameters.items()
    }
    assert defaults["task"] == "countdown"
    # every recipe option defaults to "the task's recipe"
    for name in ("seed", "steps", "minutes", "batch_size", "lr", "threads", "imperfect"):
        assert defaults[name] is None, name
    assert recipe() == recipe("countdown") == PretrainConfig() == RECIPES["countdown"]
    assert recipe("countdown", steps=None, lr=1e-3) == dataclasses.replace(PretrainConfig(), lr=1e-3)
    search = recipe("countdown_search")
    assert search.task == "countdown_search" and search.num_numbers == 4
    assert recipe("countdown_search") is not RECIPES["countdown_search"]  # a copy


def test_cli_pretrain_bad_input_is_one_line_and_exit_2(tmp_path):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["pretrain", "--task", "linear", "--eval-only"])
    assert res.exit_code == 2 and "no recipe for task 'linear'" in res.output
    res = runner.invoke(app, ["pretrain", "--eval-only", "--model", str(tmp_path / "none")])
    assert res.exit_code == 2 and "no checkpoint there" in res.output


def test_group_by_length_keeps_every_example():
    from pivotrl.pretrain import group_by_length

    rng = random.Random(0)
    texts = [("p" * rng.randint(1, 5), "r" * rng.randint(1, 200)) for _ in range(100)]
    assert group_by_length(texts, 8, 0, seed=0) == texts
    assert group_by_length(texts, 8, 1, seed=0) == texts
    grouped = group_by_length(texts, 8, 4, seed=0)
    assert sorted(grouped) == sorted(texts)
    assert grouped == group_by_length(texts, 8, 4, seed=0) != group_by_length(texts, 8, 4, seed=1)

    def padding(order):
        batches = [order[i : i + 8] for i in range(0, len(order), 8)]
        return sum(max(len(p + r) for p, r in b) * len(b) - sum(len(p + r) for p, r in b) for b in batches)

    assert padding(grouped) < padding(texts) / 2
    # each run of 4 batches is cut from the same 32 examples
    assert sorted(grouped[:32]) == sorted(texts[:32])


def test_short_search_pretrain_is_bit_reproducible(tmp_path):
    from pivotrl.pretrain import recipe, sft_texts

    cfg = recipe("countdown_search", steps=3, batch_size=8, train_size=60, warmup_steps=1,
                 arch={**MICRO, "max_position_embeddings": 384})
    texts = sft_texts(cfg, 24)
    assert all(p.startswith("Use ") and r.startswith("<think>") for p, r in texts)
    assert len({len(p.split(" to make")[0].split()) for p, _ in texts}) == 1  # four numbers each
    pretrain(tmp_path / "a", cfg)
    pretrain(tmp_path / "b", cfg)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    recorded = json.loads((tmp_path / "a" / RECIPE_FILE).read_text())
    assert recorded["recipe"]["task"] == "countdown_search" and recorded["steps_done"] == 3


@pytest.mark.benchmark
@pytest.mark.parametrize("task", ["countdown", "countdown_search"])
def test_full_pretrain_regenerates_the_shipped_checkpoint_bit_for_bit(task, tmp_path):
    """The shipped recipe, run in full (about 20 and 30 minutes of one core), writes the shipped bytes."""
    from pivotrl.pretrain import recipe, shipped_policy_path

    pretrain(tmp_path / task, recipe(task))
    shipped = shipped_policy_path(task)
    assert _digest(tmp_path / task) == _digest(shipped)
    assert (tmp_path / task / RECIPE_FILE).read_text() == (shipped / RECIPE_FILE).read_text()
