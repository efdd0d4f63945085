"""Hyperparameter checks shared by estimators and losses."""

from __future__ import annotations


def check(condition: bool, message: str) -> None:
    """Raise ValueError(message) unless condition holds."""
    if not condition:
        raise ValueError(message)
