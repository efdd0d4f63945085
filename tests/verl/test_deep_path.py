"""verl's own start-up path and one step's data path with the pivotrl trainers, as deep as this CPU goes.

For every ``configs/verl/*.yaml`` recipe, in the order ``verl.trainer.main_ppo`` and
``TaskRunnerV1.run`` take:

1. Hydra composes verl's ``ppo_trainer`` config with the recipe (``main_ppo``'s
   ``--config-path/--config-name``), then ``auto_set_device`` and verl's ``validate_config``
   with ``need_reference_policy(config)``: first the recipe as shipped, then with the tiny
   model, countdown data and batch size 4 that let its step run here;
2. Ray and the TransferQueue start as ``run_ppo`` / ``TaskRunnerV1.run`` start them
   (with the issue's CPU overrides: 16 logical CPUs, one fake GPU, one storage unit, sdpa);
3. the pivotrl trainer is built by its class's constructor (``get_trainer_cls``), and the
   first steps of its ``_setup()`` run: tokenizer, data loaders, role mapping;
4. one step's data path: ``prepare_step`` (verl's data loader, prompts registered in the
   TransferQueue), the replay buffer's ``sample``, then the trainer's own
   ``_compute_old_log_prob``, ``_compute_ref_log_prob`` and ``_compute_advantage``.

Two pieces cannot start on this CPU (the vLLM server and the FSDP workers: see the issue)
and are stood in for by the two classes below, which write to the TransferQueue what the
real ones write. The checks then compare what the pivotrl estimator received, and what it
returned, with an independent computation (``pivotrl.modeling`` on the same tokens and
weights; ``pivotrl.algorithms.compute_advantages`` on the received tensors).

``PIVOTRL_VERL_CHECK_REPORT=<file>``: the results per recipe are written there as JSON
(``scripts/verl_check.sh`` prints its summary line from it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import tiny_verl
import torch
import verl  # noqa: F401  (plugin discovery)
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from pivotrl.algorithms import TokenBatch, compute_advantages, estimator_requirements
from pivotrl.integrations import verl as pv

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "verl"
RECIPES = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
REPORT_ENV = "PIVOTRL_VERL_CHECK_REPORT"

#: What lets verl's start-up run on a CPU (issue 11): Ray's resources, one TQ storage unit, sdpa.
CPU_OVERRIDES = [
    "ray_kwargs.ray_init.num_cpus=16",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "+ray_kwargs.ray_init.num_gpus=1",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
]
PROMPTS_PER_STEP = 4  # data.train_batch_size here (the recipes: 128), times the recipe's rollout.n
MAX_NEW_TOKENS = 48  # the tiny policy's answers are ~40 characters; its context is 256


# ----------------------------------------------------------------------------- the report


_REPORT: dict[str, dict[str, bool]] = {}


def _record(recipe: str, **results: bool) -> None:
    _REPORT.setdefault(recipe, {}).update(results)


@pytest.fixture(scope="session", autouse=True)
def _write_report():
    yield
    path = os.environ.get(REPORT_ENV)
    if path:
        Path(path).write_text(json.dumps({"recipes": RECIPES, "results": _REPORT}, indent=1))


# ----------------------------------------------------------------------------- config, Ray, TQ


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The tiny model's matrices are too small for a second thread: on a busy CPU, one is many times faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_inputs(tmp_path_factory):
    return tiny_verl.build(tmp_path_factory.mktemp("tiny_verl"), train=2 * PROMPTS_PER_STEP, val=PROMPTS_PER_STEP)


def compose_recipe(name: str, overrides: list[str] = ()):
    """verl's ppo_trainer + the recipe + overrides, as main_ppo composes it, after auto_set_device."""
    from verl.utils.device import auto_set_device

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = compose(config_name=name, overrides=list(overrides))
    auto_set_device(config)
    return config


def tiny_overrides(inputs) -> list[str]:
    return [
        *CPU_OVERRIDES,
        f"actor_rollout_ref.model.path={inputs['model']}",
        f"data.train_files={inputs['train']}",
        f"data.val_files={inputs['val']}",
        f"data.train_batch_size={PROMPTS_PER_STEP}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS_PER_STEP}",
        "data.dataloader_num_workers=0",
        f"reward.custom_reward_function.path={tiny_verl.__file__}",
    ]


