"""pivotrl inside TRL: ``PivotGRPOTrainer`` and ``PivotGRPOConfig`` (tested with trl 1.16.0).

``PivotGRPOConfig`` is TRL's ``GRPOConfig`` plus

- ``advantage_estimator``: any pivotrl estimator (``grpo``, ``dr_grpo``, ``rloo``,
  ``high_entropy``, ``entropy_shaping``, ``gtpo``, ``erpo``, ``ep_grpo``), with
  ``estimator_kwargs`` (its hyperparameters by their ALGORITHMS.md names);
- ``policy_loss``: ``ppo``, ``gspo``, ``tepo`` or ``mpo``, with ``policy_loss_kwargs``;
- ``loss_agg_mode``: pivotrl's aggregation (default: the loss's own, token-mean for
  ppo / tepo / mpo, seq-mean-token-mean for gspo), normalised over the whole
  generation batch of all processes, as TRL's ``dapo`` loss is.

``PivotGRPOTrainer`` keeps TRL's generation, reward and logging machinery and
overrides three methods of ``GRPOTrainer``:

- ``_calculate_rewards`` keeps the rewards TRL gathered from all processes;
- ``_generate_and_score_completions`` runs, only when the estimator or loss needs it,
  one extra no-grad forward of the rollout policy for its token entropies (and
  log-probs, when TRL did not keep ``old_per_token_logps``), gathers the token
  tensors of all processes (padded to one width), computes the pivotrl estimator
  on the gathered batch (group statistics over complete groups) and keeps this
  process's slice: ``advantages`` becomes a (B, T) tensor;
- ``_compute_loss`` replaces TRL's loss by ``pivotrl.algorithms.compute_policy_loss``.

TRL's ``beta`` keeps its meaning: it is the KL coefficient (pivotrl's ``beta_kl``,
k3 estimator, unless ``policy_loss_kwargs`` sets ``beta_kl``), and TRL builds the
reference model only when ``beta != 0``. An estimator or loss that needs reference
log-probs (ERPO, EP-GRPO; TEPO's masked KL) therefore needs ``beta > 0``; set
``policy_loss_kwargs={"beta_kl": 0.0}`` for a reference model without a KL term.
With a ``peft_config`` (LoRA), TRL keeps no reference copy: its reference log-probs, which
the estimators read as ℓ^ref, are the model's with the adapter disabled, i.e. the base's.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing

from pivotrl.algorithms import (
    ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    TokenBatch,
    compute_advantages,
    compute_policy_loss,
    estimator_diagnostics,
    estimator_requirements,
    loss_requirements,
)
from pivotrl.integrations import check_adaptable

__all__ = ["PivotGRPOConfig", "PivotGRPOTrainer"]

# TRL options whose effect PivotGRPOTrainer replaces: value TRL's default must keep -> what to use instead
_REPLACED_OPTIONS: dict[str, str] = {
    "loss_type": "policy_loss (ppo/gspo/tepo/mpo) and loss_agg_mode (token-mean is TRL's dapo, "
    "seq-mean-token-sum-norm its dr_grpo)",
    "importance_sampling_level": "policy_loss='gspo' (or 'tepo') for a sequence-level ratio",
    "scale_rewards": "advantage_estimator: the estimator does its own normalisation ('dr_grpo' has no std division)",
    "multi_objective_aggregation": "one weighted sum of the reward functions (reward_weights), TRL's default",
    "top_entropy_quantile": "advantage_estimator='high_entropy' with estimator_kwargs={'rho': ...}",
    "epsilon": "policy_loss_kwargs={'eps_low': ...}",
    "epsilon_high": "policy_loss_kwargs={'eps_high': ...}",
    "delta": "policy_loss_kwargs={'dual_clip': ...} (pivotrl has dual clip, not two-sided clipping)",
    "off_policy_mask_threshold": "nothing: off-policy sequence masking is not supported by PivotGRPOTrainer",
    "entropy_coef": "nothing: the entropy bonus is not supported by PivotGRPOTrainer",
    "use_adaptive_entropy": "nothing: adaptive entropy control is not supported by PivotGRPOTrainer",
}


def _grpo_default(name: str) -> Any:
    for f in dataclasses.fields(GRPOConfig):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:  # pragma: no cover - none of ours
                return f.default_factory()
    raise KeyError(name)  # pragma: no cover - TRL renamed an option


def _as_dict(name: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} must be a dict or a JSON object, got {value!r}: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict, got {type(value).__name__}")
    return dict(value)


@dataclass
class PivotGRPOConfig(GRPOConfig):
    """TRL's GRPOConfig with pivotrl's estimator, policy loss and aggregation (see the module doc)."""

    _VALID_DICT_FIELDS = GRPOConfig._VALID_DICT_FIELDS + ["estimator_kwargs", "policy_loss_kwargs"]

    advantage_estimator: str = field(
        default="grpo",
        metadata={"help": f"pivotrl advantage estimator: one of {', '.join(sorted(ESTIMATORS))}."},
    )
    estimator_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Hyperparameters of the estimator (ALGORITHMS.md names), a dict or a JSON object."},
    )
    policy_loss: str = field(
        default="ppo",
        metadata={"help": f"pivotrl policy loss: one of {', '.join(sorted(POLICY_LOSSES))}."},
    )
    policy_loss_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Hyperparameters of the policy loss (eps_low, eps_high, dual_clip, beta_kl, block_size, ...)."},
    )
    loss_agg_mode: str | None = field(
        default=None,
        metadata={"help": f"Loss aggregation, one of {', '.join(LOSS_AGG_MODES)}; default: the policy loss's own."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.estimator_kwargs = _as_dict("estimator_kwargs", self.estimator_kwargs)
        self.policy_loss_kwargs = _as_dict("policy_loss_kwargs", self.policy_loss_kwargs)
        # unknown names and hyperparameters raise ValueError here, not at the first step
        check_adaptable("TRL", self.advantage_estimator, **self.estimator_kwargs)
        loss_requirements(self.policy_loss, **self.resolved_policy_loss_kwargs())
        if self.loss_agg_mode is not None and self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)}, got {self.loss_agg_mode!r}")
        for option, instead in _REPLACED_OPTIONS.items():
            value, default = getattr(self, option), _grpo_default(option)
            if value != default:
                raise ValueError(
                    f"PivotGRPOTrainer replaces TRL's {option} (set to {value!r}, TRL's default {default!r}); use {instead}"
                )

    def resolved_policy_loss_kwargs(self) -> dict[str, Any]:
        """policy_loss_kwargs with beta_kl defaulting to TRL's beta."""
        kwargs = _as_dict("policy_loss_kwargs", self.policy_loss_kwargs)
        kwargs.setdefault("beta_kl", float(self.beta))
        return kwargs


class PivotGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer running a pivotrl advantage estimator and policy loss.

    Same constructor as ``GRPOTrainer``; ``args`` must be a :class:`PivotGRPOConfig`.
    After each generation, ``pivot_last`` holds the gathered ``TokenBatch`` the
    estimator saw (``"batch"``), its advantages (``"advantages"``, all processes'
    rows) and this process's row range (``"rows"``), for inspection.
    """

    def __init__(self, model: Any, reward_funcs: Any = None, args: PivotGRPOConfig | None = None, **kwargs: Any):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "") or "model"
            args = PivotGRPOConfig(f"{str(name).split('/')[-1]}-PivotGRPO")
        if not isinstance(args, PivotGRPOConfig):
            raise ValueError(f"PivotGRPOTrainer needs args=PivotGRPOConfig(...), got {type(args).__name__}")
        self._pivot_estimator = args.advantage_estimator
        self._pivot_estimator_kwargs = dict(args.estimator_kwargs)
        self._pivot_loss = args.policy_loss
        self._pivot_loss_kwargs = args.resolved_policy_loss_kwargs()
        self._pivot_est_needs = estimator_requirements(self._pivot_estimator, **self._pivot_estimator_kwargs)
        self._pivot_loss_needs = loss_requirements(self._pivot_loss, **self._pivot_loss_kwargs)
        needs_ref = "ref_logprobs" in self._pivot_est_needs | self._pivot_loss_needs
        if needs_ref and args.beta == 0.0:
            who = self._pivot_estimator if "ref_logprobs" in self._pivot_est_needs else f"policy loss {self._pivot_loss}"
            raise ValueError(
                f"{who} needs reference log-probs, and TRL builds the reference model only when beta != 0: "
                "set beta > 0 (the KL coefficient; add policy_loss_kwargs={'beta_kl': 0.0} for a reference "
                "model without a KL term)"
            )
        self._pivot_rewards_per_func: Tensor | None = None
        self.pivot_last: dict[str, Any] | None = None
        self._pivot_agg = args.loss_agg_mode
        super().__init__(model, reward_funcs, args, **kwargs)

    # ------------------------------------------------------------------ generation side

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # noqa: D401
        """TRL's rewards (gathered over all processes), kept for the estimator."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._pivot_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _forward_kwargs(self, output: dict[str, Any]) -> dict[str, Any]:
        keys = (
            "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
            "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
        )
        return {k: output.get(k) for k in keys}

    def _gather_tokens(self, x: Tensor) -> Tensor:
        """(B,T) of every process, right-padded to the widest, concatenated in process order."""
        x = self.accelerator.pad_across_processes(x.contiguous(), dim=1, pad_index=0)
        return self.accelerator.gather(x)

    def _generate_and_score_completions(self, inputs):
        self._pivot_rewards_per_func = None
        output = super()._generate_and_score_completions(inputs)
        rewards_per_func = self._pivot_rewards_per_func
        if rewards_per_func is None:  # pragma: no cover - TRL changed its reward path
            raise RuntimeError("PivotGRPOTrainer: TRL computed no rewards through _calculate_rewards")
        mode = "train" if self.model.training else "eval"
        device = self.accelerator.device
        mask = output["completion_mask"]
        if "tool_mask" in output:
            mask = mask * output["tool_mask"]
        mask = mask.bool()
        local_n, width = mask.shape

        needs = self._pivot_est_needs | self._pivot_loss_needs
        old = output.get("old_per_token_logps")
        entropies = None
        if "entropies" in needs or (self._pivot_est_needs and old is None):
            # the one extra pass: the rollout policy's entropies (and log-probs when TRL kept none)
            ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            attn = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
            batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                logps, entropies, _ = self._get_per_token_logps_and_entropies(
                    self.model, ids, attn, width, batch_size=batch_size, compute_entropy=True,
                    **self._forward_kwargs(output),
                )
            if old is None:
                old = logps
        ref = output.get("ref_per_token_logps")

        # the estimator runs on the gathered batch: complete groups, TRL's process order
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        total = rewards.shape[0]
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        group = torch.arange(total, device=rewards.device) // num_generations
        # an unscorable completion gets a group of its own (no effect on its siblings) and advantage 0
        group = torch.where(unscorable, total + torch.arange(total, device=rewards.device), group)
        rewards = torch.where(unscorable, torch.zeros_like(rewards), rewards)
        all_mask = self._gather_tokens(mask.long()).bool()
        zeros = torch.zeros(mask.shape, device=device, dtype=torch.float32)
        batch = TokenBatch(
            rewards=rewards.float().to(device),
            group_index=group.to(device),
            response_mask=all_mask,
            old_logprobs=self._gather_tokens((old if old is not None else zeros).float()),
            ref_logprobs=self._gather_tokens(ref.float()) if ref is not None and "ref_logprobs" in self._pivot_est_needs else None,
            entropies=self._gather_tokens(entropies.float()) if entropies is not None and "entropies" in self._pivot_est_needs else None,
        )
        if batch.num_responses != total:  # pragma: no cover - TRL changed its gathering
            raise RuntimeError(f"gathered {batch.num_responses} completions for {total} rewards")
        advantages = compute_advantages(self._pivot_estimator, batch, **self._pivot_estimator_kwargs)
        advantages = torch.where(unscorable.to(device).unsqueeze(1), torch.zeros_like(advantages), advantages)

        start = self.accelerator.process_index * local_n
        rows = slice(start, start + local_n)
        output["advantages"] = advantages[rows, :width].contiguous()
        output["pivot_rewards"] = batch.rewards[rows]
        output["pivot_row"] = torch.arange(start, start + local_n, device=device)
        lengths = all_mask.sum(dim=1)
        output["pivot_num_seqs"] = (lengths > 0).sum()
        output["pivot_num_rows"] = torch.tensor(total, device=device)
        if entropies is not None and "entropies" in self._pivot_loss_needs:
            output["pivot_entropies"] = entropies
        self.pivot_last = {"batch": batch, "advantages": advantages, "rows": rows, "mode": mode}

        # the completions table shows TRL's advantage per completion: show ours (mean over tokens)
        seq_adv = (advantages * all_mask).sum(dim=1) / lengths.clamp(min=1)
        logged = self._logs["advantages"]
        for _ in range(min(total, len(logged))):
            logged.pop()
        logged.extend(seq_adv.tolist())
        for key, value in estimator_diagnostics(batch, advantages).items():
            self._metrics[mode][f"pivotrl/{key}"].append(value)
        return output

    # ------------------------------------------------------------------ loss side

    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        width = completion_ids.size(1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        mask = mask.bool()
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, width, compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled, **self._forward_kwargs(inputs),
        )
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        advantages = inputs["advantages"]
        if advantages.dim() == 1:  # pragma: no cover - our generation side always writes (B,T)
            advantages = advantages.unsqueeze(1).expand_as(per_token_logps)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            # the clipped surrogate is positively homogeneous in A: w·L(A) = L(w·A) for w >= 0
            advantages = advantages * inputs["importance_sampling_ratio"]
        batch = TokenBatch(
            rewards=inputs["pivot_rewards"].float(),
            group_index=inputs["pivot_row"],
            response_mask=mask,
            old_logprobs=old.float(),
            ref_logprobs=inputs.get("ref_per_token_logps") if "ref_logprobs" in self._pivot_loss_needs else None,
            entropies=inputs.get("pivot_entropies") if "entropies" in self._pivot_loss_needs else None,
        )
        agg = self._pivot_agg
        # denominators over the generation batch of all processes (None: the loss's own mode,
        # token-mean or seq-mean-token-mean, each reading only its own count)
        counts: dict[str, int] = {
            "global_num_tokens": max(int(inputs["num_items_in_batch"]), 1),
            "global_num_seqs": max(int(inputs["pivot_num_seqs"]), 1),
        }
        if agg == "seq-mean-token-sum-norm":
            counts = {"global_num_seqs": max(int(inputs["pivot_num_rows"]), 1), "max_len": int(self.max_completion_length)}
        loss, metrics = compute_policy_loss(
            self._pivot_loss, batch, advantages=advantages, logprobs=per_token_logps,
            entropies_new=entropies if "entropies_new" in self._pivot_loss_needs else None,
            loss_agg_mode=agg, **counts, **self._pivot_loss_kwargs,
        )
        # the counts span the generation batch of all processes; DDP averages over processes and
        # one optimizer step accumulates gradient_accumulation_steps micro-batches (TRL's dapo scaling)
        mode = "train" if self.model.training else "eval"
        scale = float(self.accelerator.num_processes)
        if mode == "train":
            scale *= self.args.steps_per_generation / self.current_gradient_accumulation_steps
        loss = loss * scale
        if self.aux_loss_enabled:
            normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
        self._log_loss_metrics(mode, metrics, entropies, mask)
        return loss

    def _log_loss_metrics(self, mode: str, metrics: dict[str, float], entropies: Tensor, mask: Tensor) -> None:
        keys = sorted(metrics)
        local = torch.tensor([float(metrics[k]) for k in keys], device=self.accelerator.device)
        mean = self.accelerator.gather(local.unsqueeze(0)).mean(dim=0).tolist()
        for key, value in zip(keys, mean, strict=True):
            self._metrics[mode][f"pivotrl/{key}"].append(value)
        sums = torch.stack([(entropies.detach() * mask).sum(), mask.sum().float()])
        total = self.accelerator.reduce(sums, reduction="sum")
        self._metrics[mode]["entropy"].append((total[0] / total[1].clamp(min=1.0)).item())
