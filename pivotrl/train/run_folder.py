"""The run folder and other outputs: checked before any work starts, never overwritten by accident,
written by one process at a time (FolderLock), and a run's saved config is its identity
(check_resume, resume_config)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pivotrl.errors import ConfigError, FolderBusy
from pivotrl.train.config import (
    RunConfig,
    config_differences,
    describe_differences,
    load_config,
    parse_override,
)

#: What a run leaves in its folder; any of them means the folder holds a run.
RUN_FILES = ("metrics.jsonl", "summary.json", "checkpoints", "eval")
#: What a saved model (pretrain's output, a shipped policy, an export, a LoRA adapter) holds; any of them means
#: the folder holds one.
MODEL_FILES = ("config.json", "model.safetensors", "pretrain.json", "tokenizer.json", "adapter_config.json",
               "adapter_model.safetensors")
#: Where the shipped policies live (pivotrl/assets/<name>).
SHIPPED_MODELS = Path(__file__).resolve().parent.parent / "assets"
#: The lock file of a folder being written (see FolderLock).
LOCK_FILE = ".pivotrl.lock"
#: Settings that `--resume` may change: where the run is, how long it goes on, how often it evaluates
#: and saves, how it logs, how many CPU threads it uses, and whether it may reuse an evaluation drawn
#: before. Anything else would make the rest of the run another experiment than its start, so it is
#: refused. ('log' stands for every log.* key.)
SAFE_ON_RESUME = ("output_dir", "train.max_steps", "train.num_threads", "eval.every", "eval.reuse_before",
                  "checkpoint.every", "checkpoint.keep", "log")
#: Settings that do not change what a run computes or writes besides its logs; compare reuses a run
#: only when its saved config equals the one it would launch except in these.
NOT_IDENTITY = ("output_dir", "eval.reuse_before", "log")


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


def model_contents(folder: Path) -> list[str]:
    """The entries of MODEL_FILES present in `folder` (empty: no saved model there)."""
    if not folder.is_dir():
        return []
    return [name for name in MODEL_FILES if (folder / name).exists()]


def check_report_dir(folder: Path, what: str = "--output-dir") -> None:
    """ConfigError unless `folder` can take a command's own outputs (analyze, credit, report): a
    writable folder that holds neither a training run nor a saved model (their files stay theirs)."""
    check_output_dir(folder, what)
    found = run_contents(folder)
    if found:
        raise ConfigError(f"{what}={folder} holds a training run ({', '.join(found)}); "
                          "give a folder of its own for this command's outputs")
    found = model_contents(folder)
    if found:
        raise ConfigError(f"{what}={folder} holds a saved model ({', '.join(found)}); "
                          "give a folder of its own for this command's outputs")


# -- one writer per folder ------------------------------------------------------------------



class FolderLock:
    """An exclusive lock (flock) on FOLDER/.pivotrl.lock, which holds the holder's process id.

    The operating system releases it when the process ends, however it ends, so a crash leaves
    no stale lock: a lock file left behind blocks nothing. release() removes the file.
    """

    def __init__(self, folder: Path, fd: int | None) -> None:
        self.folder = folder
        self._fd = fd
        self._pid = os.getpid()  # a forked child closes its copy but never removes the holder's file

    @property
    def path(self) -> Path:
        return self.folder / LOCK_FILE

    def release(self) -> None:
        """Remove the lock file (while still holding it) and let go; a second call does nothing."""
        if self._fd is None:
            return
        try:
            if os.getpid() == self._pid and _same_file(self._fd, self.path):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def moved(self, folder: Path) -> None:
        """The locked folder was renamed to `folder` (the lock went with it)."""
        self.folder = folder

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - at interpreter exit; the OS releases the lock anyway
            pass


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _holder(path: Path) -> str:
    """The process id written in a lock file ('unknown' while its holder has not written it yet)."""
    for _ in range(20):
        try:
            text = path.read_text().strip()
        except OSError:
            text = ""
        if text.isdigit():
            return text
        time.sleep(0.05)
    return "unknown"


def lock_folder(folder: Path, what: str = "output_dir") -> FolderLock:
    """Lock an existing folder for this process; FolderBusy (one line: the folder and the holder's
    process id) when another process holds it. Without fcntl (Windows) the lock is a no-op."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return FolderLock(folder, None)
    path = folder / LOCK_FILE
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise ConfigError(f"{what}={folder}: cannot create its lock file {path.name}: "
                              f"{err.strerror or err}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise FolderBusy(f"{what}={folder} is in use by another pivotrl process (PID {_holder(path)}): "
                             "one process writes a folder at a time; wait for it to end, or pick another "
                             "folder") from None
        if _same_file(fd, path):  # not a file its previous holder removed between our open and flock
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return FolderLock(folder, fd)
        os.close(fd)
    raise FolderBusy(f"{what}={folder}: could not lock it (its lock file keeps being replaced)")