def validate(config) -> None:
    """main_ppo's check, with verl's own answer to 'is there a reference policy?'."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


def make_trainer(config):
    """TaskRunnerV1.run's order: TQ on, config resolved, then ``trainer_cls(config=config)``."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    return get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)


@pytest.fixture(scope="session")
def verl_runtime(tiny_inputs):
    """Ray and the TransferQueue, started as run_ppo and TaskRunnerV1.run start them."""
    import ray
    import transfer_queue as tq
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    config = compose_recipe(RECIPES[0], tiny_overrides(tiny_inputs))
    config.transfer_queue.enable = True
    ray_init = OmegaConf.to_container(config.ray_kwargs.ray_init, resolve=True)
    env = OmegaConf.merge(get_ppo_ray_runtime_env(config), ray_init.pop("runtime_env", None) or {})
    env.setdefault("env_vars", {})["TRANSFER_QUEUE_ENABLE"] = "1"
    ray.init(**ray_init, runtime_env=OmegaConf.to_container(env), include_dashboard=False, log_to_driver=False)
    try:
        tq.init(config.transfer_queue)
        yield
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()


# ----------------------------------------------------------------------------- stand-ins


def load_policy(path, perturb_seed: int | None = None):
    """The tiny model from ``path``; with ``perturb_seed``, its weights moved a little (a trained actor)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    if perturb_seed is not None:
        g = torch.Generator().manual_seed(perturb_seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * p.abs().mean() * torch.randn(p.shape, generator=g))
    return model


class HFAgentLoops:
    """Stands in for verl's AgentLoopManagerTQ and its vLLM server (neither starts on a CPU).

    ``generate_sequences`` does what AgentLoopWorkerTQ does with a prompt group: marks the
    prompt ``running``, renders ``raw_prompt`` with the tokenizer's chat template, samples
    ``rollout.n`` responses (here transformers' ``generate`` on the actor's weights, at the
    rollout temperature), scores each with the reward function verl loads from
    ``reward.custom_reward_function``, stores each as ``{uid}_{session}_0`` built by verl's
    ``AgentLoopOutput.as_dict`` with the same tags, and marks the prompt ``finished``.
    """

    def __init__(self, config, tokenizer, model):
        from verl.trainer.ppo.reward import get_custom_reward_fn

        self.config, self.tokenizer, self.model = config, tokenizer, model
        self.reward_fn = get_custom_reward_fn(config)
        self.samples: dict[str, dict] = {}  # key -> prompt_ids, response_ids, score

    def generate_sequences(self, batch) -> None:
        import transfer_queue as tq
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
        from verl.utils.model import compute_position_id_with_mask
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        rollout = self.config.actor_rollout_ref.rollout
        for i in range(len(batch)):
            uid = batch["uid"][i]
            tq.kv_put(key=uid, partition_id="train", tag={"status": "running"})
            prompt_ids = list(self.tokenizer.apply_chat_template(batch["raw_prompt"][i], add_generation_prompt=True, tokenize=True)["input_ids"])
            with torch.no_grad():
                out = self.model.generate(
                    torch.tensor([prompt_ids] * rollout.n),
                    do_sample=True,
                    temperature=rollout.temperature,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=MAX_NEW_TOKENS,
                    eos_token_id=self.tokenizer.eos_token_id,
                    pad_token_id=self.tokenizer.pad_token_id,
                    return_dict_in_generate=True,
                    output_logits=True,
                )
            responses = out.sequences[:, len(prompt_ids):]
            # the sampler's log-probs of its tokens (vLLM's logprobs, asked for by rollout.calculate_log_probs)
            logits = torch.stack(out.logits, dim=1).float() / rollout.temperature
            sampler_logprobs = torch.log_softmax(logits, -1).gather(-1, responses[..., None])[..., 0]
            for session, row in enumerate(responses.tolist()):
                if self.tokenizer.eos_token_id in row:  # the response ends with its eos, as vLLM returns it
                    row = row[: row.index(self.tokenizer.eos_token_id) + 1]
                score = self.reward_fn(
                    data_source=batch["data_source"][i],
                    solution_str=self.tokenizer.decode(row, skip_special_tokens=True),
                    ground_truth=batch["reward_model"][i]["ground_truth"],
                    extra_info=batch["extra_info"][i],
                )
                output = AgentLoopOutput(
                    prompt_ids=prompt_ids,
                    response_ids=row,
                    response_mask=[1] * len(row),
                    response_logprobs=sampler_logprobs[session, : len(row)].tolist() if rollout.calculate_log_probs else None,
                    reward_score=score,
                    num_turns=2,
                    metrics=AgentLoopMetrics(),
                )
                field = output.as_dict()
                input_ids = torch.tensor(prompt_ids + row)
                field.update(
                    uid=uid,
                    session_id=session,
                    loss_mask=field["response_mask"],
                    input_ids=input_ids,
                    position_ids=compute_position_id_with_mask(torch.ones_like(input_ids)[None])[0],
                )
                key = f"{uid}_{session}_0"
                tags = {
                    "status": "success",
                    "prompt_len": len(prompt_ids),
                    "response_len": len(row),
                    "seq_len": len(prompt_ids) + len(row),
                    "global_steps": batch["global_steps"],
                    "min_global_steps": None,
                    "max_global_steps": None,
                }
                tq.kv_batch_put(keys=[key], partition_id="train", fields=list_of_dict_to_tensordict([field]), tags=[tags])
                self.samples[key] = {"prompt_ids": prompt_ids, "response_ids": row, "score": score}
            tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})


class CPUActorRefWorkers:
    """Stands in for the ``ActorRolloutRefWorker`` group (FSDP needs an accelerator).

    Like verl's workers it reads ``input_ids`` of the batch from the TransferQueue, runs the
    actor (``compute_log_prob``) or the reference (``compute_ref_log_prob``) over the whole
    sequence at the temperature in ``batch.extra_info``, and writes ``log_probs`` (and
    ``entropy`` when ``calculate_entropy``) over all positions, shifted by one (position t
    scores token t + 1), computed with verl's ``logprobs_from_logits`` and ``entropy_from_logits``.
    """

    def __init__(self, actor, ref):
        self.actor, self.ref = actor, ref

    def compute_log_prob(self, batch):
        return self._infer(self.actor, batch)

    def compute_ref_log_prob(self, batch):
        return self._infer(self.ref, batch)

    def _infer(self, model, batch):
        import transfer_queue as tq
        from tensordict import TensorDict
        from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

        info = batch.extra_info
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids"])
        log_probs, entropies = [], []
        with torch.no_grad():
            for ids in data["input_ids"].unbind():
                logits = model(ids[None]).logits[0].float() / info["temperature"]
                log_probs.append(torch.cat([logprobs_from_logits(logits[:-1], ids[1:]), logits.new_zeros(1)]))
                entropies.append(entropy_from_logits(logits))
        fields = {"log_probs": torch.nested.as_nested_tensor(log_probs, layout=torch.jagged)}
        if info.get("calculate_entropy"):
            fields["entropy"] = torch.nested.as_nested_tensor(entropies, layout=torch.jagged)
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(fields, batch_size=len(batch)))
        return batch


def independent_tensors(model, samples: list[dict], temperature: float):
    """(log-probs, entropies) (N, T) of each response under ``model``, with pivotrl.modeling, padded right."""
    from pivotrl.modeling import token_logprobs_and_entropy

    width = max(len(s["response_ids"]) for s in samples)
    logp, ent = torch.zeros(len(samples), width), torch.zeros(len(samples), width)
    with torch.no_grad():
        for i, s in enumerate(samples):
            ids = torch.tensor(s["prompt_ids"] + s["response_ids"])[None]
            p, r = len(s["prompt_ids"]), len(s["response_ids"])
            logits = model(ids).logits[:, p - 1 : p + r - 1].float()
            lp, h = token_logprobs_and_entropy(ids[:, p:], logits=logits, temperature=temperature)
            logp[i, :r], ent[i, :r] = lp[0], h[0]
    return logp, ent


def clear_train_partition() -> None:
    import transfer_queue as tq

    keys = list((tq.kv_list("train") or {}).get("train", {}))
    if keys:
        tq.kv_clear(keys=keys, partition_id="train")


# ----------------------------------------------------------------------------- per recipe


def e2e_summary():
    """scripts/verl_e2e_summary.py (the GPU script's summary of its probe file), as a module."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "verl_e2e_summary.py"
    spec = importlib.util.spec_from_file_location("verl_e2e_summary", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_start_up_and_advantage_step(recipe, tiny_inputs, verl_runtime, monkeypatch, tmp_path):
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.utils import Role, need_reference_policy
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    # 1. the recipe as shipped, and as sized for this CPU, pass verl's validation
    validate(compose_recipe(recipe))
    config = compose_recipe(recipe, tiny_overrides(tiny_inputs))
    validate(config)
    _record(recipe, config_valid=True)

    # 2.-3. the real constructor, and the first steps of _setup()
    trainer = make_trainer(config)
    assert type(trainer).__name__.startswith("Pivot")
    # verl's reference-policy decision, and the roles _setup() builds from it
    assert need_reference_policy(config) and trainer.use_reference_policy
    trainer._init_tokenizer()
    trainer._init_dataloader()
    trainer._init_resource_pool_mgr()
    assert set(trainer.role_worker_mapping) == {Role.ActorRolloutRef}
    # verl runs a pivotrl_sync trainer as its sync mode (replay buffer, data loader batches)
    assert trainer.trainer_mode == "sync"
    assert type(trainer.replay_buffer) is ReplayBuffer and not isinstance(trainer.replay_buffer, ReplayBufferAsync)
    assert config.data.get("gen_batch_size") in (None, PROMPTS_PER_STEP)
    _record(recipe, ref_policy=True)

    # 4. one step's data path; the workers as _setup() assigns them for role ActorRolloutRef
    ref = load_policy(config.actor_rollout_ref.model.path)
    actor = load_policy(config.actor_rollout_ref.model.path, perturb_seed=1)
    trainer.actor_rollout_wg = trainer.ref_policy_wg = CPUActorRefWorkers(actor, ref)
    trainer.ref_in_actor = False
    trainer.agent_loop_manager = loops = HFAgentLoops(config, trainer.tokenizer, actor)
    trainer.global_steps = 1
    torch.manual_seed(0)

    name = pv.estimator_name(config.algorithm.adv_estimator)
    hp = pv.estimator_hparams(name, config.algorithm)
    assert {"entropies", "ref_logprobs"} <= estimator_requirements(name, **hp)
    received = []
    real_estimator = core_algos.ADV_ESTIMATOR_REGISTRY[config.algorithm.adv_estimator]

    def spy(**kwargs):
        received.append({"index": list(kwargs["index"]), "mask": kwargs["response_mask"].bool(), **pv._TOKEN_INPUTS.get()})
        return real_estimator(**kwargs)

    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, config.algorithm.adv_estimator, spy)
    probe = tmp_path / "probe.jsonl"
    monkeypatch.setenv(pv.PROBE_ENV, str(probe))
    metrics: dict = {}
    try:
        trainer.prepare_step()
        batch, _ = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=PROMPTS_PER_STEP)
        n = PROMPTS_PER_STEP * config.actor_rollout_ref.rollout.n
        assert len(batch) == n
        batch = trainer._compute_old_log_prob(batch, metrics)
        batch = trainer._compute_ref_log_prob(batch, metrics)
        batch = trainer._compute_advantage(batch, metrics)
        import transfer_queue as tq

        stored = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages"])
        advantages = stored.to_padded_tensor()["advantages"]
    finally:
        clear_train_partition()

    # the estimator ran once, on this batch, with its tensors
    assert len(received) == 1
    got = received[0]
    samples = [loops.samples[key] for key in batch.keys]
    lengths = torch.tensor([len(s["response_ids"]) for s in samples])
    mask = torch.arange(got["mask"].shape[1]) < lengths[:, None]
    assert torch.equal(got["mask"], mask)
    assert got["index"] == [key.rsplit("_", 2)[0] for key in batch.keys]
    temperature = config.actor_rollout_ref.rollout.temperature
    old, ent = independent_tensors(actor, samples, temperature)
    ref_lp, _ = independent_tensors(ref, samples, temperature)
    width = mask.shape[1]
    for key, expected in (("entropys", ent), ("old_log_probs", old), ("ref_log_prob", ref_lp)):
        torch.testing.assert_close(torch.where(mask, got[key], 0.0), expected[:, :width], atol=2e-5, rtol=1e-5)
    # the check can tell them apart: the reference is not the actor, entropies are not log-probs
    assert (torch.where(mask, ref_lp - old, 0.0).abs().sum() / mask.sum()).item() > 1e-3
    assert (ent[mask] > 0).all()

    # what verl stored as advantages is pivotrl's estimator on the received tensors
    scores = torch.tensor([s["score"] for s in samples])
    groups = torch.tensor([list(dict.fromkeys(got["index"])).index(u) for u in got["index"]])
    mixed = [g for g in groups.unique() if scores[groups == g].std() > 0]
    assert mixed, "no group with both rewards: the advantage comparison would be vacuous"
    expected = compute_advantages(
        name,
        TokenBatch(
            rewards=scores,
            group_index=groups,
            response_mask=mask,
            old_logprobs=got["old_log_probs"],
            ref_logprobs=got["ref_log_prob"],
            entropies=got["entropys"],
        ),
        **hp,
    )
    torch.testing.assert_close(torch.where(mask, advantages[:, :width], 0.0), torch.where(mask, expected, 0.0), atol=1e-5, rtol=1e-5)
    assert torch.where(mask, expected, 0.0).abs().max() > 0
    # token-level: within some response the advantage varies (the entropies and ℓ^ref shaped it)
    spread = torch.where(mask, expected, -np.inf).amax(1) - torch.where(mask, expected, np.inf).amin(1)
    assert (spread > 1e-6).any()

    # the probe the GPU script reads recorded this step, and its summary says so
    summary = e2e_summary()
    records = summary.read_probe(probe)
    assert len(records) == 1 and records[0]["step"] == 1 and records[0]["use_reference_policy"]
    for field, tensor in (("entropy", ent), ("ref_log_prob", ref_lp), ("old_log_probs", old)):
        assert records[0]["batch"][field] == pytest.approx(float(tensor[:, :width][mask].sum()), rel=1e-5, abs=1e-4)
    assert summary.summary(records) == (
        f"verl e2e: 1 steps, estimator {config.algorithm.adv_estimator}, entropies seen: yes, ref policy: yes"
    )
    wrong = json.loads(json.dumps(records))
    wrong[0]["received"][0]["entropy"] += 1.0  # an estimator that got other entropies
    assert summary.summary(wrong).endswith("entropies seen: no, ref policy: yes")
    _record(recipe, entropies_seen=True)


