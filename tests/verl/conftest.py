"""tests/verl run only inside the verl venv (bash scripts/verl_env.sh; .venv-verl/bin/python -m pytest tests/verl).

In any other environment (the main venv has transformers 5.24, which verl 0.9.1 does
not support) the whole directory is skipped at collection.
"""

import importlib.util
import warnings

import pytest


def _verl_installed() -> bool:
    """The real verl package (tests/ is on sys.path, so this folder is a namespace package 'verl')."""
    spec = importlib.util.find_spec("verl")
    return spec is not None and spec.origin is not None


if not _verl_installed():
    collect_ignore_glob = ["test_*.py"]
else:
    warnings.filterwarnings("ignore", category=UserWarning, module=r"verl\..*")


@pytest.fixture(autouse=True)
def _no_loss_kwargs_env(monkeypatch):
    """No test sees a PIVOTRL_POLICY_LOSS_KWARGS left in the caller's environment."""
    monkeypatch.delenv("PIVOTRL_POLICY_LOSS_KWARGS", raising=False)
