"""pivotrl's CPU platform for verl (pivotrl/integrations/verl_cpu.py), in fresh interpreters.

What it does in a real run is checked end to end by tests/verl/test_verl_e2e.py (verl's main_ppo
on this CPU); these check its choice and its reach before anything runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

PROBE = """
import importlib.metadata, json, os, socket, sys

def process_group(distributed):
    # what verl's FSDP workers call first (engine_workers.py), here as a world of one
    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    try:
        distributed.initialize_global_process_group_ray(timeout_second=60)
    except (ValueError, RuntimeError) as exc:
        return str(exc).splitlines()[0]
    backend = dist.get_backend()
    dist.destroy_process_group()
    return backend

import verl
from verl.plugin.platform import get_platform
from pivotrl.integrations import verl_cpu
loaded = {m: m in sys.modules for m in ("verl.trainer.ppo.core_algos", "verl.trainer.ppo.v1")}
try:
    vllm_version = importlib.metadata.version("vllm")
except importlib.metadata.PackageNotFoundError:
    vllm_version = None
from verl.utils import distributed
from verl.workers.engine.base import EngineRegistry
try:
    engine = EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__
except (AssertionError, ValueError) as exc:
    engine = None
print(json.dumps({
    "device": get_platform().device_name,
    "active": verl_cpu.is_active(),
    "loaded": loaded,
    "vllm_version": vllm_version,
    "engine": engine,
    "process_group": process_group(distributed),
}))
"""


def probe(**env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="a CUDA device is present: verl's platform is nvidia"
)
def test_verl_runs_on_the_cpu_platform_where_there_is_no_accelerator():
    found = probe()
    assert found["device"] == "cpu" and found["active"]
    # verl's vLLM rollout sees the CPU build as vllm, with the suffix vLLM's own detection reads
    assert found["vllm_version"] and found["vllm_version"].endswith("+cpu")
    assert found["engine"] == "FSDPEngineWithLMHead"  # registered for the cpu device
    # gloo alone: verl's default backend string here, cpu:gloo,cpu:gloo, is refused by torch
    assert found["process_group"] == "cpu:gloo"
    # the plugin itself imports neither registry module: the registries fill when verl imports them
    assert found["loaded"] == {"verl.trainer.ppo.core_algos": False, "verl.trainer.ppo.v1": False}


def test_another_platform_named_by_verl_platform_gets_no_cpu_changes():
    found = probe(VERL_PLATFORM="nvidia")
    assert found["device"] == "cuda" and not found["active"]
    assert found["process_group"] != "cpu:gloo"  # verl's own default backend string, unpatched
    assert found["vllm_version"] is None or not found["vllm_version"].endswith("+cpu")
