"""pivotrl inside TRL on a real model: examples/trl_pivot_grpo.py runs PivotGRPOTrainer with ERPO
on smollm2-135m (SmolLM2-135M-Instruct) and the task add_sub for one step at tiny sizes, with chat
prompts, the task's verifier as the reward and a reference model without a KL term (about 30 s
on 2 CPU cores; the first use of smollm2-135m also converts its GGUF file, about 25 s more)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from real_models import needs_smollm2  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "trl_pivot_grpo.py"


@pytest.mark.slow
@needs_smollm2
def test_example_runs_erpo_on_smollm2():
    cmd = [sys.executable, str(EXAMPLE), "--model", "smollm2-135m", "--task", "add_sub",
           "--estimator", "erpo", "--steps", "1", "--prompts", "2", "--group-size", "2",
           "--max-new-tokens", "8", "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    header = next((line for line in proc.stdout.splitlines() if line.startswith("smollm2-135m")), "")
    assert "chat prompts" in header and "reference model: yes" in header, proc.stdout[-3000:]
    step = re.search(r"^step 1: reward mean (\S+), advantage std within responses (\S+) "
                     r"\(all tokens (\S+), (\d+) tokens of 4 responses\)", proc.stdout, re.MULTILINE)
    assert step is not None, proc.stdout[-3000:]
    reward, spread, token_std = (float(step.group(i)) for i in (1, 2, 3))
    assert 0.0 <= reward <= 1.0
    assert math.isfinite(token_std) and (math.isnan(spread) or spread >= 0.0)
    assert 4 <= int(step.group(4)) <= 4 * 8
    assert "step 2:" not in proc.stdout
