"""Atomic checkpoints: written to a temporary folder, then renamed into place.

checkpoints/step-000040/ holds the model and tokenizer (save_pretrained), and
trainer_state.pt: optimizer, scheduler, every RNG state, step and data position.
A folder named step-* is complete by construction (rename is atomic), so a run
killed at any instant leaves every finished checkpoint intact.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

PREFIX = "step-"
STATE_FILE = "trainer_state.pt"


def checkpoint_dir(root: Path, step: int) -> Path:
    """root/step-000042."""
    return root / f"{PREFIX}{step:06d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest_checkpoint(root: Path) -> Path | None:
    """The newest finished checkpoint under root, or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def rng_states() -> dict[str, Any]:
    """The global RNG states (python, torch CPU, and CUDA when present)."""
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Undo rng_states()."""
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(root: Path, step: int, *, model: Any, tokenizer: Any, state: dict[str, Any], keep: int) -> Path:
    """Write checkpoint `step` atomically and keep only the newest `keep`."""
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir(root, step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(state, tmp / STATE_FILE)
    _fsync_tree(tmp)
    if final.exists():  # the same step saved again (e.g. the final save after a periodic one)
        trash = root / f".trash-{final.name}-{os.getpid()}"
        os.rename(final, trash)
        shutil.rmtree(trash)
    os.rename(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(root)[:-keep]:
        trash = root / f".trash-{old.name}-{os.getpid()}"
        os.rename(old, trash)  # atomic: never a half-deleted step-* folder
        shutil.rmtree(trash, ignore_errors=True)
    for stale in root.glob(".t*-*"):  # leftovers of a run killed mid-write or mid-delete
        if stale.is_dir() and str(os.getpid()) not in stale.name:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def load_state(path: Path) -> dict[str, Any]:
    """The trainer_state.pt of a checkpoint folder."""
    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)


def _fsync_tree(folder: Path) -> None:
    for p in folder.iterdir():
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