def claim_folder(folder: Path, what: str = "output_dir") -> FolderLock:
    """check_output_dir, then lock the folder: before anything is read from it or written to it."""
    check_output_dir(folder, what)
    return lock_folder(folder, what)


def move_aside_locked(folder: Path, lock: FolderLock, what: str = "output_dir") -> tuple[Path, FolderLock]:
    """move_aside a folder this process holds locked; returns where it went and the lock of the new,
    empty folder (the old folder's lock is released)."""
    aside = move_aside(folder)
    lock.moved(aside)
    lock.release()
    return aside, claim_folder(folder, what)


def claim_model_folder(folder: Path, *, overwrite: bool, what: str = "--output-dir",
                       say: Callable[[str], None] = print) -> FolderLock:
    """Lock the folder a model is saved to (pretrain's), refusing one that holds anything (a model, a run,
    other files) unless `overwrite`, which moves it aside; a shipped policy's folder is named as such."""
    lock = claim_folder(folder, what)
    try:
        found = sorted(p.name for p in folder.iterdir() if p.name != LOCK_FILE) if folder.is_dir() else []
        if found and not overwrite:
            shipped = folder.resolve().parent == SHIPPED_MODELS
            held = f"is a shipped policy's folder ({SHIPPED_MODELS.name}/{folder.resolve().name})" if shipped \
                else "already holds a model" if model_contents(folder) + run_contents(folder) else "is not empty"
            raise ConfigError(f"{what} {folder} {held}: {', '.join(found)}; save over it with --overwrite (what "
                              f"is there is moved aside, not deleted), or pick another {what}")
        if found:
            aside, lock = move_aside_locked(folder, lock, what)
            say(f"--overwrite: moved the previous contents of {folder} to {aside}")
    except BaseException:
        lock.release()
        raise
    return lock


# -- a run's config is its identity ---------------------------------------------------------


def saved_config(folder: Path) -> RunConfig | None:
    """The config a run folder was run with (its config.yaml), or None when it has none."""
    path = folder / "config.yaml"
    if not path.is_file():
        return None
    try:
        return load_config(path)
    except ConfigError as err:
        raise ConfigError(f"{path} (the run's saved config): {err}") from None


def _safe_keys() -> str:
    return ", ".join(f"{k}.*" if k == "log" else k for k in SAFE_ON_RESUME)


def check_resume(folder: Path, config: RunConfig) -> None:
    """ConfigError unless `config` may continue the run in `folder`: it equals the run's saved
    config except in SAFE_ON_RESUME, and train.max_steps is not below the step the run reached."""
    saved = saved_config(folder)
    if saved is None:
        found = run_contents(folder)
        if found:
            raise ConfigError(f"--resume: {folder} holds a run ({', '.join(found)}) but no config.yaml, so "
                              "nothing tells which config it ran with; start over with --overwrite (the old run "
                              "is moved aside) or pick another --output-dir")
        return
    diffs = config_differences(saved, config, ignore=SAFE_ON_RESUME)
    if diffs:
        raise ConfigError(
            f"--resume: the run in {folder} was made with another config: {describe_differences(diffs)}; "
            f"a resumed run may change only {_safe_keys()} (without --config, --resume continues with the run's "
            "own config.yaml); start over with --overwrite or pick another --output-dir")
    from pivotrl.train import checkpoint as ckpt

    found = ckpt.list_checkpoints(folder / "checkpoints")
    reached = max((int(p.name[len(ckpt.PREFIX):]) for p in found), default=0)
    if config.train.max_steps < reached:
        raise ConfigError(f"--resume: train.max_steps={config.train.max_steps} is below step {reached}, which "
                          f"the run in {folder} has reached; give train.max_steps >= {reached}")


def resume_config(folder: Path, overrides: list[str]) -> RunConfig | None:
    """The config to continue the run in `folder` with: its saved config.yaml with `overrides` (and
    output_dir=folder, wherever the folder has moved); None when the folder has no saved config."""
    path = folder / "config.yaml"
    if not path.is_file():
        return None
    saved_config(folder)  # names the file when it does not load as it is
    return load_config(path, [*overrides, f"output_dir={folder}"])


def output_dir_of(overrides: list[str], default: Path) -> Path:
    """The run folder that dotted overrides name (the last output_dir=...), else `default`'s."""
    folder = None
    for text in overrides:
        key, value = parse_override(text)
        if key == "output_dir":
            folder = value
    if folder is None:
        folder = load_config(default).output_dir
    return Path(str(folder))
