"""The run folder and other outputs: checked before any work starts, never overwritten by accident."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pivotrl.train.config import ConfigError

#: What a run leaves in its folder; any of them means the folder holds a run.
RUN_FILES = ("metrics.jsonl", "summary.json", "checkpoints", "eval")


def run_contents(folder: Path) -> list[str]:
    """The entries of RUN_FILES present in `folder` (empty: not a run folder, or no folder)."""
    if not folder.is_dir():
        return []
    return [name for name in RUN_FILES if (folder / name).exists()]


def _file_in_the_way(path: Path) -> Path | None:
    """The first of path and its parents that exists and is not a folder, or None."""
    for p in (path, *path.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def check_output_dir(folder: Path, what: str = "output_dir") -> None:
    """ConfigError unless `folder` is (or can be made) a folder this process can write in.

    Creates the folder; proves it is writable by creating and removing a probe file.
    """
    blocker = _file_in_the_way(folder)
    if blocker == folder:
        raise ConfigError(f"{what}={folder} is a file, not a folder; give a folder path")
    if blocker is not None:
        raise ConfigError(f"{what}={folder} cannot be made: {blocker} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".pivotrl-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"{what}={folder} is not writable: {err.strerror or err}") from None


def check_output_file(path: Path, what: str) -> None:
    """ValueError unless `path` can be written (its folder is made; an existing file is left as it is)."""
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder; give a file path")
    blocker = _file_in_the_way(path.parent)
    if blocker is not None:
        raise ValueError(f"{what} {path} cannot be written: {blocker} is a file, not a folder")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a"):
            pass
    except OSError as err:
        raise ValueError(f"{what} {path} is not writable: {err.strerror or err}") from None
    if not existed:
        path.unlink()


def refuse_used_folder(folder: Path) -> None:
    """ConfigError when `folder` already holds a run (the caller asked neither to resume nor to overwrite)."""
    found = run_contents(folder)
    if found:
        raise ConfigError(
            f"output_dir={folder} already holds a run ({', '.join(found)}); continue it with --resume, "
            "start over with --overwrite (the old run is moved aside, not deleted), or pick another --output-dir"
        )


def move_aside(folder: Path) -> Path:
    """Rename a used run folder to a timestamped sibling (folder.old-YYYYmmdd-HHMMSS[-N]); returns the new path."""
    here = Path.cwd().resolve()
    target = folder.resolve()
    if target == here or target in here.parents:
        raise ConfigError(f"output_dir={folder} is the current directory (or holds it): cannot move it aside; "
                          "use a subfolder as output_dir")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = target.with_name(f"{target.name}.old-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = target.with_name(f"{target.name}.old-{stamp}-{n}")
    os.rename(target, aside)
    return aside
