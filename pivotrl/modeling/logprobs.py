"""Chunked per-token log-probabilities and next-token entropies.

The policy loss needs, at every response position, the log-probability of the
sampled token and the entropy of the next-token distribution. Computed naively
this materialises several (B, T, V) tensors (logits, log-softmax, softmax and
their gradients), which for a real vocabulary dominates the memory of a
training step. Here the B*T positions are processed in chunks, and in the
hidden-state form the logits of a chunk are recomputed in backward from the
saved hidden states and LM-head weight, so that no (B, T, V) tensor ever exists.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from numbers import Integral, Real
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

__all__ = ["token_logprobs", "token_logprobs_and_entropy"]

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype the softmax runs in: float32 for half inputs, else the input dtype."""
    return torch.float32 if dtype in _HALF_DTYPES else dtype


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype | None]:
    """Whether autocast is on for ``device_type`` now, and its dtype."""
    try:
        if torch.is_autocast_enabled(device_type):
            return True, torch.get_autocast_dtype(device_type)
    except (RuntimeError, TypeError, ValueError):  # device type without autocast support
        pass
    return False, None


def _chunk_forward(z: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Label log-probs, entropies, row maxima and shifted log-normalisers of scaled logits ``z``.

    ``z`` (C, V) is consumed: it is overwritten in place. Returns ``(logp, H, m, s)``
    with ``log p = z - m - s`` for the original ``z``.
    """
    m = z.amax(dim=-1, keepdim=True)
    # A row whose maximum is -inf has no valid token; keep it from turning into NaNs of -inf - -inf.
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    z.sub_(m)
    p = z.exp()
    total = p.sum(dim=-1, keepdim=True)
    s = total.log()
    p.div_(total)
    logp_all = z.sub_(s)
    logp = logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    # Masked (-inf) logits have p = 0; clamping keeps 0 * log 0 at 0 instead of NaN.
    logp_all.clamp_(min=torch.finfo(logp_all.dtype).min)
    entropy = -p.mul_(logp_all).sum(dim=-1)
    return logp, entropy, m.squeeze(-1), s.squeeze(-1)


def _chunk_grad(
    z: Tensor,
    labels: Tensor,
    m: Tensor,
    s: Tensor,
    entropy: Tensor,
    grad_logp: Tensor | None,
    grad_entropy: Tensor | None,
    temperature: float,
) -> Tensor:
    """Gradient w.r.t. the unscaled logits of one chunk, given scaled logits ``z`` (consumed).

    d logp / d z = onehot - p and d H / d z = -p * (log p + H); both are multiplied by
    their incoming gradients, summed, and divided by the temperature.
    """
    logp_all = z.sub_(m.unsqueeze(-1)).sub_(s.unsqueeze(-1))
    p = logp_all.exp()
    if grad_entropy is not None:
        grad = logp_all.clamp_(min=torch.finfo(logp_all.dtype).min)
        grad.add_(entropy.unsqueeze(-1)).mul_(p).mul_(-grad_entropy.unsqueeze(-1))
        if grad_logp is not None:
            grad.sub_(p.mul_(grad_logp.unsqueeze(-1)))
    else:
        assert grad_logp is not None
        grad = p.mul_(-grad_logp.unsqueeze(-1))
    if grad_logp is not None:
        grad.scatter_add_(-1, labels.unsqueeze(-1), grad_logp.unsqueeze(-1))
    if temperature != 1.0:
        grad.div_(temperature)
    return grad


class _HiddenLogprobEntropy(torch.autograd.Function):
    """Log-probs and entropies of ``hidden @ weight.T / temperature``, chunked in both passes."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        hidden: Tensor,
        weight: Tensor,
        labels: Tensor,
        chunk_size: int,
        temperature: float,
    ) -> tuple[Tensor, Tensor]:
        """Run the chunked forward; save inputs and per-position statistics only."""
        n = hidden.shape[0]
        cdtype = _compute_dtype(hidden.dtype)
        logp = hidden.new_empty(n, dtype=cdtype)
        entropy = hidden.new_empty(n, dtype=cdtype)
        m = hidden.new_empty(n, dtype=cdtype)
        s = hidden.new_empty(n, dtype=cdtype)
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            z = _HiddenLogprobEntropy._logits(hidden[start:end], weight, cdtype, temperature)
            lp, ent, mm, ss = _chunk_forward(z, labels[start:end])
            logp[start:end], entropy[start:end] = lp, ent
            m[start:end], s[start:end] = mm, ss
            del z
        ctx.save_for_backward(hidden, weight, labels, m, s, entropy)
        ctx.chunk_size = chunk_size
        ctx.temperature = temperature
        ctx.autocast = _autocast_state(hidden.device.type)
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def _logits(h: Tensor, weight: Tensor, cdtype: torch.dtype, temperature: float) -> Tensor:
        """Scaled logits of one chunk in the compute dtype, as a fresh tensor."""
        z = torch.mm(h, weight.t())
        z = z.to(cdtype) if z.dtype != cdtype else z
        if temperature != 1.0:
            z.div_(temperature)
        return z

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_logp: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        """Recompute each chunk's logits and chain the softmax gradient through the matmul."""
        hidden, weight, labels, m, s, entropy = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (grad_logp is None and grad_entropy is None) or not (need_hidden or need_weight):
            return None, None, None, None, None
        n = hidden.shape[0]
        cdtype = _compute_dtype(hidden.dtype)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        acc_dtype = torch.promote_types(weight.dtype, torch.float32)
        grad_weight = torch.zeros_like(weight, dtype=acc_dtype) if need_weight else None
        enabled, ac_dtype = ctx.autocast
        autocast = torch.autocast(hidden.device.type, dtype=ac_dtype) if enabled else nullcontext()
        with autocast:
            for start in range(0, n, ctx.chunk_size):
                end = min(start + ctx.chunk_size, n)
                h = hidden[start:end]
                z = _HiddenLogprobEntropy._logits(h, weight, cdtype, ctx.temperature)
                grad_z = _chunk_grad(
                    z,
                    labels[start:end],
                    m[start:end],
                    s[start:end],
                    entropy[start:end],
                    None if grad_logp is None else grad_logp[start:end],
                    None if grad_entropy is None else grad_entropy[start:end],
                    ctx.temperature,
                )
                del z
                grad_z = grad_z.to(hidden.dtype)
                if grad_hidden is not None:
                    grad_hidden[start:end] = torch.mm(grad_z, weight)
                if grad_weight is not None:
                    if not enabled and grad_z.dtype == acc_dtype:
                        grad_weight.addmm_(grad_z.t(), h)
                    else:
                        grad_weight.add_(torch.mm(grad_z.t(), h))
                del grad_z
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


