"""pivotrl inside verl 0.9.1: registered advantage estimators, policy losses and trainers.

verl 0.9.1 loads every entry point of the ``verl.plugins`` group when ``verl`` is
imported (``verl/__init__.py``: ``importlib.metadata.entry_points(group="verl.plugins")``,
each ``ep.load()``-ed, failures logged at DEBUG level and otherwise ignored;
``VERL_USE_EXTERNAL_PLUGINS=none`` turns discovery off). pivotrl's entry point
names this module, and importing it calls :func:`register`, which adds to verl's
own registries (each as soon as verl imports it):

- advantage estimators ``pivotrl_<name>`` for every pivotrl estimator
  (``pivotrl_grpo``, ``pivotrl_erpo``, ``pivotrl_ep_grpo``, ...) in
  ``verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY``, with verl's signature
  ``fn(token_level_rewards, response_mask, index=None, config=None, **kwargs) -> (advantages, returns)``;
- policy losses ``pivotrl_ppo``, ``pivotrl_gspo``, ``pivotrl_tepo``, ``pivotrl_mpo`` in
  ``POLICY_LOSS_REGISTRY``, with verl's signature
  ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)``
  and verl's ``agg_loss`` aggregation (so verl's global-batch normalisation applies);
- v1 trainers ``pivotrl_sync``, ``pivotrl_colocate_async``, ``pivotrl_separate_async``
  (``verl.trainer.ppo.v1.register_trainer``): verl's own trainers, except that the
  advantage step also fetches the rollout policy's entropies (``entropy``), ``old_log_probs``
  and ``ref_log_prob`` and hands them to the pivotrl estimator. verl keys behaviour on the
  mode's name (``== "sync"``, ``trainer.v1.<mode>``), so they report verl's name
  (``trainer_mode`` is ``sync`` for ``pivotrl_sync``);
- a ``cpu`` platform in ``verl.plugin.platform.PlatformRegistry``, which verl picks where no
  accelerator is present, so that ``verl.trainer.main_ppo`` runs on the CPU with vLLM's CPU
  build (:mod:`pivotrl.integrations.verl_cpu`).

The reference policy stays verl's decision, made where verl makes it: verl builds one
iff ``need_reference_policy(config)`` (``actor_rollout_ref.actor.use_kl_loss`` or
``algorithm.use_kl_in_reward``), and asks that question three times before any step:
``main_ppo`` validates the config with it before a trainer exists, the trainer's
constructor stores it, and ``_setup()`` maps the worker roles with it
(``ActorRolloutRef`` instead of ``ActorRollout``). A flag set on the trainer after its
constructor reaches only the second. So pivotrl sets nothing: an estimator that reads
ℓ^ref (ERPO, EP-GRPO) needs ``actor_rollout_ref.actor.use_kl_loss=True`` with
``actor_rollout_ref.actor.kl_loss_coef=0.0`` (a reference policy, no KL term; the
recipes in ``configs/verl`` set both), and the pivotrl trainers refuse to start without
it (:func:`check_reference_policy`, called first in their constructor, before any worker),
as they refuse an entropy estimator in rollout-correction bypass mode, where verl computes
no entropies (:func:`check_entropy_source`).

verl calls an estimator with rewards, mask, uid and config only. Estimators that need
more (ERPO, EP-GRPO, the entropy baselines) read the token tensors from
:func:`token_inputs`, a context that the pivotrl trainers and :func:`compute_advantage`
set around verl's own advantage step. Configuration (all plain config keys):

- ``algorithm.adv_estimator=pivotrl_erpo`` and ``trainer.v1.trainer_mode=pivotrl_sync``;
- ``+algorithm.pivotrl_kwargs.<hp>=<value>``: the estimator's hyperparameters
  (ALGORITHMS.md names; ``norm_by_std`` defaults to ``algorithm.norm_adv_by_std_in_grpo``);
- ``actor_rollout_ref.actor.policy_loss.loss_mode=pivotrl_tepo``; the loss reads
  ``clip_ratio_low`` / ``clip_ratio_high`` (eps_low / eps_high), ``clip_ratio_c`` (dual clip,
  not for gspo) and ``loss_agg_mode`` from verl's actor config, and further
  hyperparameters (MPO's ``block_size``, ...) from the JSON environment variable
  ``PIVOTRL_POLICY_LOSS_KWARGS``, because verl's actor config is a closed dataclass and
  rejects unknown keys (pass it to the workers with
  ``+ray_kwargs.ray_init.runtime_env.env_vars.PIVOTRL_POLICY_LOSS_KWARGS='{"block_size":5}'``).

``PIVOTRL_VERL_PROBE=<file>`` (read by the trainer process) makes every advantage step of
a pivotrl trainer append one JSON line to ``<file>``: the masked sums of the batch's
``entropy``, ``old_log_probs`` and ``ref_log_prob`` as verl wrote them to the
TransferQueue, and the same sums of the tensors each estimator call actually received, with
the Ray node id of the process that ran it; and save those tensors with the advantages verl
stored to ``<file>.step<k>.pt`` (``scripts/verl_e2e.sh`` reads both). In an actor worker that
sees it, every call of a ``pivotrl_*`` policy loss appends one JSON line to
``<file>.loss.jsonl``: the loss, the worker's Ray node id and rank, and the tokens it saw
(``scripts/verl_multinode.sh`` reads it).

Where verl's processes lack this plugin, the run stops at start-up instead of at the first
rollout: :mod:`pivotrl.integrations.verl_cluster` checks every node of the Ray cluster from
``main_ppo``'s driver (and from the pivotrl trainers where the driver has not).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pivotrl.algorithms import (
    ESTIMATORS,
    POLICY_LOSSES,
    TokenBatch,
    compute_advantages,
    estimator_requirements,
    hyperparameters,
    loss_requirements,
)
from pivotrl.integrations import ADAPTER_FIELDS, check_adaptable, verl_cluster
from pivotrl.integrations.import_hooks import after_import

__all__ = [
    "ESTIMATOR_KWARGS_KEY",
    "LOSS_KWARGS_ENV",
    "PREFIX",
    "PROBE_ENV",
    "TRAINER_MODES",
    "check_entropy_source",
    "check_reference_policy",
    "compute_advantage",
    "estimator_hparams",
    "estimator_name",
    "make_adv_estimator",
    "make_policy_loss",
    "policy_loss_hparams",
    "register",
    "token_inputs",
]

logger = logging.getLogger(__name__)

PREFIX = "pivotrl_"
ESTIMATOR_KWARGS_KEY = "pivotrl_kwargs"
LOSS_KWARGS_ENV = "PIVOTRL_POLICY_LOSS_KWARGS"
PROBE_ENV = "PIVOTRL_VERL_PROBE"
LOSS_PROBE_SUFFIX = ".loss.jsonl"  # the policy-loss calls' records, beside the probe file
RECEIVED_KEY = "_tensors"  # a probe receipt's tensors: saved to a .pt file, not the JSON line
TRAINER_MODES = ("sync", "colocate_async", "separate_async")
TOKEN_KEYS = ("response_mask", "old_log_probs", "ref_log_prob", "entropys")

_TOKEN_INPUTS: contextvars.ContextVar[dict[str, Tensor] | None] = contextvars.ContextVar(
    "pivotrl_verl_token_inputs", default=None
)
# when set (by a probing trainer), every estimator call appends what it received
_RECEIPTS: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "pivotrl_verl_receipts", default=None
)


# ----------------------------------------------------------------------------- helpers


def estimator_name(verl_name: Any) -> str | None:
    """The pivotrl estimator behind a verl estimator name (``pivotrl_erpo`` -> ``erpo``), else None."""
    name = getattr(verl_name, "value", verl_name)
    if isinstance(name, str) and name.startswith(PREFIX) and name[len(PREFIX):] in adaptable_estimators():
        return name[len(PREFIX):]
    return None


def adaptable_estimators() -> list[str]:
    """The pivotrl estimators verl's rollouts can feed (not pivot_mc, which needs branching rollouts)."""
    return [name for name in ESTIMATORS if not estimator_requirements(name) - ADAPTER_FIELDS]


