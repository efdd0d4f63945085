"""Checkpoints never run code when resumed, and a damaged one is skipped with a warning or refused by name."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import SMOKE, assert_user_error, pivotrl

from pivotrl.train import checkpoint as ckpt
from pivotrl.train.config import load_config
from pivotrl.train.trainer import Trainer


class WritesMarker:
    """Unpickling this runs `touch MARKER`: what a hostile checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A smoke run with checkpoints at steps 1, 2 and 3 (made once, copied by each test)."""
    out = tmp_path_factory.mktemp("run") / "run"
    cfg = load_config(SMOKE, [f"output_dir={out}", "train.max_steps=3", "checkpoint.every=1", "checkpoint.keep=3",
                              "eval.before_after=false"])
    Trainer(cfg).run()
    return out


def copy_run(finished_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    return run


def resume(run: Path, *extra: str):
    return pivotrl("train", "--config", str(SMOKE), "--output-dir", str(run), "--resume", "train.max_steps=4",
                   "checkpoint.every=1", "checkpoint.keep=3", "eval.before_after=false", *extra)


def test_state_round_trips_exactly_through_json_and_safetensors(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    random.random()
    state = {"step": 7, "elapsed": 1.25, "optimizer": optimizer.state_dict(), "rng": ckpt.rng_states(),
             "generator": torch.Generator().manual_seed(3).get_state(), "order": torch.randperm(9),
             "before": {"accuracy": 0.5, "pass@1": 0.5, "trace_validity_correct": None}, "position": 4}
    ckpt.save_state(tmp_path, state)
    loaded = ckpt.load_state(tmp_path)
    assert loaded["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert loaded["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.99)  # a tuple stays a tuple
    for key, values in state["optimizer"]["state"].items():
        for name, value in values.items():
            assert torch.equal(loaded["optimizer"]["state"][key][name], value)
    assert loaded["rng"]["python"] == random.getstate()
    assert torch.equal(loaded["rng"]["torch"], state["rng"]["torch"])
    assert torch.equal(loaded["order"], state["order"]) and torch.equal(loaded["generator"], state["generator"])
    assert {k: loaded[k] for k in ("step", "elapsed", "before", "position")} == \
        {k: state[k] for k in ("step", "elapsed", "before", "position")}
    assert not any(tmp_path.glob("*.pt"))


def test_a_legacy_pickled_state_of_plain_tensors_still_loads(tmp_path: Path) -> None:
    state = {"step": 2, "rng": {"python": random.getstate(), "torch": torch.get_rng_state()}, "order": torch.arange(5)}
    torch.save(state, tmp_path / ckpt.LEGACY_STATE)
    loaded = ckpt.load_state(tmp_path)
    assert loaded["step"] == 2 and torch.equal(loaded["order"], state["order"])


@pytest.mark.slow
def test_a_crafted_pickle_is_refused_and_never_runs(finished_run: Path, tmp_path: Path) -> None:
    run = copy_run(finished_run, tmp_path)
    marker = tmp_path / "pwned"
    newest, middle, oldest = sorted((run / "checkpoints").iterdir(), reverse=True)
    # newest: a legacy trainer_state.pt whose unpickling runs a shell command
    for name in (ckpt.STATE_JSON, ckpt.STATE_TENSORS):
        (newest / name).unlink()
    torch.save({"step": 3, "payload": WritesMarker(marker)}, newest / ckpt.LEGACY_STATE)
    # middle: the weights as a pickle (pytorch_model.bin) in place of model.safetensors
    (middle / ckpt.MODEL_FILE).unlink()
    torch.save({"payload": WritesMarker(marker)}, middle / "pytorch_model.bin")
    # oldest: a trainer_state.json pointing at a tensor that is not there
    data = json.loads((oldest / ckpt.STATE_JSON).read_text())
    data["order"] = {"__tensor__": "missing"}
    (oldest / ckpt.STATE_JSON).write_text(json.dumps(data))

    proc = resume(run)
    line = assert_user_error(proc, "no intact checkpoint", f"{newest.name}/{ckpt.LEGACY_STATE}",
                             f"{middle.name}/{ckpt.MODEL_FILE}", f"{oldest.name}/{ckpt.STATE_JSON}")
    assert "cannot be read safely" in line
    assert not marker.exists()
    assert not (run / "checkpoints" / "step-000004").exists()


@pytest.mark.slow
def test_resume_falls_back_from_a_truncated_checkpoint(finished_run: Path, tmp_path: Path) -> None:
    run = copy_run(finished_run, tmp_path)
    newest = run / "checkpoints" / "step-000003"
    weights = newest / ckpt.MODEL_FILE
    weights_size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(weights_size // 2)

    proc = resume(run)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Traceback" not in output
    message = " ".join(output.split())
    assert "warning: checkpoint step-000003 is not usable" in message and "model.safetensors: damaged" in message
    assert "set aside as step-000003.damaged" in message and "resumed from" in message
    assert (run / "checkpoints" / "step-000003.damaged" / ckpt.MODEL_FILE).stat().st_size == weights_size // 2
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # step 3 was redone from step 2's checkpoint
