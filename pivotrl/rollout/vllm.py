"""Optional rollout engine on vLLM (GPU; `pip install pivotrl[vllm]`)."""

from __future__ import annotations

from typing import Any

import torch

from pivotrl.rollout.base import Rollout


class VLLMEngine:
    """Samples with a vLLM LLM built from the policy's weights; sync_weights reloads them."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, gpu_memory_utilization: float = 0.3,
                 max_prompt_tokens: int | None = None) -> None:
        try:
            import vllm
        except ImportError as err:
            raise ValueError("rollout.engine=vllm needs vLLM: pip install 'pivotrl[vllm]' (GPU only)") from err
        if not torch.cuda.is_available():
            raise ValueError("rollout.engine=vllm needs a CUDA GPU; use rollout.engine=hf on CPU")
        self.model, self.tokenizer = model, tokenizer
        self.llm = vllm.LLM(model=model.name_or_path, tokenizer=model.name_or_path,
                            gpu_memory_utilization=gpu_memory_utilization, dtype=str(model.dtype).split(".")[-1])
        self._sampling = vllm.SamplingParams
        self.max_prompt_tokens = max_prompt_tokens

    def sync_weights(self) -> None:
        """Copy the policy's current weights into the vLLM engine."""
        engine_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        engine_model.load_weights(self.model.state_dict().items())

    def generate(self, prompts: list[str], num_samples: int, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, generator: torch.Generator | None = None) -> Rollout:
        """num_samples completions per prompt with vLLM, padded into a Rollout."""
        seed = None if generator is None else int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        params = self._sampling(n=num_samples, max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                seed=seed)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        self.tokenizer.padding_side = "left"
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True)
        rows = [list(c.token_ids) for o in outputs for c in o.outputs]
        width = max(1, max(len(r) for r in rows))
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, r in enumerate(rows):  # padding the engine's Python lists: once per response, off the hot path
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = True
        truncated = torch.tensor([not r or r[-1] != eos for r in rows])
        device = next(self.model.parameters()).device
        return Rollout(enc["input_ids"].repeat_interleave(num_samples, 0).to(device),
                       enc["attention_mask"].repeat_interleave(num_samples, 0).bool().to(device),
                       ids.to(device), mask.to(device), [c.text for o in outputs for c in o.outputs],
                       truncated.to(device), group_size=num_samples)