def _plain(value: Any) -> Any:
    """A DictConfig / Mapping as a plain dict (other values unchanged)."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(value, DictConfig):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        pass
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _cfg_get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    getter = getattr(config, "get", None)
    if callable(getter):
        return getter(key, default)
    return getattr(config, key, default)


def estimator_hparams(name: str, config: Any) -> dict[str, Any]:
    """Hyperparameters for pivotrl estimator `name` from verl's algorithm config.

    ``algorithm.pivotrl_kwargs`` (a dict) gives them by their ALGORITHMS.md names;
    ``norm_by_std``, where the estimator has it, defaults to
    ``algorithm.norm_adv_by_std_in_grpo`` (verl's switch between GRPO and Dr. GRPO scaling).
    """
    raw = _plain(_cfg_get(config, ESTIMATOR_KWARGS_KEY, None))
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"algorithm.{ESTIMATOR_KWARGS_KEY} must be a mapping, got {type(raw).__name__}")
    hp = dict(raw)
    params = hyperparameters(ESTIMATORS.lookup(name).fn)
    if "norm_by_std" in params and "norm_by_std" not in hp:
        norm = _cfg_get(config, "norm_adv_by_std_in_grpo", None)
        if norm is not None:
            hp["norm_by_std"] = bool(norm)
    return hp


def _group_index(index: Any, n: int, device: torch.device) -> Tensor:
    """Dense int64 group ids (N,) from verl's uid array (strings, numbers or a tensor)."""
    if index is None:
        raise ValueError(
            "pivotrl estimators need the group of each response: verl passes it as `index` "
            "(data.non_tensor_batch['uid']), which is missing"
        )
    if isinstance(index, Tensor):
        labels = index.reshape(-1).tolist()
    else:
        labels = list(index)
    if len(labels) != n:
        raise ValueError(f"index has {len(labels)} entries for {n} responses")
    ids: dict[Any, int] = {}
    dense = [ids.setdefault(label, len(ids)) for label in labels]
    return torch.tensor(dense, dtype=torch.long, device=device)


@contextlib.contextmanager
def token_inputs(**tensors: Tensor | None) -> Iterator[None]:
    """Make token tensors available to the ``pivotrl_*`` estimators verl calls inside this block.

    Keys: ``response_mask`` (to check that the tensors belong to the batch the estimator
    sees), ``old_log_probs``, ``ref_log_prob`` and ``entropys`` (verl's field names), each (N,T).
    """
    unknown = set(tensors) - set(TOKEN_KEYS)
    if unknown:
        raise ValueError(f"token_inputs got unknown keys {sorted(unknown)}; known: {', '.join(TOKEN_KEYS)}")
    reset = _TOKEN_INPUTS.set({k: v for k, v in tensors.items() if v is not None})
    try:
        yield
    finally:
        _TOKEN_INPUTS.reset(reset)


def token_inputs_from_batch(batch: Any) -> dict[str, Tensor]:
    """The token tensors of a verl batch (TensorDict / DataProto.batch / dict), by verl's names.

    verl's legacy trainer calls the rollout entropies ``entropys``, the v1 trainer ``entropy``.
    """
    keys = set(batch.keys())
    out: dict[str, Tensor] = {}
    for key in ("response_mask", "old_log_probs", "ref_log_prob"):
        if key in keys:
            out[key] = batch[key]
    for key in ("entropys", "entropy"):
        if key in keys:
            out["entropys"] = batch[key]
            break
    return out


def _token_fields(kwargs: dict[str, Any], response_mask: Tensor) -> dict[str, Tensor]:
    """Token tensors from explicit keyword arguments, else from the token_inputs context."""
    fields: dict[str, Tensor] = {}
    context = _TOKEN_INPUTS.get()
    if context:
        ctx_mask = context.get("response_mask")
        if ctx_mask is not None and (
            ctx_mask.shape != response_mask.shape or not torch.equal(ctx_mask.bool(), response_mask.bool())
        ):
            raise ValueError(
                "the token tensors set with token_inputs() belong to a different batch: their response_mask "
                f"has shape {tuple(ctx_mask.shape)}, the estimator's {tuple(response_mask.shape)}, or their values differ"
            )
        fields.update({k: v for k, v in context.items() if k != "response_mask"})
    for key in ("old_log_probs", "ref_log_prob", "entropys", "entropy"):
        if kwargs.get(key) is not None:
            fields["entropys" if key == "entropy" else key] = kwargs[key]
    for key, value in fields.items():
        if value.shape != response_mask.shape:
            raise ValueError(f"{key} has shape {tuple(value.shape)}, response_mask {tuple(response_mask.shape)}")
    return fields


_REFERENCE_POLICY_FIX = (
    "set actor_rollout_ref.actor.use_kl_loss=True with actor_rollout_ref.actor.kl_loss_coef=0.0 "
    "(verl then builds the reference policy and adds no KL term), or algorithm.use_kl_in_reward=True"
)

_HOW_TO_SUPPLY = (
    "verl does not pass token tensors to advantage estimators; use the pivotrl trainer "
    "(trainer.use_v1=True trainer.v1.trainer_mode=pivotrl_sync), or call "
    "pivotrl.integrations.verl.compute_advantage(data, ...) instead of verl's compute_advantage"
)


def _masked_sums(mask: Tensor, entropies: Tensor | None, ref: Tensor | None, old: Tensor | None) -> dict[str, Any]:
    """What a probe records of a batch: its size and the masked sums of its token tensors (None if absent)."""

    def total(x: Tensor | None) -> float | None:
        return None if x is None else float(torch.where(mask, x.float(), 0.0).sum())

    return {
        "rows": int(mask.shape[0]),
        "tokens": int(mask.sum()),
        "entropy": total(entropies),
        "ref_log_prob": total(ref),
        "old_log_probs": total(old),
    }


def ray_node_id() -> str | None:
    """The Ray node id of this process, None outside Ray."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def _append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """One JSON line, in one write (several processes append to the same file)."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def check_reference_policy(config: Any) -> None:
    """Refuse a verl config whose pivotrl estimator reads ℓ^ref while verl builds no reference policy.

    verl decides with ``need_reference_policy(config)`` (``actor_rollout_ref.actor.use_kl_loss``
    or ``algorithm.use_kl_in_reward``) before validation and role mapping, so the config has
    to say it; the pivotrl trainers call this first in their constructor.
    """
    from verl.trainer.ppo.utils import need_reference_policy

    name = estimator_name(config.algorithm.adv_estimator)
    if name is None:
        return
    needed = estimator_requirements(name, **estimator_hparams(name, config.algorithm))
    if "ref_logprobs" in needed and not need_reference_policy(config):
        raise ValueError(
            f"algorithm.adv_estimator={PREFIX}{name} reads reference log-probs, but this config gives verl "
            f"no reference policy (actor_rollout_ref.actor.use_kl_loss=False): {_REFERENCE_POLICY_FIX}"
        )


def check_entropy_source(config: Any) -> None:
    """Refuse a verl config in which verl computes no entropies for a pivotrl estimator that reads them.

    verl's ``_compute_old_log_prob`` writes the rollout policy's ``entropy`` when it recomputes
    ℓ^old; in ``algorithm.rollout_correction.bypass_mode`` it copies the rollout's log-probs
    instead and writes no entropies.
    """
    name = estimator_name(config.algorithm.adv_estimator)
    if name is None:
        return
    needed = estimator_requirements(name, **estimator_hparams(name, config.algorithm))
    correction = _cfg_get(config.algorithm, "rollout_correction", None)
    if "entropies" in needed and correction is not None and _cfg_get(correction, "bypass_mode", False):
        raise ValueError(
            f"algorithm.adv_estimator={PREFIX}{name} reads the rollout policy's entropies, which verl does not "
            "compute with algorithm.rollout_correction.bypass_mode=True: set it to False"
        )


# ----------------------------------------------------------------------------- estimators


def make_adv_estimator(name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    """verl advantage estimator running pivotrl estimator `name`; returns (advantages, returns)."""
    check_adaptable("verl", name)  # unknown names (with the hint) and pivot_mc, before verl sees the name

    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        index: Any = None,
        config: Any = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor]:
        hp = estimator_hparams(name, config)
        needed = estimator_requirements(name, **hp)
        fields = _token_fields(kwargs, response_mask)
        missing = []
        if "ref_logprobs" in needed:
            missing += [k for k in ("old_log_probs", "ref_log_prob") if fields.get(k) is None]
        if "entropies" in needed and fields.get("entropys") is None:
            missing.append("entropys (the rollout policy's entropies)")
        if missing:
            extra = ""
            if "ref_log_prob" in missing:
                extra = f"; ref_log_prob exists only with a reference policy: {_REFERENCE_POLICY_FIX}"
            raise ValueError(f"{PREFIX}{name} needs {', '.join(missing)}: {_HOW_TO_SUPPLY}{extra}")
        mask = response_mask.bool()
        rewards = token_level_rewards.sum(dim=-1).float()
        old = fields.get("old_log_probs")
        batch = TokenBatch(
            rewards=rewards,
            group_index=_group_index(index, rewards.shape[0], rewards.device),
            response_mask=mask,
            old_logprobs=old.float() if old is not None else torch.zeros(mask.shape, device=mask.device),
            ref_logprobs=fields["ref_log_prob"].float() if "ref_logprobs" in needed else None,
            entropies=fields["entropys"].float() if "entropies" in needed else None,
        )
        receipts = _RECEIPTS.get()
        if receipts is not None:
            labels = index.tolist() if isinstance(index, Tensor) else index
            received = {
                "token_level_rewards": token_level_rewards,
                "response_mask": mask,
                "index": [str(label) for label in labels],
                "old_log_probs": old,
                "ref_log_prob": batch.ref_logprobs,
                "entropys": batch.entropies,
                "hparams": hp,
            }
            received = {k: v.cpu() if isinstance(v, Tensor) else v for k, v in received.items()}
            sums = _masked_sums(mask, batch.entropies, batch.ref_logprobs, old)
            receipts.append({**sums, "node_id": ray_node_id(), "pid": os.getpid(), RECEIVED_KEY: received})
        adv = compute_advantages(name, batch, **hp).to(token_level_rewards.dtype)
        return adv, adv

    estimator.__name__ = f"compute_{PREFIX}{name}_advantage"
    estimator.__qualname__ = estimator.__name__
    estimator.__doc__ = f"verl advantage estimator {PREFIX}{name}: pivotrl's {name!r} (see ALGORITHMS.md)."
    return estimator


def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
    """verl's ``ray_trainer.compute_advantage`` with the batch's token tensors made available.

    Same arguments and result as verl's function; for a ``pivotrl_*`` estimator, the
    batch's ``old_log_probs``, ``ref_log_prob`` and ``entropys`` (or ``entropy``) reach it.
    """
    from verl.trainer.ppo.ray_trainer import compute_advantage as verl_compute_advantage

    if estimator_name(adv_estimator) is None:
        return verl_compute_advantage(data, adv_estimator, *args, **kwargs)
    with token_inputs(**token_inputs_from_batch(data.batch)):
        return verl_compute_advantage(data, adv_estimator, *args, **kwargs)


# ----------------------------------------------------------------------------- policy losses


def policy_loss_hparams(name: str, config: Any = None) -> dict[str, Any]:
    """Hyperparameters of pivotrl loss `name` under verl.

    From verl's actor config: eps_low = ``clip_ratio_low`` (else ``clip_ratio``), eps_high =
    ``clip_ratio_high`` (else ``clip_ratio``), dual_clip = ``clip_ratio_c`` (ppo, tepo, mpo: verl's
    ``vanilla`` always applies its dual clip; gspo: none, as verl's ``gspo``). Then the JSON object
    in ``$PIVOTRL_POLICY_LOSS_KWARGS`` overrides any of them and sets the others (``block_size``, ...).
    The KL term is verl's (``actor.use_kl_loss``): ``beta_kl`` is 0 here, including for tepo, whose
    masked KL needs entropies and reference log-probs that verl's loss interface does not pass.
    """
    params = list(hyperparameters(POLICY_LOSSES.lookup(name).fn))
    hp: dict[str, Any] = {}
    if config is not None:
        clip = _cfg_get(config, "clip_ratio", None)
        low = _cfg_get(config, "clip_ratio_low", None)
        high = _cfg_get(config, "clip_ratio_high", None)
        low = clip if low is None else low
        high = clip if high is None else high
        if low is not None:
            hp["eps_low"] = float(low)
        if high is not None:
            hp["eps_high"] = float(high)
        if name != "gspo":
            c = _cfg_get(config, "clip_ratio_c", None)
            if c is not None:
                hp["dual_clip"] = float(c)
    hp["beta_kl"] = 0.0
    raw = os.environ.get(LOSS_KWARGS_ENV, "").strip()
    if raw:
        try:
            override = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"${LOSS_KWARGS_ENV} is not valid JSON: {exc}") from None
        if not isinstance(override, dict):
            raise ValueError(f"${LOSS_KWARGS_ENV} must be a JSON object, got {type(override).__name__}")
        unknown = sorted(set(override) - set(params))
        if unknown:
            raise ValueError(
                f"${LOSS_KWARGS_ENV} has {unknown}, which policy loss {name!r} does not take; valid: {', '.join(params)}"
            )
        hp.update(override)
    if hp.get("beta_kl", 0.0) != 0.0:
        raise ValueError(
            f"{PREFIX}{name}: beta_kl must be 0 under verl (its policy-loss interface passes no reference "
            "log-probs or entropies); use actor_rollout_ref.actor.use_kl_loss / kl_loss_coef for a KL term"
        )
    return hp


