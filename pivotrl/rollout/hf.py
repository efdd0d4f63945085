"""The default rollout engine: batched sampling with a transformers model and its KV cache."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from pivotrl.modeling.policy import (
    cache_kwarg,
    compute_precision,
    output_cache,
    positions_from_mask,
)
from pivotrl.rollout.base import Rollout, check_sampling, left_pad, tokenize_prompts


def sample_next(
    logits: Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """One token id per row (B,) from logits (B,V) at `temperature` with nucleus `top_p`, and its ℓ^sampler (B,).

    ℓ^sampler is the token's log-prob under the distribution it was drawn from: the
    nucleus of softmax(logits / T), renormalised; greedy (T <= 0) scores at T = 1.
    """
    if not torch.isfinite(logits).all():
        raise ValueError("the policy produced NaN/inf logits while sampling: its weights have diverged")
    if temperature <= 0:
        token = logits.argmax(dim=-1)
        return token, torch.log_softmax(logits.float(), dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always the most likely token)
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return token, (probs.gather(-1, token.unsqueeze(-1)).squeeze(-1) / probs.sum(dim=-1)).log()


def generator_on(device: torch.device, generator: torch.Generator | None) -> torch.Generator | None:
    """`generator` where it can draw on `device`; else a generator there, seeded from one draw of it.

    torch samples on a CUDA tensor only with a CUDA generator; callers keep one CPU generator
    (saved in checkpoints), which this way still fixes, and advances with, every sample.
    """
    if generator is None or generator.device.type == device.type:
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


class _GrowingLayer:
    """Mixin for transformers' DynamicLayer: new keys/values go into spare capacity instead of a torch.cat.

    DynamicLayer concatenates at every decode step, copying the whole cache each time
    (O(L^2) for L tokens); here the buffer doubles when full, so each step writes only the new
    token. `keys`/`values` stay views of the filled part, so everything else DynamicLayer does
    (lengths, repeat/select of batch rows, cropping) works unchanged; when one of those replaces
    them, the next update starts a fresh buffer from what they hold. No-grad sampling only:
    the in-place writes would break autograd.
    """

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, q = self.get_seq_length(), key_states.shape[-2]
        if getattr(self, "_view", None) is not self.keys:  # first call, or the base class replaced keys
            self._k, self._v = (self.keys, self.values) if n else (None, None)
        if self._k is None or self._k.shape[-2] < n + q or self._k.shape[:-2] != key_states.shape[:-2]:
            size = (*key_states.shape[:-2], max(2 * (n + q), 16), key_states.shape[-1])
            k, v = key_states.new_empty(size), value_states.new_empty(size)
            if n:
                k[..., :n, :], v[..., :n, :] = self.keys, self.values
            self._k, self._v = k, v
        self._k[..., n : n + q, :] = key_states
        self._v[..., n : n + q, :] = value_states
        self.keys, self.values = self._k[..., : n + q, :], self._v[..., : n + q, :]
        self._view = self.keys
        return self.keys, self.values


@functools.cache
def _growing_layer_class(dynamic_layer: type) -> type:
    return type("GrowingDynamicLayer", (_GrowingLayer, dynamic_layer), {})


def growing_cache(model: torch.nn.Module) -> object | None:
    """A DynamicCache for `model` whose plain layers grow in place (see _GrowingLayer), or None.

    None (use the model's own cache) when this transformers version has no DynamicLayer or
    the cache has other kinds of layers (sliding windows, linear attention).
    """
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:
        return None
    grown = _growing_layer_class(DynamicLayer)
    cache = DynamicCache(config=model.config)
    layers = getattr(cache, "layers", None)
    if layers is None:
        return None
    if not layers and getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:
        cache.layer_class_to_replicate = grown
        return cache
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    cache.layers = [grown() for _ in layers]
    return cache


class HFEngine:
    """Samples with the policy itself: left-padded prompts, one forward per new token, stop at EOS."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, max_prompt_tokens: int | None = None,
                 grow_cache_in_place: bool = True, dtype: str = "float32") -> None:
        """`dtype`: what the forwards compute in (bfloat16 or float16: under torch.autocast, whatever the
        weights' own dtype; modeling.policy.compute_precision)."""
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs a pad and an eos token for batched sampling")
        self.dtype = dtype
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.grow_cache_in_place = grow_cache_in_place
        self._cache_arg = cache_kwarg(model)

    def sync_weights(self) -> None:
        """Nothing to do: this engine samples from the policy module itself."""

    def encode_prompts(self, prompts: list[str]) -> tuple[Tensor, Tensor]:
        """Left-padded prompt ids and mask (B,P) on the model's device."""
        ids, mask = left_pad(tokenize_prompts(self.tokenizer, prompts, self.max_prompt_tokens),
                             self.tokenizer.pad_token_id)
        device = next(self.model.parameters()).device
        return ids.to(device), mask.to(device)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        num_samples: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """num_samples completions of every prompt (rows prompt-major) as a Rollout."""
        if num_samples < 1 or max_new_tokens < 1:
            raise ValueError(f"num_samples and max_new_tokens must be >= 1, got {num_samples}, {max_new_tokens}")
        prompt_ids, prompt_mask = self.encode_prompts(prompts)
        return self.generate_from_ids(prompt_ids, prompt_mask, num_samples, max_new_tokens=max_new_tokens,
                                      temperature=temperature, top_p=top_p, generator=generator)

    @torch.no_grad()
    def generate_from_ids(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        num_samples: int = 1,
        *,
        max_new_tokens: int | Tensor,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """Like generate, from left-padded token ids (B,P) and their mask (e.g. a prompt plus a forced prefix).

        max_new_tokens may be a (B,) int tensor, each prompt's own limit: its samples stop
        there (truncated, if no EOS came first).
        """
        check_sampling(temperature, top_p)
        generator = generator_on(prompt_ids.device, generator)
        limits = torch.as_tensor(max_new_tokens, device=prompt_ids.device).expand(prompt_ids.shape[0])
        if bool((limits < 1).any()):
            raise ValueError(f"max_new_tokens must be >= 1, got {limits.min().item()}")
        with compute_precision(prompt_ids.device, self.dtype):
            return self._sample(prompt_ids, prompt_mask, num_samples, limits, temperature, top_p, generator)

    def _sample(self, prompt_ids: Tensor, prompt_mask: Tensor, num_samples: int, limits: Tensor,
                temperature: float, top_p: float, generator: torch.Generator | None) -> Rollout:
        """generate_from_ids after its checks: prefill, then one forward per new token."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        was_training = self.model.training
        self.model.eval()
        attention = prompt_mask.long()
        positions = positions_from_mask(attention)
        # prefill each distinct prompt once, then copy its KV cache for the G samples
        # grown in place: 0.53x the sampling CPU time at 2048 rows, 0.94x at 256 (benchmarks/bench_cache.py)
        cache = growing_cache(self.model) if self.grow_cache_in_place else None
        out = self.model(input_ids=prompt_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                         **({self._cache_arg: cache} if cache is not None else {}))
        cache, logits = output_cache(out), out.logits[:, -1]
        if num_samples > 1:
            cache.batch_repeat_interleave(num_samples)
            logits = logits.repeat_interleave(num_samples, dim=0)
            prompt_ids = prompt_ids.repeat_interleave(num_samples, dim=0)
            prompt_mask = prompt_mask.repeat_interleave(num_samples, dim=0)
            attention = attention.repeat_interleave(num_samples, dim=0)
            positions = positions.repeat_interleave(num_samples, dim=0)
            limits = limits.repeat_interleave(num_samples)
        batch = prompt_ids.shape[0]
        next_position = positions[:, -1:] + 1
        finished = torch.zeros(batch, dtype=torch.bool, device=prompt_ids.device)
        lengths = limits.clone()  # each row's response length: up to its first EOS, else its limit
        tokens: list[Tensor] = []
        logprobs: list[Tensor] = []
        try:
            for step in range(int(limits.max())):
                token, logprob = sample_next(logits, temperature, top_p, generator)
                token = torch.where(finished, pad, token)
                tokens.append(token)
                logprobs.append(logprob)
                lengths = torch.where(~finished & (token == eos), step + 1, lengths)
                finished = finished | (token == eos) | (limits <= step + 1)
                if bool(finished.all()):
                    break
                attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
                out = self.model(input_ids=token.unsqueeze(1), attention_mask=attention, position_ids=next_position,
                                 use_cache=True, **{self._cache_arg: cache})
                cache, logits = output_cache(out), out.logits[:, -1]
                next_position = next_position + 1
        finally:
            self.model.train(was_training)
        response_ids = torch.stack(tokens, dim=1)
        response_mask = torch.arange(response_ids.shape[1], device=response_ids.device) < lengths.unsqueeze(1)
        response_ids = torch.where(response_mask, response_ids, pad)
        sampler_logprobs = torch.where(response_mask, torch.stack(logprobs, dim=1), 0.0)
        texts = self.tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        truncated = ~(response_mask & (response_ids == eos)).any(dim=1)
        return Rollout(prompt_ids, prompt_mask.bool(), response_ids, response_mask, texts,
                       truncated=truncated, group_size=num_samples, sampler_logprobs=sampler_logprobs)
