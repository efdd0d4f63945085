"""Test configuration: make tests/ importable for the shared helpers; keep reused evaluations in a folder of
the test session's own (train/before_cache.py), never in the user's cache."""

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True, scope="session")
def session_evaluation_cache():
    with tempfile.TemporaryDirectory(prefix="pivotrl-evaluations-") as folder:
        old = os.environ.get("PIVOTRL_EVAL_CACHE")
        os.environ["PIVOTRL_EVAL_CACHE"] = folder
        yield Path(folder)
        if old is None:
            os.environ.pop("PIVOTRL_EVAL_CACHE", None)
        else:
            os.environ["PIVOTRL_EVAL_CACHE"] = old
