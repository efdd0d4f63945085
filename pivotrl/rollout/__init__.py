"""Rollout engines behind one interface: hf (default) and vllm (optional, GPU)."""

from pivotrl.rollout.base import Rollout, RolloutEngine, concat_rollouts, select_rows
from pivotrl.rollout.engines import make_engine

__all__ = ["Rollout", "RolloutEngine", "concat_rollouts", "make_engine", "select_rows"]
