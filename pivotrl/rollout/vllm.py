"""Rollouts on vLLM (one GPU; `pip install 'pivotrl[vllm]'`), kept in step with the policy being trained.

Written against vLLM 0.24's public API (the `vllm` extra pins >=0.24,<0.25):
- the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, a documented
  vLLM setting), so `LLM.apply_model` hands the policy's CUDA tensors to the
  engine's model by reference, and the model's own `load_weights` (the loader every
  vLLM model implements) copies them in; `LLM.reset_prefix_cache` then drops the
  KV blocks computed with the old weights;
- the engine starts from random weights (`load_format="dummy"`) and gets the
  policy's current weights at once, so a fresh run, a resumed checkpoint and the
  tiny models all start the same way; only the model's config is written to disk;
- prompts go in as our own token ids (`{"prompt_token_ids": ...}`, no vLLM
  tokenizer), and the Rollout is built from the ids the engine reports back;
- `SamplingParams(logprobs=0)` with `logprobs_mode="processed_logprobs"` returns
  each drawn token's log-prob after temperature and top-p, i.e. ℓ^sampler.
"""

from __future__ import annotations

import copy
import os
import tempfile
from typing import Any

import torch

from pivotrl.errors import ConfigError
from pivotrl.rollout.base import Rollout, check_sampling, left_pad, tokenize_prompts

#: The vLLM releases whose API this engine follows (also the `vllm` extra in pyproject.toml).
VLLM_VERSIONS = ">=0.24,<0.25"
#: The most parameter bytes handed to the engine's loader at once (docs/INTEGRATIONS.md).
SYNC_BUCKET_BYTES = 512 * 2**20


class VLLMEngine:
    """Samples with an in-process vLLM engine that holds a copy of the policy's weights (sync_weights refreshes it)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, max_prompt_tokens: int | None = None,
                 gpu_memory_utilization: float = 0.3, seed: int = 0) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine: weights pass by reference
        try:
            import vllm
        except ImportError:
            raise ConfigError(f"rollout.engine=vllm needs vLLM: pip install 'pivotrl[vllm]' (vllm{VLLM_VERSIONS}, "
                              "GPU only)") from None
        if not torch.cuda.is_available():
            raise ConfigError("rollout.engine=vllm needs a CUDA GPU; use rollout.engine=hf on CPU")
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs a pad and an eos token for batched sampling")
        self.model, self.tokenizer = model, tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self._sampling_params = vllm.SamplingParams
        self._config_dir = tempfile.TemporaryDirectory(prefix="pivotrl-vllm-")
        config = copy.deepcopy(model.config)
        config.architectures = [type(model).__name__]
        config.save_pretrained(self._config_dir.name)
        self.llm = vllm.LLM(
            model=self._config_dir.name, skip_tokenizer_init=True, load_format="dummy",
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."), seed=seed,
            gpu_memory_utilization=gpu_memory_utilization, logprobs_mode="processed_logprobs",
        )
        self.sync_weights()

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Copy the policy's current weights into the engine and forget the prefixes cached with the old ones.

        The weights go in buckets of at most SYNC_BUCKET_BYTES (one tensor larger than that
        goes alone), so that the engine's loader never holds more than one bucket's
        converted copies at once.
        """
        expected = set(self.llm.apply_model(lambda m: [n for n, _ in m.named_parameters()])[0])
        loaded: set[str] = set()
        for bucket in weight_buckets(self.model, SYNC_BUCKET_BYTES):
            loaded |= set(self.llm.apply_model(lambda m, b=bucket: m.load_weights(b) or ())[0])
        missed = sorted(expected - loaded) if loaded else []
        if missed:
            raise RuntimeError(f"vLLM's {type(self.model).__name__} did not receive these weights from the policy: "
                               f"{', '.join(missed[:5])}{' ...' if len(missed) > 5 else ''}")
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[str], num_samples: int, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, generator: torch.Generator | None = None) -> Rollout:
        """num_samples completions of every prompt (rows prompt-major) as a Rollout with ℓ^sampler.

        `generator` is not used: vLLM draws from its own generator, seeded with train.seed.
        """
        if num_samples < 1 or max_new_tokens < 1:
            raise ValueError(f"num_samples and max_new_tokens must be >= 1, got {num_samples}, {max_new_tokens}")
        ids, mask = left_pad(tokenize_prompts(self.tokenizer, prompts, self.max_prompt_tokens),
                             self.tokenizer.pad_token_id)
        return self.generate_from_ids(ids, mask, num_samples, max_new_tokens=max_new_tokens,
                                      temperature=temperature, top_p=top_p)

    def generate_from_ids(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_samples: int = 1, *,
                          max_new_tokens: int | torch.Tensor, temperature: float = 1.0, top_p: float = 1.0,
                          generator: torch.Generator | None = None) -> Rollout:
        """Like generate, from left-padded token ids (B,P) and their mask; max_new_tokens may be (B,) limits.

        vLLM's prefix cache serves prompts that share a prefix (a response's branches, say).
        """
        check_sampling(temperature, top_p)
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        ours = [row[keep].tolist() for row, keep in zip(prompt_ids.cpu(), prompt_mask.cpu().bool(), strict=True)]
        limits = torch.as_tensor(max_new_tokens).expand(len(ours)).tolist()
        if min(limits, default=1) < 1 or num_samples < 1:
            raise ValueError(f"num_samples and max_new_tokens must be >= 1, got {num_samples}, {min(limits)}")
        params = [self._sampling_params(n=num_samples, max_tokens=int(limit), temperature=temperature, top_p=top_p,
                                        logprobs=0, stop_token_ids=[eos], detokenize=False) for limit in limits]
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


def weight_buckets(model: torch.nn.Module, max_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    """The model's (name, tensor) pairs in order, grouped into buckets of at most max_bytes (one larger tensor alone)."""
    buckets: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, p in model.named_parameters():
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and size + nbytes > max_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append((name, p.detach()))
        size += nbytes
    return [b for b in buckets if b]
