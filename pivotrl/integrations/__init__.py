"""Adapters that run pivotrl's estimators and losses inside other RL engines.

- ``pivotrl.integrations.trl``: ``PivotGRPOTrainer`` / ``PivotGRPOConfig``, subclasses of
  TRL's ``GRPOTrainer`` / ``GRPOConfig`` (extra ``trl``).
- ``pivotrl.integrations.verl``: a verl 0.9.1 plugin (entry point group ``verl.plugins``)
  that registers ``pivotrl_<name>`` advantage estimators and policy losses in verl's own
  registries, and ``pivotrl_<mode>`` v1 trainers that hand the estimators the rollout
  entropies and log-probs (extra ``verl``); with it, ``pivotrl.integrations.verl_cpu``, the CPU
  platform verl lacks, so that verl's own trainer runs where there is no accelerator
  (``pivotrl.integrations.import_hooks`` applies its changes when verl imports the modules), and
  ``pivotrl.integrations.verl_cluster``, which checks at start-up that every node of the Ray
  cluster loads the plugin.

Neither submodule is imported here: each needs its engine installed.
See docs/INTEGRATIONS.md.
"""

from pivotrl.algorithms import estimator_requirements
from pivotrl.algorithms.oracles import ORACLES

#: The optional TokenBatch fields an adapter can fill from its engine's batch.
ADAPTER_FIELDS = frozenset({"ref_logprobs", "entropies"})


def check_adaptable(engine: str, estimator: str, **hparams: object) -> None:
    """ValueError when `estimator` reads a field the engine's rollouts cannot give: pivot_mc's branch values,
    or the task marks the oracles read (they are controls, not methods)."""
    missing = sorted(estimator_requirements(estimator, **hparams) - ADAPTER_FIELDS)
    if estimator in ORACLES:
        raise ValueError(f"{estimator!r} is an oracle, a control that reads what only pivotrl's synthetic tasks "
                         f"know ({', '.join(missing)}), not a method: {engine} does not run it; it runs in "
                         "pivotrl's own trainer (docs/ALGORITHMS.md, 'Oracles')")
    if missing:
        raise ValueError(f"estimator {estimator!r} reads {', '.join(missing)}, which {engine}'s rollouts do not "
                         "make (they come from pivotrl's branching rollouts): it runs in pivotrl's own trainer, "
                         "see docs/INTEGRATIONS.md")


__all__ = ["ADAPTER_FIELDS", "check_adaptable"]