def make_policy_loss(name: str) -> Callable[..., tuple[Tensor, dict[str, Any]]]:
    """verl policy loss running pivotrl loss `name`, aggregated with verl's agg_loss."""
    per_token = POLICY_LOSSES.lookup(name).fn

    def policy_loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        from verl.trainer.ppo.core_algos import agg_loss

        hp = policy_loss_hparams(name, config)
        needed = loss_requirements(name, **hp)
        if needed:
            raise ValueError(f"{PREFIX}{name} with {hp} needs {sorted(needed)}, which verl's policy-loss interface does not pass")
        mask = response_mask.bool()
        n = mask.shape[0]
        batch = TokenBatch(
            rewards=torch.zeros(n, device=mask.device),
            group_index=torch.arange(n, device=mask.device),
            response_mask=mask,
            old_logprobs=old_log_prob,
        )
        loss_mat, metrics = per_token(batch, advantages, log_prob, None, **hp)
        if rollout_is_weights is not None:
            loss_mat = loss_mat * rollout_is_weights
        batch_info = _plain(_cfg_get(config, "global_batch_info", None)) or {}
        pg_loss = agg_loss(loss_mat=loss_mat, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info)
        out: dict[str, Any] = {
            "actor/pg_clipfrac": metrics.get("clip/frac", 0.0),
            "actor/ppo_kl": metrics.get("kl/old_approx", 0.0),
            "actor/pg_clipfrac_lower": metrics.get("clip/dual_frac", 0.0),
        }
        out.update({f"actor/pivotrl/{key}": value for key, value in metrics.items()})
        probe = os.environ.get(PROBE_ENV)
        if probe:
            rank = os.environ.get("RANK")  # verl sets it in each worker: its rank in the worker group
            _append_jsonl(probe + LOSS_PROBE_SUFFIX, {
                "loss": PREFIX + name,
                "node_id": ray_node_id(),
                "rank": None if rank is None else int(rank),
                "pid": os.getpid(),
                "tokens": int(mask.sum()),
            })
        return pg_loss, out

    policy_loss.__name__ = f"compute_policy_loss_{PREFIX}{name}"
    policy_loss.__qualname__ = policy_loss.__name__
    policy_loss.__doc__ = f"verl policy loss {PREFIX}{name}: pivotrl's {name!r} per-token loss, verl's agg_loss."
    return policy_loss


