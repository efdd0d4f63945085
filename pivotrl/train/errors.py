"""Why a training run stopped on purpose."""

from __future__ import annotations


class TrainingAborted(RuntimeError):
    """The run stopped on purpose (e.g. repeated NaN losses); the last checkpoint is intact."""