# ----------------------------------------------------------------------------- the reference-policy decision


def test_estimator_reading_reference_without_reference_policy_fails_at_start_up(tiny_inputs):
    """verl's validation passes (it does not know the estimator); the pivotrl constructor refuses, naming the key."""
    config = compose_recipe("erpo_qwen2.5_math_1.5b", [*tiny_overrides(tiny_inputs), "actor_rollout_ref.actor.use_kl_loss=false"])
    validate(config)
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.use_kl_loss=True.*kl_loss_coef=0\.0"):
        make_trainer(config)


def test_entropy_estimator_in_bypass_mode_fails_at_start_up(tiny_inputs):
    """In rollout-correction bypass mode verl computes no entropies: refused, naming the key."""
    config = compose_recipe(
        "ep_grpo_qwen2.5_math_1.5b",
        [*tiny_overrides(tiny_inputs), "algorithm.rollout_correction.bypass_mode=true"],
    )
    with pytest.raises(ValueError, match=r"algorithm\.rollout_correction\.bypass_mode"):
        make_trainer(config)


def test_estimator_without_reference_needs_no_reference_policy(tiny_inputs):
    from verl.trainer.ppo.utils import Role

    config = compose_recipe(
        "erpo_qwen2.5_math_1.5b",
        [*tiny_overrides(tiny_inputs), "actor_rollout_ref.actor.use_kl_loss=false", "algorithm.pivotrl_kwargs.eta=0.0"],
    )
    validate(config)
    trainer = make_trainer(config)
    assert not trainer.use_reference_policy
    trainer._init_resource_pool_mgr()
    assert set(trainer.role_worker_mapping) == {Role.ActorRollout}


