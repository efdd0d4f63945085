"""Running the real `pivotrl` command line in a subprocess, and what its failures must look like."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pivotrl.train.recipes import recipe_path

SMOKE = recipe_path("smoke")


def pivotrl(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`pivotrl ARGS` in a fresh Python process; stdout and stderr captured as text."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "pivotrl.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def assert_user_error(proc: subprocess.CompletedProcess, *names: str, code: int = 2) -> str:
    """Exit code `code`, no traceback, and an `error:` line naming each of `names`; returns that line."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == code, output
    assert "Traceback" not in output, output
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def assert_usage_error(proc: subprocess.CompletedProcess, option: str) -> None:
    """Exit code 2 from the option parser, naming the option, without a traceback."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"'{option}'" in proc.stderr or option in proc.stderr.replace("│", " "), proc.stderr


def read_only_dir(tmp_path: Path) -> Path:
    """A folder nothing can be written into (chmod 555; for root, who ignores modes, a sysfs path)."""
    import pytest

    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        (folder / "probe").touch()
    except OSError:
        return folder
    (folder / "probe").unlink()
    sysfs = Path("/sys/kernel")
    if sysfs.is_dir():
        return sysfs / "pivotrl-not-writable"
    pytest.skip("running as root without /sys: no read-only location to test with")


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under root, by relative path, with its content."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
