"""Pure tensor code: advantage estimators and policy losses (see ALGORITHMS.md).

    from pivotrl.algorithms import TokenBatch, compute_advantages, compute_policy_loss
"""

from pivotrl.algorithms import baselines, entropy, erpo, losses, oracles, pivot_mc  # noqa: F401  (register)
from pivotrl.algorithms.batch import TokenBatch
from pivotrl.algorithms.diagnostics import estimator_diagnostics
from pivotrl.algorithms.registry import (
    ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    aggregate_loss,
    compute_advantages,
    compute_policy_loss,
    default_loss_agg_mode,
    estimator_requirements,
    hyperparameters,
    loss_denominators,
    loss_requirements,
    register_estimator,
    register_policy_loss,
)

__all__ = [
    "ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "TokenBatch",
    "aggregate_loss",
    "compute_advantages",
    "compute_policy_loss",
    "default_loss_agg_mode",
    "estimator_diagnostics",
    "estimator_requirements",
    "hyperparameters",
    "loss_denominators",
    "loss_requirements",
    "register_estimator",
    "register_policy_loss",
]