# ----------------------------------------------------------------------------- trainers


class PivotAdvantageMixin:
    """Mixed into verl's v1 PPO trainers: feeds pivotrl estimators their token tensors.

    ``__init__`` first refuses a config in which the estimator would get no ℓ^ref
    (:func:`check_reference_policy`) or no entropies (:func:`check_entropy_source`),
    then is verl's. ``_compute_advantage`` fetches
    ``entropy`` (written by verl's ``_compute_old_log_prob``), ``old_log_probs`` and
    ``ref_log_prob`` from the TransferQueue when the configured ``pivotrl_*`` estimator
    needs them and runs verl's own advantage step inside :func:`token_inputs`.
    """

    config: Any

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        check_reference_policy(config)
        check_entropy_source(config)
        verl_cluster.check_from_trainer(config)
        super().__init__(config, *args, **kwargs)

    @property
    def trainer_mode(self) -> str:
        """verl's name of this mode: ``sync`` for ``pivotrl_sync``, and so on.

        verl's base trainer stores ``trainer.v1.trainer_mode`` here and keys its behaviour
        on it: ``== "sync"`` picks the synchronous replay buffer and data-loader batches,
        and ``trainer.v1.<mode>`` holds the mode's settings (``parameter_sync_step``,
        ``num_warmup_batches``). Under the registered name it would run ``pivotrl_sync``
        as an unknown asynchronous mode without settings.
        """
        return self.__dict__["_verl_trainer_mode"]

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self.__dict__["_verl_trainer_mode"] = value[len(PREFIX):] if value.startswith(PREFIX) else value

    def _pivotrl_name(self) -> str | None:
        return estimator_name(self.config.algorithm.adv_estimator)

    def _pivotrl_needed(self) -> frozenset[str]:
        name = self._pivotrl_name()
        if name is None:
            return frozenset()
        return estimator_requirements(name, **estimator_hparams(name, self.config.algorithm))

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        needed = self._pivotrl_needed()
        if not needed:
            return super()._compute_advantage(batch, metrics)  # type: ignore[misc]
        import transfer_queue as tq

        fields = ["response_mask"]
        if "entropies" in needed:
            fields.append("entropy")
        if "ref_logprobs" in needed:
            fields += ["old_log_probs", "ref_log_prob"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        tensors = token_inputs_from_batch(data.to_padded_tensor())
        probe = os.environ.get(PROBE_ENV)
        receipts: list[dict[str, Any]] | None = [] if probe else None
        reset = _RECEIPTS.set(receipts)
        try:
            with token_inputs(**tensors):
                out = super()._compute_advantage(batch, metrics)  # type: ignore[misc]
        finally:
            _RECEIPTS.reset(reset)
        if probe:
            stored = tq.kv_batch_get(
                keys=out.keys, partition_id=out.partition_id, select_fields=["advantages"]
            ).to_padded_tensor()["advantages"]
            self._write_probe(probe, tensors, receipts or [], stored)
        return out

    def _write_probe(
        self, path: str, tensors: dict[str, Tensor], receipts: list[dict], advantages: Tensor
    ) -> None:
        """Append this advantage step's record to the ``PIVOTRL_VERL_PROBE`` file (one JSON line),
        and save the tensors each estimator call received, with the advantages verl stored, to
        ``<probe>.step<k>.pt`` beside it (``scripts/verl_e2e_summary.py`` recomputes them)."""
        mask = tensors["response_mask"].bool()
        step = getattr(self, "global_steps", None)
        saved = Path(f"{path}.step{step}.pt")
        torch.save(
            {
                "received": [receipt.pop(RECEIVED_KEY) for receipt in receipts],
                "response_mask": mask.cpu(),
                "advantages": advantages.detach().cpu(),
            },
            saved,
        )
        record = {
            "step": step,
            "estimator": PREFIX + (self._pivotrl_name() or ""),
            "node_id": ray_node_id(),  # the trainer's process: verl's TaskRunner
            "use_reference_policy": bool(getattr(self, "use_reference_policy", False)),
            "batch": _masked_sums(mask, tensors.get("entropys"), tensors.get("ref_log_prob"), tensors.get("old_log_probs")),
            "received": receipts,
            "tensors": saved.name,
        }
        _append_jsonl(path, record)


_TRAINER_CLASSES: dict[str, type] = {}


def _register_trainers(v1: Any) -> None:
    """Register the pivotrl trainers with verl's ``verl.trainer.ppo.v1`` package (``v1``)."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    bases = {
        "sync": v1.PPOTrainerSync,
        "colocate_async": v1.PPOTrainerColocateAsync,
        "separate_async": v1.PPOTrainerSeparateAsync,
    }
    for mode, base in bases.items():
        key = PREFIX + mode
        if key in TRAINER_REGISTRY:
            continue
        cls = type(
            f"Pivot{base.__name__}",
            (PivotAdvantageMixin, base),
            {"__module__": __name__, "__doc__": f"verl's {base.__name__} with pivotrl's advantage inputs."},
        )
        v1.register_trainer(key)(cls)
        _TRAINER_CLASSES[key] = cls
        globals()[cls.__name__] = cls


def _register_cpu_platform() -> None:
    """verl's ``cpu`` platform (:mod:`pivotrl.integrations.verl_cpu`), used without an accelerator.

    A failure here is logged and leaves the estimators, losses and trainers registered:
    verl would otherwise drop the whole plugin with a DEBUG message.
    """
    try:
        from pivotrl.integrations import verl_cpu

        verl_cpu.register()
    except Exception as exc:
        logger.warning(
            "pivotrl: verl's CPU platform was not registered (%s: %s)", type(exc).__name__, exc
        )


def _register_algorithms(core_algos: Any) -> None:
    """Register the estimators and losses in ``verl.trainer.ppo.core_algos`` (``core_algos``)."""
    for name in adaptable_estimators():
        key = PREFIX + name
        if key not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(key)(make_adv_estimator(name))
    for name in POLICY_LOSSES:
        key = PREFIX + name
        if key not in core_algos.POLICY_LOSS_REGISTRY:
            core_algos.register_policy_loss(key)(make_policy_loss(name))


def register() -> None:
    """Register verl's CPU platform now, pivotrl's estimators and losses in verl's registries when
    ``verl.trainer.ppo.core_algos`` is imported, and its trainers when ``verl.trainer.ppo.v1`` is
    (now, for either that is imported already). Idempotent.

    The registries are filled by import hooks (:mod:`pivotrl.integrations.import_hooks`), not by
    importing them here: verl loads this plugin in every one of its processes, and importing
    ``core_algos`` costs about 3 s, the v1 trainers about 5 s more, in processes that may need
    neither (the reward, rollout and storage workers). Code that looks a name up in a registry
    has imported the registry's module, so the names are there when it looks.
    """
    _register_cpu_platform()
    # main_ppo's driver: check every node of the cluster right after ray.init
    after_import("verl.trainer.constants_ppo", verl_cluster.wrap_runtime_env)
    after_import("verl.trainer.ppo.core_algos", _register_algorithms)
    if os.environ.get("PIVOTRL_VERL_TRAINERS", "1") != "0":
        # verl's v1 trainers need TransferQueue and friends, the registries above do not: where
        # verl.trainer.ppo.v1 does not import, its importer sees why
        after_import("verl.trainer.ppo.v1", _register_trainers)


register()