def test_kl_in_reward_also_gives_the_reference_policy(tiny_inputs):
    config = compose_recipe(
        "ep_grpo_qwen2.5_math_1.5b",
        [*tiny_overrides(tiny_inputs), "actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=true"],
    )
    validate(config)
    assert make_trainer(config).use_reference_policy


# ----------------------------------------------------------------------------- verl's mode semantics


def test_async_pivotrl_trainers_keep_verls_mode_settings(tiny_inputs):
    """verl reads ``trainer.v1.<mode>`` and compares the mode with "sync": the pivotrl names must not change that."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    colocate = make_trainer(
        compose_recipe("erpo_qwen2.5_math_1.5b", [*tiny_overrides(tiny_inputs), "trainer.v1.trainer_mode=pivotrl_colocate_async"])
    )
    assert colocate.trainer_mode == "colocate_async" and type(colocate.replay_buffer) is ReplayBufferAsync
    separate = make_trainer(
        compose_recipe(
            "erpo_qwen2.5_math_1.5b",
            [
                *tiny_overrides(tiny_inputs),
                "trainer.v1.trainer_mode=pivotrl_separate_async",
                f"data.train_batch_size={4 * PROMPTS_PER_STEP}",
                "actor_rollout_ref.rollout.nnodes=1",
                "actor_rollout_ref.rollout.n_gpus_per_node=1",
                "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
            ],
        )
    )
    assert separate.trainer_mode == "separate_async"
    assert separate.parameter_sync_step == separate.config.trainer.v1.separate_async.parameter_sync_step == 4


# ----------------------------------------------------------------------------- the GPU script's config


def test_gpu_e2e_overrides_pass_verls_start_up_checks(tiny_inputs):
    """scripts/verl_e2e_gpu.sh's main_ppo command line composes, validates and builds the trainer here."""
    import subprocess

    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import Role
    from verl.utils.config import omega_conf_to_dataclass

    script = Path(__file__).resolve().parents[2] / "scripts" / "verl_e2e_gpu.sh"
    work = Path(tiny_inputs["model"]).parent
    lines = subprocess.run(
        ["bash", str(script), "--print-overrides", str(work)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    options = dict(line.split("=", 1) for line in lines if line.startswith("--"))
    assert Path(options["--config-path"]) == CONFIG_DIR
    config = compose_recipe(options["--config-name"], [line for line in lines if not line.startswith("--")])
    validate(config)
    assert config.algorithm.adv_estimator == "pivotrl_ep_grpo"
    assert config.actor_rollout_ref.rollout.name == "vllm"
    omega_conf_to_dataclass(config.actor_rollout_ref.rollout)  # verl's rollout dataclass accepts it
    trainer = make_trainer(config)
    assert trainer.trainer_mode == "sync" and trainer.use_reference_policy
    trainer._init_tokenizer()
    trainer._init_dataloader()
    assert trainer.total_training_steps == 2 and len(trainer.train_dataset) >= config.data.train_batch_size
    trainer._init_resource_pool_mgr()
    assert set(trainer.role_worker_mapping) == {Role.ActorRolloutRef}
    # verl's reward loader finds tiny_verl.compute_score and it scores countdown
    score = get_custom_reward_fn(config)
    assert score(data_source="pivotrl/countdown", solution_str="<answer>3*2</answer>",
                 ground_truth=json.dumps({"numbers": [3, 2], "target": 6}), extra_info={}) == 1.0
