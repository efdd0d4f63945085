"""The vllm engine's CPU-side contract: one pinned vLLM range, and a one-line error where it cannot run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from pivotrl.rollout.vllm import VLLM_VERSIONS
from pivotrl.train.recipes import recipe_path

ROOT = Path(__file__).resolve().parent.parent


def test_the_extra_pins_the_vllm_range_the_engine_follows() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["vllm"] == [f"vllm{VLLM_VERSIONS}"]
    assert f"vllm{VLLM_VERSIONS}" in (ROOT / "README.md").read_text().replace(" ", "").replace("`", "")


@pytest.mark.skipif(torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None,
                    reason="vLLM can run here: tests/test_gpu.py covers it")
def test_without_vllm_or_a_gpu_the_cli_says_so_and_exits_2(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pivotrl.cli", "train", "--config", str(recipe_path("smoke")), "--output-dir",
           str(tmp_path), "rollout.engine=vllm"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "rollout.engine=vllm needs" in done.stderr and "Traceback" not in done.stderr
