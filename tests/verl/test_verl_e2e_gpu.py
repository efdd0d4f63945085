"""verl's main_ppo, 2 steps with pivotrl_ep_grpo and vLLM on a GPU (scripts/verl_e2e_gpu.sh).

Skips, with the script's reason, where CUDA or vllm is absent (as on the CPU test machines).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "verl_e2e_gpu.sh"
EXPECTED = "verl e2e: 2 steps, estimator pivotrl_ep_grpo, entropies seen: yes, ref policy: yes"


@pytest.mark.gpu
def test_verl_main_ppo_two_steps_with_vllm():
    out = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "PYTHON": sys.executable},
    )
    lines = out.stdout.strip().splitlines()
    assert lines, f"the script printed nothing; stderr:\n{out.stderr[-3000:]}"
    if lines[-1].startswith("verl e2e: skipped"):
        pytest.skip(lines[-1])
    assert out.returncode == 0, "\n".join(lines[-60:])
    assert lines[-1] == EXPECTED