class _LogitsLogprobEntropy(torch.autograd.Function):
    """Log-probs and entropies of ``logits / temperature``, chunked in both passes."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, logits: Tensor, labels: Tensor, chunk_size: int, temperature: float
    ) -> tuple[Tensor, Tensor]:
        """Run the chunked forward; save the logits and per-position statistics only."""
        n = logits.shape[0]
        cdtype = _compute_dtype(logits.dtype)
        logp = logits.new_empty(n, dtype=cdtype)
        entropy = logits.new_empty(n, dtype=cdtype)
        m = logits.new_empty(n, dtype=cdtype)
        s = logits.new_empty(n, dtype=cdtype)
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            z = _LogitsLogprobEntropy._scaled(logits[start:end], cdtype, temperature)
            lp, ent, mm, ss = _chunk_forward(z, labels[start:end])
            logp[start:end], entropy[start:end] = lp, ent
            m[start:end], s[start:end] = mm, ss
            del z
        ctx.save_for_backward(logits, labels, m, s, entropy)
        ctx.chunk_size = chunk_size
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def _scaled(chunk: Tensor, cdtype: torch.dtype, temperature: float) -> Tensor:
        """A fresh copy of one chunk of logits, in the compute dtype, divided by the temperature."""
        z = chunk.to(cdtype, copy=True)
        if temperature != 1.0:
            z.div_(temperature)
        return z

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_logp: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        """Recompute each chunk's softmax and write its gradient into the logits' gradient."""
        logits, labels, m, s, entropy = ctx.saved_tensors
        if (grad_logp is None and grad_entropy is None) or not ctx.needs_input_grad[0]:
            return None, None, None, None
        n = logits.shape[0]
        cdtype = _compute_dtype(logits.dtype)
        grad_logits = torch.empty_like(logits)
        for start in range(0, n, ctx.chunk_size):
            end = min(start + ctx.chunk_size, n)
            z = _LogitsLogprobEntropy._scaled(logits[start:end], cdtype, ctx.temperature)
            grad_logits[start:end] = _chunk_grad(
                z,
                labels[start:end],
                m[start:end],
                s[start:end],
                entropy[start:end],
                None if grad_logp is None else grad_logp[start:end],
                None if grad_entropy is None else grad_entropy[start:end],
                ctx.temperature,
            )
            del z
        return grad_logits, None, None, None


def _check_float_tensor(name: str, value: object, ndim: int) -> Tensor:
    """Return ``value`` if it is a floating-point tensor with ``ndim`` dimensions."""
    if not isinstance(value, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if value.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(value.shape)}")
    return value


def token_logprobs_and_entropy(
    labels: Tensor,
    *,
    logits: Tensor | None = None,
    hidden: Tensor | None = None,
    weight: Tensor | None = None,
    chunk_size: int = 1024,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Per-token log-probs of ``labels`` and next-token entropies, computed in chunks.

    Give exactly one of ``logits`` (B, T, V), or ``hidden`` (B, T, D) together
    with the LM-head ``weight`` (V, D), in which case the logits are
    ``hidden @ weight.T``. The logits are divided by ``temperature`` before the
    softmax. ``labels`` (B, T) holds integer token ids in ``[0, V)``.

    Labels are aligned with positions: ``logits[:, t]`` is the distribution that
    scores ``labels[:, t]``; nothing is shifted here, so for a causal LM pass
    ``logits[:, :-1]`` with ``input_ids[:, 1:]`` (or slice the hidden states the
    same way). There is no ignore index: negative labels (such as -100 padding)
    are rejected; put any valid id at padded positions and mask the result.

    Returns ``(logprobs, entropy)``, both (B, T): ``logprobs[b, t] = log
    softmax(z[b, t])[labels[b, t]]`` and ``entropy[b, t] = -sum_v p log p =
    logsumexp(z) - sum_v p z`` of the same distribution. The softmax runs in
    float32 for bfloat16/float16 inputs and the results are float32; for
    float32 and float64 inputs, computation and results use the input dtype.

    The B*T positions are flattened and processed ``chunk_size`` at a time, in
    forward and in backward, so peak extra memory is O(chunk_size * V) rather
    than O(B * T * V). In the hidden-state form the full logits are never
    materialised: backward saves only ``hidden``, ``weight``, ``labels`` and
    three floats per position, recomputes each chunk's logits, and chains the
    gradient to ``hidden`` and ``weight`` through the matmul (accumulating the
    weight gradient in at least float32). Gradients flow to ``logits``,
    ``hidden`` and ``weight``, whichever require them; double backward is not
    supported. Under ``torch.autocast`` the hidden-form matmul follows autocast
    in both passes. Every invalid input raises ``ValueError``.
    """
    if (logits is None) == (hidden is None):
        raise ValueError("pass exactly one of logits=... or hidden=... (with weight=...)")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, Integral):
        raise ValueError(f"chunk_size must be an int, got {type(chunk_size).__name__}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if isinstance(temperature, bool) or not isinstance(temperature, Real):
        raise ValueError(f"temperature must be a real number, got {type(temperature).__name__}")
    if not (math.isfinite(float(temperature)) and temperature > 0):
        raise ValueError(f"temperature must be finite and > 0, got {temperature}")
    chunk_size, temperature = int(chunk_size), float(temperature)

    if not isinstance(labels, Tensor):
        raise ValueError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must be an integer tensor, got dtype {labels.dtype}")
    if labels.dim() != 2:
        raise ValueError(f"labels must have shape (B, T), got shape {tuple(labels.shape)}")

    if logits is not None:
        if weight is not None:
            raise ValueError("weight is only used with hidden=...; it must be None with logits=...")
        source = _check_float_tensor("logits", logits, 3)
        vocab = source.shape[-1]
        if source.shape[:2] != labels.shape:
            raise ValueError(
                f"logits shape {tuple(source.shape)} does not match labels shape "
                f"{tuple(labels.shape)} in (B, T)"
            )
    else:
        if weight is None:
            raise ValueError("hidden=... needs the LM-head weight=... of shape (V, D)")
        source = _check_float_tensor("hidden", hidden, 3)
        weight = _check_float_tensor("weight", weight, 2)
        vocab = weight.shape[0]
        if source.shape[:2] != labels.shape:
            raise ValueError(
                f"hidden shape {tuple(source.shape)} does not match labels shape "
                f"{tuple(labels.shape)} in (B, T)"
            )
        if weight.shape[1] != source.shape[2]:
            raise ValueError(
                f"weight shape {tuple(weight.shape)} is not (V, D) with D = hidden's last "
                f"dimension {source.shape[2]}"
            )
        if weight.dtype != source.dtype:
            raise ValueError(
                f"hidden dtype {source.dtype} differs from weight dtype {weight.dtype}"
            )
        if weight.device != source.device:
            raise ValueError(f"hidden is on {source.device} but weight is on {weight.device}")
    if labels.device != source.device:
        raise ValueError(f"labels are on {labels.device} but the inputs are on {source.device}")
    if vocab < 1:
        raise ValueError("the vocabulary dimension V must be at least 1")
    if labels.numel() > 0 and bool(((labels < 0) | (labels >= vocab)).any()):
        lo, hi = int(labels.min()), int(labels.max())
        raise ValueError(
            f"labels must lie in [0, {vocab}) (V = {vocab}); got values in [{lo}, {hi}]"
        )

    batch, steps = labels.shape
    flat_labels = labels.reshape(-1).long()
    if logits is not None:
        flat_logits = source.reshape(batch * steps, vocab)
        logp, entropy = _LogitsLogprobEntropy.apply(
            flat_logits, flat_labels, chunk_size, temperature
        )
    else:
        assert weight is not None
        flat_hidden = source.reshape(batch * steps, source.shape[2])
        logp, entropy = _HiddenLogprobEntropy.apply(
            flat_hidden, weight, flat_labels, chunk_size, temperature
        )
    return logp.view(batch, steps), entropy.view(batch, steps)


@torch.no_grad()
def token_logprobs(
    labels: Tensor, *, hidden: Tensor, weight: Tensor, chunk_size: int = 1024, temperature: float = 1.0
) -> Tensor:
    """Log-probs only (B, T) of ``labels`` under ``hidden @ weight.T / temperature``, without gradients.

    For a frozen reference model: the same values as token_logprobs_and_entropy's first
    output (to float rounding), skipping the entropy's extra pass over the vocabulary.
    """
    batch, steps = labels.shape
    flat_hidden = hidden.reshape(batch * steps, hidden.shape[-1])
    flat_labels = labels.reshape(-1, 1).long()
    cdtype = _compute_dtype(hidden.dtype)
    out = []
    for start in range(0, batch * steps, chunk_size):
        logits = torch.mm(flat_hidden[start : start + chunk_size], weight.t()).to(cdtype) / temperature
        out.append(torch.log_softmax(logits, dim=-1).gather(1, flat_labels[start : start + chunk_size]).squeeze(1))
    return torch.cat(out).view(batch, steps) if out else hidden.new_zeros(batch, steps, dtype=cdtype)
