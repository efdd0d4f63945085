"""Adapters that run pivotrl's estimators and losses inside other RL engines.

- ``pivotrl.integrations.trl``: ``PivotGRPOTrainer`` / ``PivotGRPOConfig``, subclasses of
  TRL's ``GRPOTrainer`` / ``GRPOConfig`` (extra ``trl``).
- ``pivotrl.integrations.verl``: a verl 0.9.1 plugin (entry point group ``verl.plugins``)
  that registers ``pivotrl_<name>`` advantage estimators and policy losses in verl's own
  registries, and ``pivotrl_<mode>`` v1 trainers that hand the estimators the rollout
  entropies and log-probs (extra ``verl``).

Neither submodule is imported here: each needs its engine installed.
See docs/INTEGRATIONS.md.
"""

__all__: list[str] = []
