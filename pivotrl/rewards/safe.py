"""Calling a verifier on untrusted text: an exception scores 0 and is logged, never raised."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("pivotrl.rewards")


def safe_score(verifier: Callable[[str, Any], float], completion: str, answer: Any) -> float:
    """verifier(completion, answer) as a float; 0.0 (with the error logged) if it raises or is not finite."""
    try:
        value = float(verifier(completion, answer))
    except Exception as err:  # a broken reward function must not end a run
        logger.warning("reward function %s raised %s: %s; scored 0.0",
                       getattr(verifier, "__name__", verifier), type(err).__name__, err)
        return 0.0
    if value != value or value in (float("inf"), float("-inf")):
        logger.warning("reward function %s returned %s; scored 0.0", getattr(verifier, "__name__", verifier), value)
        return 0.0
    return value
