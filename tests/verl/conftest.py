"""tests/verl run only inside the verl venv (bash scripts/verl_env.sh; .venv-verl/bin/python -m pytest tests/verl).

In any other environment (the main venv has transformers 5.24, which verl 0.9.1 does
not support) the whole directory is skipped at collection.

Tests marked ``multinode`` (verl's main_ppo on a two-node Ray cluster, about 3 minutes on a
2-core CPU) are skipped unless the marker is selected: ``pytest tests/verl -m multinode``.
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


MULTINODE = "multinode"


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        f"{MULTINODE}: verl's main_ppo on a two-node Ray cluster (about 3 min on 2 cores); "
        f"skipped unless selected with -m {MULTINODE}",
    )


def pytest_collection_modifyitems(config, items):
    if MULTINODE in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(
        reason=f"two Ray nodes, about 3 min: run with -m {MULTINODE} (or bash scripts/verl_multinode.sh)"
    )
    for item in items:
        if MULTINODE in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_loss_kwargs_env(monkeypatch):
    """No test sees a PIVOTRL_POLICY_LOSS_KWARGS left in the caller's environment."""
    monkeypatch.delenv("PIVOTRL_POLICY_LOSS_KWARGS", raising=False)
