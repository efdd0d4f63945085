"""The update phase of a training step: ppo_epochs x minibatches x micro-batches of policy forward,
policy loss, backward, gradient clipping and optimizer step.

Every row is trained on once per epoch (the last minibatch may be smaller); the micro-batches
of a minibatch share its loss denominators, so their gradients sum to the minibatch's. An
update whose loss or gradient is not finite is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from pivotrl.algorithms import (
    TokenBatch,
    compute_policy_loss,
    default_loss_agg_mode,
    loss_denominators,
)
from pivotrl.train.config import RunConfig
from pivotrl.train.loggers import mean_metrics

#: forward(rows) -> (ℓ^θ, H^θ) of those rows under the current policy, with gradients.
Forward = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


def update_policy(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TokenBatch,
                  advantages: torch.Tensor, forward: Forward, config: RunConfig, generator: torch.Generator,
                  after_step: Callable[[], None]) -> tuple[dict[str, float], bool]:
    """(metrics, bad): the policy trained on the batch's advantages; `bad` is True when an update was skipped
    (its loss or gradient not finite). `after_step` runs after each applied optimizer step."""
    train, alg = config.train, config.algorithm
    mode = alg.loss_agg_mode or default_loss_agg_mode(alg.policy_loss)
    n = batch.num_responses
    micro = train.micro_batch_size or n
    loss_metrics: list[dict[str, float]] = []
    grad_norms: list[float] = []
    bad = False
    rows_per_epoch = 0
    for _ in range(train.ppo_epochs):
        order = torch.randperm(n, generator=generator).to(batch.response_mask.device)
        rows_per_epoch = 0
        for rows in order.tensor_split(train.num_minibatches):
            if len(rows) == 0:  # fewer rows than minibatches
                continue
            denominators = loss_denominators(batch.response_mask[rows], mode)
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for part in rows.split(micro):
                logprobs, entropies_new = forward(part)
                loss, metrics = compute_policy_loss(
                    alg.policy_loss, batch.select(part), advantages=advantages[part], logprobs=logprobs,
                    entropies_new=entropies_new, loss_agg_mode=mode, max_len=batch.response_mask.shape[1],
                    **denominators, **alg.loss_kwargs)
                loss.backward()
                total += float(loss.detach())
                loss_metrics.append(metrics)
            params = [p for p in model.parameters() if p.grad is not None]
            max_norm = train.max_grad_norm if train.max_grad_norm is not None else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            grad_norms.append(float(norm))
            if math.isfinite(total) and torch.isfinite(norm):
                optimizer.step()
                after_step()
            else:
                optimizer.zero_grad(set_to_none=True)
                bad = True
            rows_per_epoch += len(rows)
    out = {**mean_metrics(loss_metrics), "grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
           "train/rows_per_epoch": float(rows_per_epoch), "train/updates": float(len(grad_norms))}
    if bad:
        out["skipped"] = True
    return out, bad
